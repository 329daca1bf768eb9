//! Processes and hosts over MPI (cargo feature `mpi`; OpenMPI through
//! rsmpi). Under `mpirun -n N`, [`MpiLauncher`] makes this process's
//! replicas ranks `p * local .. (p + 1) * local` of `N * local`, reducing
//! through a [`HierarchicalCollective`] whose process group is MPI's world.
//!
//! MPI is initialised once per process with `MPI_THREAD_SERIALIZED`: one
//! thread of a process calls MPI at a time (the local leader), but not
//! always the same thread (a device's kernel thread reduces gradients, the
//! replica's own thread meets at barriers), which `MPI_THREAD_FUNNELED`
//! would not allow. Call [`finalize`] before the process exits.

use crate::launcher::{Launcher, ReplicaSetup};
use crate::process_group::{HierarchicalCollective, ProcessGroup};
use crate::SpawnConfig;
use lazytrain_core::backend;
use lazytrain_core::collective::Collective;
use lazytrain_core::HostData;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use std::sync::{Arc, Mutex, OnceLock};

/// The MPI environment, alive until [`finalize`].
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
/// The world group, once MPI is initialised.
static WORLD: OnceLock<Arc<MpiProcessGroup>> = OnceLock::new();

/// MPI's world communicator as a [`ProcessGroup`]. rsmpi has no
/// `MPI_IN_PLACE`: each reduction goes through one scratch buffer per dtype,
/// kept at the largest size seen.
pub struct MpiProcessGroup {
    rank: usize,
    size: usize,
    scratch_f32: Mutex<Vec<f32>>,
    scratch_f64: Mutex<Vec<f64>>,
}

/// The world communicator (a handle, no state of its own).
fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

/// Reduce `data` through `scratch` (resized once to the largest size).
fn sum_through<T>(data: &mut [T], scratch: &Mutex<Vec<T>>)
where
    T: Copy + Default + mpi::datatype::Equivalence,
{
    let mut scratch = scratch.lock().unwrap_or_else(|p| p.into_inner());
    if scratch.len() < data.len() {
        scratch.resize(data.len(), T::default());
    }
    let out = &mut scratch[..data.len()];
    world().all_reduce_into(&data[..], out, SystemOperation::sum());
    data.copy_from_slice(out);
}

impl ProcessGroup for MpiProcessGroup {
    fn size(&self) -> usize {
        self.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce_sum(&self, data: &mut HostData) -> Result<(), String> {
        match data {
            HostData::F32(v) => sum_through(v, &self.scratch_f32),
            HostData::F64(v) => sum_through(v, &self.scratch_f64),
            other => return Err(format!("the MPI all_reduce supports f32 and f64 values, not {}", other.dtype())),
        }
        Ok(())
    }

    fn broadcast(&self, data: &mut HostData) -> Result<(), String> {
        let world = world();
        let root = world.process_at_rank(0);
        match data {
            HostData::F32(v) => root.broadcast_into(&mut v[..]),
            HostData::F64(v) => root.broadcast_into(&mut v[..]),
            HostData::I64(v) => root.broadcast_into(&mut v[..]),
            HostData::I32(v) => root.broadcast_into(&mut v[..]),
            HostData::U8(v) => root.broadcast_into(&mut v[..]),
            HostData::BF16(v) => {
                let mut bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
                root.broadcast_into(&mut bits[..]);
                v.iter_mut().zip(bits).for_each(|(x, b)| *x = half::bf16::from_bits(b));
            }
            HostData::F16(v) => {
                let mut bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
                root.broadcast_into(&mut bits[..]);
                v.iter_mut().zip(bits).for_each(|(x, b)| *x = half::f16::from_bits(b));
            }
            HostData::Bool(v) => {
                let mut bytes: Vec<u8> = v.iter().map(|&x| u8::from(x)).collect();
                root.broadcast_into(&mut bytes[..]);
                v.iter_mut().zip(bytes).for_each(|(x, b)| *x = b != 0);
            }
        }
        Ok(())
    }

    fn all_gather(&self, value: u64) -> Result<Vec<u64>, String> {
        let mut all = vec![0u64; self.size];
        world().all_gather_into(&value, &mut all[..]);
        Ok(all)
    }

    fn barrier(&self) -> Result<(), String> {
        world().barrier();
        Ok(())
    }

    fn abort(&self, message: &str) {
        eprintln!("lazytrain: aborting the MPI job (rank {} of {}): {message}", self.rank, self.size);
        world().abort(1)
    }
}

/// Initialise MPI for this process (once; later calls return the same
/// group). Fails when MPI was initialised elsewhere or cannot give
/// `MPI_THREAD_SERIALIZED`.
pub fn initialize() -> Result<Arc<MpiProcessGroup>, String> {
    if let Some(group) = WORLD.get() {
        return Ok(group.clone());
    }
    let mut universe = UNIVERSE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(group) = WORLD.get() {
        return Ok(group.clone());
    }
    let Some((initialized, provided)) = mpi::initialize_with_threading(Threading::Serialized) else {
        return Err("MPI was initialised (or finalised) already, not by lazytrain".into());
    };
    if provided < Threading::Serialized {
        return Err(format!(
            "the MPI library provides only {provided:?} threading; lazytrain needs MPI_THREAD_SERIALIZED \
             (one thread at a time, not always the same one)"
        ));
    }
    let world = initialized.world();
    let group = Arc::new(MpiProcessGroup {
        rank: world.rank() as usize,
        size: world.size() as usize,
        scratch_f32: Mutex::default(),
        scratch_f64: Mutex::default(),
    });
    *universe = Some(initialized);
    Ok(WORLD.get_or_init(|| group).clone())
}

/// Finalise MPI (`MPI_Finalize`) if this process initialised it; call it
/// once every replica has returned, before the process exits. A no-op
/// without MPI.
pub fn finalize() {
    UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// This process's replicas of an MPI job: `config.replicas` threads, global
/// ranks rank-major across processes then threads, each with a backend of
/// its own (`LAZYTRAIN_BACKEND`, [`SpawnConfig::threads`] kernel threads).
#[derive(Clone, Copy, Debug, Default)]
pub struct MpiLauncher;

impl Launcher for MpiLauncher {
    fn replicas(&self, config: &SpawnConfig) -> Result<Vec<ReplicaSetup>, String> {
        if config.replicas == 0 {
            return Err("the number of replicas must be at least 1".into());
        }
        let group = initialize()?;
        let sizes = group.all_gather(config.replicas as u64)?;
        if let Some(other) = sizes.iter().position(|&n| n != config.replicas as u64) {
            return Err(format!(
                "process {} runs {} replicas but process {other} runs {}; every process of an MPI job must run \
                 the same --num-replicas",
                group.rank(),
                config.replicas,
                sizes[other]
            ));
        }
        let collective = Arc::new(HierarchicalCollective::new(config.replicas, group, config.collective_timeout));
        let shared: Arc<dyn Collective> = collective.clone();
        (0..config.replicas)
            .map(|local| {
                let backend = backend::from_env(Some(config.threads())).map_err(|e| e.to_string())?;
                Ok(ReplicaSetup { rank: collective.global_rank(local), backend, collective: shared.clone() })
            })
            .collect()
    }
}
