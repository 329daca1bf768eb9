//! Running a device's steps: synchronously on the host, or on the device's
//! worker thread (asynchronous devices) while the host traces the next
//! step; reading a value, `wait` and `rendezvous` wait for the queue.

use super::Device;
use crate::backend::{Backend, Executable};
use crate::collective::{ReplicaLink, RunContext};
use crate::error::{panic_message, Error, Result};
use crate::ir::{Graph, Op};
use crate::metrics::Metrics;
use crate::storage::{Buffer, DeviceMemory};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// What running an executable needs, shared by the host (synchronous
/// devices) and the worker thread (asynchronous ones).
pub(super) struct Runner {
    pub(super) metrics: Arc<Metrics>,
    pub(super) replica: Option<ReplicaLink>,
    /// The device's backend, which runs executables with its resources.
    pub(super) backend: Arc<dyn Backend>,
    /// What the replicas compare for each graph seen (by structural hash):
    /// its computation hash, or `None` when it has no collective.
    pub(super) compared: Mutex<FxHashMap<u64, Option<u64>>>,
    /// Computation hashes the replicas agreed they all run. Keyed by what
    /// they compare (not by the structural hash, which includes donation
    /// and may differ between replicas), so every replica agrees on a
    /// computation exactly once.
    pub(super) settled: Mutex<FxHashSet<u64>>,
}

/// A graph the replicas of a group must agree they all run before its
/// first collective.
#[derive(Clone, Copy, Debug)]
pub(super) struct Agreement {
    /// What the replicas compare ([`Graph::computation_hash`]).
    computation: u64,
    /// Where this replica cut the graph (named when they disagree).
    site: &'static std::panic::Location<'static>,
}

impl Runner {
    /// What the replicas must agree on before `graph` (structural hash
    /// `hash`) runs: nothing when it has no collective, the device is alone
    /// or they agreed already; else its [`Agreement`].
    pub(super) fn agreement_for(
        &self,
        graph: &Graph,
        hash: u64,
        site: &'static std::panic::Location<'static>,
    ) -> Option<Agreement> {
        if self.replica.as_ref().is_none_or(|link| link.collective.world_size() <= 1) {
            return None;
        }
        let computation = *self.compared.lock().unwrap_or_else(|p| p.into_inner()).entry(hash).or_insert_with(|| {
            graph.nodes.iter().any(|n| matches!(n.op, Op::AllReduce(_))).then(|| graph.computation_hash())
        });
        let computation = computation?;
        let settled = self.settled.lock().unwrap_or_else(|p| p.into_inner()).contains(&computation);
        (!settled).then_some(Agreement { computation, site })
    }

    /// Run `exe` on `inputs` through the device's backend and count it.
    /// With `agreement`, the replicas first check that they all run the
    /// graph of that hash (before its first collective).
    pub(super) fn run(
        &self,
        exe: &dyn Executable,
        inputs: Vec<Arc<Buffer>>,
        agreement: Option<Agreement>,
        step_tag: u64,
    ) -> Result<Vec<Arc<Buffer>>> {
        if let (Some(agreement), Some(link)) = (agreement, &self.replica) {
            // Checked when the step runs (steps run in order on a device), so
            // only the first run of a graph agrees, on every replica alike.
            let known = self.settled.lock().unwrap_or_else(|p| p.into_inner()).contains(&agreement.computation);
            if !known {
                link.collective.agree_on_graph(link.rank, agreement.computation).map_err(|detail| {
                    Error::Execution {
                        node: 0,
                        op: "all_reduce",
                        detail: format!("{detail} (replica {} cut its step at {})", link.rank, agreement.site),
                    }
                })?;
                self.settled.lock().unwrap_or_else(|p| p.into_inner()).insert(agreement.computation);
            }
        }
        let context = RunContext { replica: self.replica.as_ref(), step_tag };
        let start = Instant::now();
        let results = self.backend.execute(exe, inputs, &context)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let peak = exe.stats().peak_bytes as u64;
        self.metrics.update(|m| {
            m.executions += 1;
            m.execute_ms += ms;
            m.peak_execution_bytes = m.peak_execution_bytes.max(peak);
        });
        Ok(results)
    }
}

/// A step enqueued on an asynchronous device: its outputs are in-flight
/// buffers, held weakly so a value nobody reads any more is simply dropped.
pub(super) struct Job {
    pub(super) executable: Arc<dyn Executable>,
    pub(super) inputs: Vec<Arc<Buffer>>,
    pub(super) outputs: Vec<Weak<Buffer>>,
    /// What the replicas agree on before the graph runs, the first time.
    pub(super) agreement: Option<Agreement>,
    /// The step the graph was cut in ([`Device::set_step_tag`]).
    pub(super) step_tag: u64,
}

/// Steps enqueued but not finished, and the first failure since the last wait.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) state: Mutex<(usize, Option<String>)>,
    pub(super) drained: Condvar,
}

/// The worker thread of an asynchronous device.
pub(super) struct Worker {
    pub(super) sender: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start the worker thread `name`, which runs the jobs it is sent.
    pub(super) fn start(runner: Arc<Runner>, queue: Arc<Queue>, name: String) -> std::io::Result<Worker> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            let mut idle_since: Option<Instant> = None;
            while let Ok(job) = receiver.recv() {
                if let Some(t) = idle_since {
                    let idle = t.elapsed().as_secs_f64() * 1e3;
                    runner.metrics.update(|m| m.device_idle_ms += idle);
                }
                // A step that panics fails like one that errs: its outputs and
                // the next `wait` report it (the worker lives on, so nobody
                // waits forever for a step that will never finish), and the
                // replica group is aborted, so the other replicas stop
                // waiting for this one in their collectives and barriers.
                let run = std::panic::AssertUnwindSafe(|| {
                    runner.run(&*job.executable, job.inputs, job.agreement, job.step_tag)
                });
                let outcome = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
                    let detail = format!("the step panicked: {}", panic_message(&*panic));
                    if let Some(link) = &runner.replica {
                        link.collective.abort(link.rank, &detail);
                    }
                    Err(Error::Execution { node: 0, op: "step", detail })
                });
                let failure = fulfil(&job.outputs, outcome);
                let mut state = queue.state.lock().unwrap_or_else(|p| p.into_inner());
                state.0 -= 1;
                if state.1.is_none() {
                    state.1 = failure;
                }
                if state.0 == 0 {
                    idle_since = Some(Instant::now());
                    queue.drained.notify_all();
                } else {
                    idle_since = None;
                }
            }
        })?;
        Ok(Worker { sender: Some(sender), handle: Some(handle) })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.sender.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Move a finished step's results into its in-flight output buffers (or the
/// failure); returns the failure's message.
fn fulfil(outputs: &[Weak<Buffer>], outcome: Result<Vec<Arc<Buffer>>>) -> Option<String> {
    match outcome {
        Ok(results) => {
            for (slot, result) in outputs.iter().zip(results) {
                if let Some(buffer) = slot.upgrade() {
                    let data = match Arc::try_unwrap(result) {
                        Ok(owned) => owned.into_memory(),
                        Err(shared) => shared.wait_memory().and_then(DeviceMemory::duplicate),
                    };
                    buffer.fulfil(data);
                }
            }
            None
        }
        Err(e) => {
            let message: Arc<str> = e.to_string().into();
            for buffer in outputs.iter().filter_map(Weak::upgrade) {
                buffer.fulfil(Err(message.clone()));
            }
            Some(e.to_string())
        }
    }
}

impl Device {
    /// True when `sync` enqueues steps instead of running them.
    pub fn is_asynchronous(&self) -> bool {
        self.inner.worker.is_some()
    }
    /// Wait until every enqueued step has finished. Returns the first
    /// failure of a step since the last wait (its outputs hold the error too).
    pub fn wait(&self) -> Result<()> {
        let start = Instant::now();
        let mut state = self.inner.queue.state.lock().unwrap_or_else(|p| p.into_inner());
        let waited = state.0 > 0;
        while state.0 > 0 {
            state = self.inner.queue.drained.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        let failure = state.1.take();
        drop(state);
        if waited {
            self.record_host_wait(start);
        }
        match failure {
            Some(detail) => Err(Error::Execution { node: 0, op: "step", detail }),
            None => Ok(()),
        }
    }

    /// Count the time since `start` as the host waiting on the device.
    pub(crate) fn record_host_wait(&self, start: Instant) {
        let ms = start.elapsed().as_secs_f64() * 1e3;
        self.inner.metrics.update(|m| m.host_wait_ms += ms);
    }
}
