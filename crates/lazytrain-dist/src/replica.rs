//! `spawn`: the replicas a launcher yields, as threads with one device
//! each and one compile cache per process.

use crate::error::SpawnError;
#[cfg(doc)]
use crate::launcher::ThreadLauncher;
use crate::launcher::{default_launcher, Launcher};
use lazytrain_core::cache::CompileCache;
use lazytrain_core::collective::{Collective, ReplicaLink};
use lazytrain_core::{panic_message, Device, DeviceOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

/// How [`spawn`] sets the replicas up.
#[derive(Clone, Debug)]
pub struct SpawnConfig {
    /// Replicas (threads) in this process, at least 1.
    pub replicas: usize,
    /// Kernel threads per replica; by default the cores divided among the
    /// replicas (at least one each).
    pub threads_per_replica: Option<usize>,
    /// Asynchronous devices: `sync` enqueues the step and returns.
    pub asynchronous: bool,
    /// How long a collective across processes may wait for the other
    /// processes before the job is aborted (a stuck or vanished rank).
    pub collective_timeout: Duration,
}

/// The most replicas (threads) the command line lets one process run: far
/// beyond any machine's cores, small enough that the group's bookkeeping is
/// always allocated.
pub const MAX_REPLICAS: usize = 1024;

/// The default [`SpawnConfig::collective_timeout`].
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(300);

impl SpawnConfig {
    /// `replicas` synchronous replicas sharing the cores.
    pub fn new(replicas: usize) -> SpawnConfig {
        SpawnConfig {
            replicas,
            threads_per_replica: None,
            asynchronous: false,
            collective_timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// The same, with another collective timeout.
    pub fn with_collective_timeout(mut self, timeout: Duration) -> SpawnConfig {
        self.collective_timeout = timeout;
        self
    }

    /// The same, with asynchronous devices.
    pub fn asynchronous(mut self, asynchronous: bool) -> SpawnConfig {
        self.asynchronous = asynchronous;
        self
    }

    /// Kernel threads each replica's device gets: the cores divided among
    /// this host's replicas (every process of an MPI job on this host runs
    /// `replicas` of them).
    pub fn threads(&self) -> usize {
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        // A process bound to fewer cores than the machine has (mpirun binds
        // ranks) has them to itself; an unbound one shares the machine's.
        let bound = online_cores().is_some_and(|all| usable < all);
        let processes = if bound { 1 } else { crate::launcher::processes_on_this_host() };
        self.threads_per_replica.unwrap_or(usable / self.replicas.max(1).saturating_mul(processes).max(1)).max(1)
    }
}

/// The machine's online cores (`/sys/devices/system/cpu/online`, e.g.
/// `0-3,8-11`), when Linux says.
fn online_cores() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    text.trim().split(',').try_fold(0usize, |count, range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last) = (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?);
        Some(count + last.checked_sub(first)? + 1)
    })
}

/// One replica of a data-parallel group, as its function sees it.
pub struct Replica {
    device: Device,
    rank: usize,
    group: Arc<dyn Collective>,
}

impl Replica {
    /// This replica's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// This replica's rank (`xm.get_ordinal()`).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of replicas (`xm.xrt_world_size()`).
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// The group's collective.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.group
    }

    /// True for rank 0, the replica that logs and writes checkpoints.
    pub fn is_master(&self) -> bool {
        self.rank == 0
    }

    /// Wait until every replica reaches this point (`xm.rendezvous`), with
    /// every step this replica enqueued finished first (an asynchronous
    /// device may still be running one). Fails when a step failed or
    /// another replica has stopped the group.
    pub fn rendezvous(&self) -> std::result::Result<(), String> {
        self.device.rendezvous().map_err(|e| match e {
            lazytrain_core::Error::Execution { detail, .. } => detail,
            other => other.to_string(),
        })
    }
}

/// Run `f` on `config.replicas` replicas, each a thread with its own device,
/// and return their results in rank order (`xmp.spawn`): [`spawn_with`] the
/// [`default_launcher`] — the [`ThreadLauncher`], or under `mpirun -n N`
/// (feature `mpi`) `config.replicas` threads in each of the N processes.
pub fn spawn<T, E, F>(config: &SpawnConfig, f: F) -> std::result::Result<Vec<T>, SpawnError<E>>
where
    F: Fn(&Replica) -> std::result::Result<T, E> + Sync,
    T: Send,
    E: Send + std::fmt::Display + From<lazytrain_core::Error>,
{
    let launcher = default_launcher().map_err(SpawnError::Setup)?;
    spawn_with(&*launcher, config, f)
}

/// Run `f` on the replicas `launcher` yields for this process, each a
/// thread with its own device, and return their results in rank order.
///
/// All devices share one compile cache, so a step every replica traces
/// compiles once. When a replica returns an error or panics, the group is
/// aborted: replicas waiting in an `all_reduce` return at once, and `spawn`
/// returns the first failing replica's error (not the "aborted" errors it
/// caused in the others). Once a replica's function returns, its device is
/// drained (every enqueued step finishes) before the replica counts as done.
pub fn spawn_with<T, E, F>(
    launcher: &dyn Launcher,
    config: &SpawnConfig,
    f: F,
) -> std::result::Result<Vec<T>, SpawnError<E>>
where
    F: Fn(&Replica) -> std::result::Result<T, E> + Sync,
    T: Send,
    E: Send + std::fmt::Display + From<lazytrain_core::Error>,
{
    if config.replicas == 0 {
        return Err(SpawnError::Setup("the number of replicas must be at least 1".into()));
    }
    let setups = launcher.replicas(config).map_err(SpawnError::Setup)?;
    let Some(group) = setups.first().map(|s| s.collective.clone()) else {
        return Err(SpawnError::Setup("the launcher yielded no replica for this process".into()));
    };
    let cache = Arc::new(CompileCache::new());
    let mut replicas = Vec::with_capacity(setups.len());
    for setup in setups {
        let options = DeviceOptions {
            ordinal: setup.rank,
            replica: Some(ReplicaLink { rank: setup.rank, collective: setup.collective.clone() }),
            asynchronous: config.asynchronous,
        };
        let device =
            Device::new(setup.backend, cache.clone(), options).map_err(|e| SpawnError::Setup(e.to_string()))?;
        replicas.push(Replica { device, rank: setup.rank, group: setup.collective });
    }
    let ranks: Vec<usize> = replicas.iter().map(|r| r.rank).collect();
    let outcomes: Vec<Outcome<T, E>> = std::thread::scope(|scope| {
        let handles: Vec<_> = replicas
            .into_iter()
            .map(|replica| {
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("lazytrain-replica-{}", replica.rank))
                    .spawn_scoped(scope, move || run_replica(replica, f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(handle) => handle.join().unwrap_or_else(|_| Outcome::Panicked("the replica thread died".into())),
                Err(e) => Outcome::Panicked(format!("could not start the replica thread: {e}")),
            })
            .collect()
    });
    let first_failure = group.abort_reason().map(|(rank, _)| rank);
    let mut results = Vec::with_capacity(ranks.len());
    let mut failure = None;
    for (rank, outcome) in ranks.into_iter().zip(outcomes) {
        let error = match outcome {
            Outcome::Done(value) => {
                results.push(value);
                continue;
            }
            Outcome::Failed(error) => SpawnError::Replica { rank, error },
            Outcome::Panicked(message) => SpawnError::Panicked { rank, message },
        };
        // Keep the error of the replica that stopped the group.
        if failure.is_none() || first_failure == Some(rank) {
            failure = Some(error);
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(results),
    }
}

enum Outcome<T, E> {
    Done(T),
    Failed(E),
    Panicked(String),
}

/// Run one replica's function, drain its device and report to the group.
fn run_replica<T, E, F>(replica: Replica, f: &F) -> Outcome<T, E>
where
    F: Fn(&Replica) -> std::result::Result<T, E>,
    E: std::fmt::Display + From<lazytrain_core::Error>,
{
    let outcome = match catch_unwind(AssertUnwindSafe(|| f(&replica))) {
        Ok(Ok(value)) => match replica.device.wait() {
            Ok(()) => Outcome::Done(value),
            Err(e) => Outcome::Failed(E::from(e)),
        },
        Ok(Err(error)) => Outcome::Failed(error),
        Err(panic) => Outcome::Panicked(panic_message(&*panic)),
    };
    let _ = replica.device.wait();
    let group = &replica.group;
    match &outcome {
        Outcome::Done(_) => group.finished(replica.rank),
        Outcome::Failed(error) => group.abort(replica.rank, &error.to_string()),
        Outcome::Panicked(message) => group.abort(replica.rank, &format!("panicked: {message}")),
    }
    outcome
}
