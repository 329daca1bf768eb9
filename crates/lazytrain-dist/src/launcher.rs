//! Launchers: how the replicas of a group come to exist, and what each gets
//! (its rank, its backend, its collective). [`ThreadLauncher`] runs them as
//! threads of this process over the in-process collective; a launcher for
//! processes and hosts (MPI) yields this process's replicas over its own
//! collective, and [`crate::spawn_with`] runs them the same way.

use crate::in_process::InProcessCollective;
use crate::SpawnConfig;
use lazytrain_core::backend::{self, Backend};
use lazytrain_core::collective::Collective;
use std::sync::Arc;

/// What one replica run by this process gets from its launcher.
#[derive(Clone)]
pub struct ReplicaSetup {
    /// The replica's rank in the whole group (0 is the master).
    pub rank: usize,
    /// The backend its device runs on.
    pub backend: Arc<dyn Backend>,
    /// The group's collective, as this replica reaches it.
    pub collective: Arc<dyn Collective>,
}

impl std::fmt::Debug for ReplicaSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replica {} of {} on {}", self.rank, self.collective.world_size(), self.backend.name())
    }
}

/// Starts the replicas of a group: yields the ones this process runs.
pub trait Launcher: Sync {
    /// The replicas this process runs (each becomes a thread with its own
    /// device), in rank order. Fails when the group cannot be formed.
    fn replicas(&self, config: &SpawnConfig) -> Result<Vec<ReplicaSetup>, String>;
}

/// `config.replicas` threads of this process, reducing in shared memory
/// ([`InProcessCollective`]). Each replica gets a backend of its own of the
/// kind `LAZYTRAIN_BACKEND` names (the CPU by default) with
/// [`SpawnConfig::threads`] kernel threads, unless one backend is given for
/// all of them.
#[derive(Clone, Default)]
pub struct ThreadLauncher {
    /// One backend every replica shares (default: one per replica, from
    /// [`backend::from_env`]). It must not have a kernel thread pool of its
    /// own (`CpuBackend::with_threads`): replicas block in collectives on
    /// their kernel threads, and a shared pool can run out of them.
    pub backend: Option<Arc<dyn Backend>>,
}

impl Launcher for ThreadLauncher {
    fn replicas(&self, config: &SpawnConfig) -> Result<Vec<ReplicaSetup>, String> {
        if config.replicas == 0 {
            return Err("the number of replicas must be at least 1".into());
        }
        let collective: Arc<dyn Collective> = Arc::new(InProcessCollective::new(config.replicas));
        (0..config.replicas)
            .map(|rank| {
                let backend = match &self.backend {
                    Some(backend) => backend.clone(),
                    None => backend::from_env(Some(config.threads())).map_err(|e| e.to_string())?,
                };
                Ok(ReplicaSetup { rank, backend, collective: collective.clone() })
            })
            .collect()
    }
}

/// This process's rank and the job's size when an MPI launcher (`mpirun`,
/// `mpiexec`, `srun` with PMI) started it with more than one process:
/// OpenMPI's `OMPI_COMM_WORLD_RANK`/`_SIZE`, else PMI's `PMI_RANK`/`PMI_SIZE`
/// (PMIx's `PMIX_RANK` with `PMI_SIZE` or, under `srun --mpi=pmix`, `SLURM_NTASKS`).
pub fn mpi_job_position() -> Option<(usize, usize)> {
    let read = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let pairs = [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("PMIX_RANK", "PMI_SIZE"),
        ("PMIX_RANK", "SLURM_NTASKS"),
    ];
    pairs
        .iter()
        .find_map(|(rank, size)| Some((read(rank)?, read(size)?)))
        .filter(|&(rank, size)| size > 1 && rank < size)
}

/// The processes of this job on this host (`OMPI_COMM_WORLD_LOCAL_SIZE`,
/// `MPI_LOCALNRANKS`; 1 outside MPI): they share its cores.
pub fn processes_on_this_host() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|name| std::env::var(name).ok().and_then(|v| v.trim().parse::<usize>().ok()))
        .unwrap_or(1)
        .max(1)
}

/// True unless this is a process other than rank 0 of an MPI job (the
/// process that prints reports and holds the master replica).
pub fn is_master_process() -> bool {
    mpi_job_position().is_none_or(|(rank, _)| rank == 0)
}

/// Finalise what the launcher set up for this process (MPI's
/// `MPI_Finalize` with the `mpi` feature); call it before the process
/// exits. A no-op otherwise.
pub fn finish_process() {
    #[cfg(feature = "mpi")]
    crate::mpi::finalize();
}

/// The launcher for this process: MPI's when an MPI launcher started it
/// with several processes (built with the `mpi` feature), threads otherwise.
/// Started by `mpirun -n N` (N > 1) without the feature, it is an error:
/// each process would train alone on the whole data.
pub fn default_launcher() -> Result<Box<dyn Launcher>, String> {
    match mpi_job_position() {
        None => Ok(Box::new(ThreadLauncher::default())),
        Some(_) if cfg!(feature = "mpi") => mpi_launcher(),
        Some((rank, size)) => Err(format!(
            "this is rank {rank} of an MPI job of {size} processes, but lazytrain was built without MPI; \
             build it with `cargo build --release --features mpi` (needs openmpi-bin libopenmpi-dev libclang-dev pkgconf)"
        )),
    }
}

#[cfg(feature = "mpi")]
fn mpi_launcher() -> Result<Box<dyn Launcher>, String> {
    Ok(Box::new(crate::mpi::MpiLauncher))
}

#[cfg(not(feature = "mpi"))]
fn mpi_launcher() -> Result<Box<dyn Launcher>, String> {
    unreachable!("only called with the mpi feature")
}
