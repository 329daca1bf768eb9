//! Replicas across processes: a [`ProcessGroup`] connects the processes of
//! a job (MPI), and a [`HierarchicalCollective`] reduces over every replica
//! of every process — the threads of a process reduce in shared memory
//! first, then one thread per process (the local leader) reduces over the
//! processes, and the result comes back to the other threads.

use crate::in_process::InProcessCollective;
use lazytrain_core::collective::Collective;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DeviceMemory, HostData};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The processes of a job, one member per process. Only one thread of a
/// process calls it at a time (the local leader), never two at once.
pub trait ProcessGroup: Send + Sync {
    /// The number of processes.
    fn size(&self) -> usize;
    /// This process's rank among them.
    fn rank(&self) -> usize;
    /// Replace `data` (f32 or f64) by its elementwise sum over the processes.
    fn all_reduce_sum(&self, data: &mut HostData) -> Result<(), String>;
    /// Replace `data` by process 0's (same dtype and length everywhere).
    fn broadcast(&self, data: &mut HostData) -> Result<(), String>;
    /// Every process's `value`, in process order.
    fn all_gather(&self, value: u64) -> Result<Vec<u64>, String>;
    /// Wait until every process gets here.
    fn barrier(&self) -> Result<(), String>;
    /// Stop the whole job because of `message` (MPI: `MPI_Abort`, which ends
    /// every process with a non-zero status).
    fn abort(&self, message: &str);
}

/// A collective over `processes × local` replicas: global rank
/// `process * local + thread` (rank-major across processes, then threads).
pub struct HierarchicalCollective {
    local: InProcessCollective,
    local_size: usize,
    group: Arc<dyn ProcessGroup>,
    watchdog: Arc<Watchdog>,
    /// The last step tag the processes were checked to agree on.
    checked_tag: AtomicU64,
}

/// Aborts the job when a call across processes has waited longer than the
/// timeout: a rank that is stuck (or whose host vanished without its
/// processes dying) would otherwise keep every other rank waiting forever.
struct Watchdog {
    timeout: Duration,
    /// The call in progress: when it started, what it is, and which rank makes it.
    armed: Mutex<Option<(Instant, String, usize)>>,
    /// Calls across processes so far (names the one that hung).
    calls: AtomicU64,
}

impl Watchdog {
    /// A watchdog with its checking thread, which ends with the watchdog.
    fn start(timeout: Duration, group: Weak<dyn ProcessGroup>) -> Arc<Watchdog> {
        let watchdog = Arc::new(Watchdog { timeout, armed: Mutex::new(None), calls: AtomicU64::new(0) });
        let weak = Arc::downgrade(&watchdog);
        let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        let spawned = std::thread::Builder::new().name("lazytrain-collective-watchdog".into()).spawn(move || loop {
            std::thread::sleep(tick);
            let (Some(watchdog), Some(group)) = (weak.upgrade(), group.upgrade()) else { return };
            let overdue = watchdog
                .armed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .filter(|(since, _, _)| since.elapsed() > watchdog.timeout)
                .map(|(_, what, rank)| (what.clone(), *rank));
            if let Some((what, rank)) = overdue {
                group.abort(&format!(
                    "{what} on replica {rank} has not completed after {} s: another process has not arrived \
                     (stuck, or its host is gone); raise --collective-timeout if its steps are that slow",
                    watchdog.timeout.as_secs_f64()
                ));
                return;
            }
        });
        if let Err(e) = spawned {
            eprintln!("lazytrain: no collective watchdog ({e}): a stuck rank will not be detected");
        }
        watchdog
    }

    /// Run `call` (named `what`, made by replica `rank`) under the watchdog.
    fn watch<T>(&self, what: &str, rank: usize, call: impl FnOnce() -> T) -> T {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), format!("collective #{n} ({what})"), rank));
        let result = call();
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        result
    }
}

impl HierarchicalCollective {
    /// `local_size` replicas (threads) in this process, joined to the other
    /// processes by `group`; a call across processes that waits longer than
    /// `timeout` aborts the job.
    pub fn new(local_size: usize, group: Arc<dyn ProcessGroup>, timeout: Duration) -> HierarchicalCollective {
        let local_size = local_size.max(1);
        let watchdog = Watchdog::start(timeout, Arc::downgrade(&group));
        HierarchicalCollective {
            local: InProcessCollective::new(local_size),
            local_size,
            group,
            watchdog,
            checked_tag: AtomicU64::new(u64::MAX),
        }
    }

    /// The global rank of this process's thread `local`.
    pub fn global_rank(&self, local: usize) -> usize {
        self.group.rank() * self.local_size + local
    }

    /// This process's thread of global rank `rank`, checked.
    fn local_rank(&self, rank: usize) -> Result<usize, String> {
        let first = self.global_rank(0);
        match rank.checked_sub(first).filter(|&l| l < self.local_size) {
            Some(local) => Ok(local),
            None => Err(format!(
                "replica {rank} is not one of this process's replicas {first}..{}",
                first + self.local_size
            )),
        }
    }
}

/// Divide every element by `n` (a mean from a sum).
fn divide(data: &mut HostData, n: usize) -> Result<(), String> {
    match data {
        HostData::F32(v) => v.iter_mut().for_each(|x| *x /= n as f32),
        HostData::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
        other => return Err(format!("all_reduce supports f32 and f64 values, not {}", other.dtype())),
    }
    Ok(())
}

/// Set every element to zero.
fn zero(data: &mut HostData) {
    match data {
        HostData::F32(v) => v.fill(0.0),
        HostData::F64(v) => v.fill(0.0),
        other => *other = HostData::zeros(other.dtype(), other.len()),
    }
}

impl Collective for HierarchicalCollective {
    fn world_size(&self) -> usize {
        self.group.size() * self.local_size
    }

    fn all_reduce(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp) -> Result<(), String> {
        self.all_reduce_tagged(rank, data, op, 0)
    }

    fn all_reduce_tagged(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp, tag: u64) -> Result<(), String> {
        let local = self.local_rank(rank)?;
        // The threads' sum, on every thread of this process (which also
        // compares their step tags).
        self.local.all_reduce_tagged(local, data, AllReduceOp::Sum, tag)?;
        let Some(host) = data.host_mut() else {
            return Err("the MPI collective reduces host memory; this buffer is in a backend's device memory".into());
        };
        if self.group.size() > 1 {
            // The leader sums over the processes; the others contribute zeros
            // to a second shared-memory pass, which hands every thread the
            // leader's result exactly (x + 0 = x).
            if local == 0 {
                // The first all-reduce of each step compares the processes'
                // step tags (one small all-gather per step).
                if self.checked_tag.swap(tag, Ordering::SeqCst) != tag {
                    let check = || {
                        let tags = self.group.all_gather(tag)?;
                        match tags.iter().position(|&t| t != tag) {
                            Some(process) => Err(format!(
                                "processes disagree on the step of an all_reduce: step {tag} here (process {}), \
                                 step {} on process {process}; every rank must run the same steps",
                                self.group.rank(),
                                tags[process]
                            )),
                            None => Ok(()),
                        }
                    };
                    if let Err(message) = self.watchdog.watch("step check", rank, check) {
                        self.abort(rank, &message);
                        return Err(message);
                    }
                }
                let what = format!("all_reduce of {} {} values", host.len(), host.dtype());
                if let Err(message) = self.watchdog.watch(&what, rank, || self.group.all_reduce_sum(host)) {
                    self.abort(rank, &message);
                    return Err(message);
                }
            } else {
                zero(host);
            }
            self.local.all_reduce(local, data, AllReduceOp::Sum)?;
        }
        match (op, data.host_mut()) {
            (AllReduceOp::Sum, _) => Ok(()),
            (AllReduceOp::Mean, Some(host)) => divide(host, self.world_size()),
            (AllReduceOp::Mean, None) => unreachable!("checked above: host memory"),
        }
    }

    fn broadcast(&self, rank: usize, data: &mut DeviceMemory) -> Result<(), String> {
        let local = self.local_rank(rank)?;
        if local == 0 && self.group.size() > 1 {
            // Process 0's leader is replica 0: the leaders take its data first.
            let Some(host) = data.host_mut() else {
                return Err(
                    "the MPI collective broadcasts host memory; this buffer is in a backend's device memory".into()
                );
            };
            // Mismatched lengths would be undefined behaviour in MPI: compare first.
            let signature = {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                (host.dtype().to_string(), host.len()).hash(&mut hasher);
                hasher.finish()
            };
            let signatures = self.watchdog.watch("broadcast check", rank, || self.group.all_gather(signature))?;
            if signatures.iter().any(|&s| s != signatures[0]) {
                return Err(format!(
                    "processes disagree on a broadcast: {} {} elements here, other lengths or dtypes elsewhere",
                    host.len(),
                    host.dtype()
                ));
            }
            let what = format!("broadcast of {} {} values", host.len(), host.dtype());
            self.watchdog.watch(&what, rank, || self.group.broadcast(host))?;
        }
        self.local.broadcast(local, data)
    }

    fn agree_on_graph(&self, rank: usize, hash: u64) -> Result<(), String> {
        let local = self.local_rank(rank)?;
        self.local.agree_on_graph(local, hash)?;
        if local == 0 && self.group.size() > 1 {
            let per_process = self.watchdog.watch("graph hash all-gather", rank, || self.group.all_gather(hash))?;
            // Every thread of a process agreed on its hash above.
            let hashes: Vec<u64> = per_process.iter().flat_map(|&h| std::iter::repeat_n(h, self.local_size)).collect();
            if let Some(message) = lazytrain_core::collective::graph_disagreement(&hashes) {
                return Err(message);
            }
        }
        Ok(())
    }

    fn barrier(&self, rank: usize) -> Result<(), String> {
        let local = self.local_rank(rank)?;
        self.local.barrier(local)?;
        if local == 0 {
            self.watchdog.watch("barrier", rank, || self.group.barrier())?;
        }
        self.local.barrier(local)
    }

    fn patient_barrier(&self, rank: usize) -> Result<(), String> {
        let local = self.local_rank(rank)?;
        self.local.barrier(local)?;
        if local == 0 {
            // Unwatched: MPI still ends the job if a process dies.
            self.group.barrier()?;
        }
        self.local.barrier(local)
    }

    fn abort(&self, rank: usize, message: &str) {
        self.local.abort(rank, message);
        if self.group.size() > 1 {
            eprintln!("lazytrain: replica {rank} stopped the job: {message}");
            self.group.abort(&format!("replica {rank}: {message}"));
        }
    }

    fn finished(&self, rank: usize) {
        self.local.finished(rank);
    }

    fn abort_reason(&self) -> Option<(usize, String)> {
        self.local.abort_reason()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Processes" that are threads: the leaders meet in an in-process
    /// collective of their own (what MPI's world is across processes).
    struct ThreadProcesses {
        rank: usize,
        leaders: Arc<InProcessCollective>,
        gathered: Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl ProcessGroup for ThreadProcesses {
        fn size(&self) -> usize {
            self.leaders.world_size()
        }

        fn rank(&self) -> usize {
            self.rank
        }

        fn all_reduce_sum(&self, data: &mut HostData) -> Result<(), String> {
            let mut memory = DeviceMemory::Host(std::mem::replace(data, HostData::F32(Vec::new())));
            let result = self.leaders.all_reduce(self.rank, &mut memory, AllReduceOp::Sum);
            *data = memory.host().expect("host memory").clone();
            result
        }

        fn broadcast(&self, data: &mut HostData) -> Result<(), String> {
            let mut memory = DeviceMemory::Host(std::mem::replace(data, HostData::F32(Vec::new())));
            let result = self.leaders.broadcast(self.rank, &mut memory);
            *data = memory.host().expect("host memory").clone();
            result
        }

        fn all_gather(&self, value: u64) -> Result<Vec<u64>, String> {
            self.gathered.lock().unwrap()[self.rank] = value;
            self.leaders.barrier(self.rank)?;
            let all = self.gathered.lock().unwrap().clone();
            self.leaders.barrier(self.rank)?;
            Ok(all)
        }

        fn barrier(&self) -> Result<(), String> {
            self.leaders.barrier(self.rank)
        }

        fn abort(&self, message: &str) {
            self.leaders.abort(self.rank, message);
        }
    }

    /// Run `f(global rank, collective)` on `processes × threads` replicas.
    fn run<T: Send>(
        processes: usize,
        threads: usize,
        f: impl Fn(usize, &HierarchicalCollective) -> T + Sync,
    ) -> Vec<T> {
        let leaders = Arc::new(InProcessCollective::new(processes));
        let gathered = Arc::new(std::sync::Mutex::new(vec![0; processes]));
        let groups: Vec<HierarchicalCollective> = (0..processes)
            .map(|rank| {
                let group = ThreadProcesses { rank, leaders: leaders.clone(), gathered: gathered.clone() };
                HierarchicalCollective::new(threads, Arc::new(group), Duration::from_secs(60))
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .iter()
                .flat_map(|g| (0..threads).map(move |t| (g, t)))
                .map(|(g, t)| {
                    let f = &f;
                    s.spawn(move || f(g.global_rank(t), g))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn two_processes_of_two_threads_reduce_over_all_four_replicas() {
        let results = run(2, 2, |rank, group| {
            let mut data = DeviceMemory::Host(HostData::F32(vec![rank as f32, 1.0, 10.0 * rank as f32]));
            group.all_reduce(rank, &mut data, AllReduceOp::Mean).unwrap();
            let mean = data.host().unwrap().clone();
            group.all_reduce(rank, &mut data, AllReduceOp::Sum).unwrap();
            group.barrier(rank).unwrap();
            (rank, mean, data.host().unwrap().clone())
        });
        let ranks: Vec<usize> = results.iter().map(|r| r.0).collect();
        assert_eq!(ranks, vec![0, 1, 2, 3], "rank-major: process, then thread");
        for (_, mean, sum) in results {
            assert_eq!(mean, HostData::F32(vec![1.5, 1.0, 15.0]));
            assert_eq!(sum, HostData::F32(vec![6.0, 4.0, 60.0]));
        }
    }

    #[test]
    fn replica_0s_data_reaches_every_thread_of_every_process() {
        let results = run(2, 2, |rank, group| {
            let mut data = DeviceMemory::Host(HostData::I64(vec![rank as i64 + 10; 3]));
            group.broadcast(rank, &mut data).unwrap();
            data.host().unwrap().clone()
        });
        assert!(results.iter().all(|d| *d == HostData::I64(vec![10; 3])), "{results:?}");
    }

    #[test]
    fn a_process_with_another_graph_is_named() {
        let results = run(2, 2, |rank, group| group.agree_on_graph(rank, if rank >= 2 { 7 } else { 5 }));
        let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        assert_eq!(errors.len(), 2, "the two leaders see the mismatch");
        assert!(errors[0].contains("replica 0 runs graph 0000000000000005, replica 2 runs graph 0000000000000007"));
        let agreed = run(2, 2, |rank, group| group.agree_on_graph(rank, 9));
        assert!(agreed.iter().all(Result::is_ok));
    }
}
