//! Devices: where tensors live and graphs run.
//!
//! A device owns the live graph of pending tensors ([`trace`]: tracing
//! state, the cut at `sync`, canonical numbering), runs the executables of
//! its steps ([`execution`]: synchronously, or on a worker thread while the
//! host traces the next step), and scopes mixed precision ([`precision`]).
//! `sync` (alias `mark_step`) turns every live pending tensor into a graph
//! output, numbers the device-resident inputs as parameters in order of
//! first use, hashes the result, looks it up in the compile cache
//! (compiling on a miss, [`compiling`]) and runs it; the tensors then hold
//! their buffers.

mod compiling;
mod cut;
mod execution;
mod memory;
pub use memory::available_memory_bytes;
mod precision;
pub(crate) mod trace;

pub use precision::{PrecisionGuard, SAVED_ACTIVATION_MIN_ELEMENTS};

use crate::backend::{Backend, CpuBackend};
use crate::cache::CompileCache;
use crate::collective::ReplicaLink;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, MetricsReport};
use execution::{Queue, Runner, Worker};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use trace::LiveGraph;

static NEXT_DEVICE_ID: AtomicUsize = AtomicUsize::new(0);

/// The cores of this machine (at least one).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How a device is set up: its place in a replica group and whether `sync`
/// waits for the step (its kernel threads belong to its backend).
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// The replica ordinal (0 for a lone device).
    pub ordinal: usize,
    /// The replica group `all_reduce` nodes reduce over (none: a lone device).
    pub replica: Option<ReplicaLink>,
    /// `sync` enqueues the step on the device's worker thread and returns;
    /// reading a value waits for it.
    pub asynchronous: bool,
}

/// The state behind a [`Device`] handle.
pub(crate) struct DeviceInner {
    id: usize,
    ordinal: usize,
    backend: Arc<dyn Backend>,
    cache: Arc<CompileCache>,
    metrics: Arc<Metrics>,
    live: Mutex<LiveGraph>,
    debug: bool,
    /// The next sync compiles and plans its step without running it.
    plan_only: std::sync::atomic::AtomicBool,
    /// The training step the graphs cut now belong to (their collectives carry it).
    step_tag: std::sync::atomic::AtomicU64,
    runner: Arc<Runner>,
    queue: Arc<Queue>,
    worker: Option<Mutex<Worker>>,
    /// The dtype matmuls of f32 values compute in, inside an autocast region.
    autocast: Mutex<Option<precision::Scoped>>,
    /// The dtype autodiff stores the f32 forward values its backward reads in.
    saved_activations: Mutex<Option<precision::Scoped>>,
}

/// A device: where tensors live and graphs run. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())
    }
}

impl Device {
    /// A new CPU device with its own compile cache and metrics, whose
    /// backend has a kernel thread per core
    /// ([`CpuBackend::with_threads`]; rayon's global pool if the threads
    /// cannot start).
    ///
    /// `LAZYTRAIN_BACKEND=reference` makes it a device on the reference
    /// backend instead (naive kernels, no fusion; for checking results); an
    /// unknown name is reported once and the CPU backend is used.
    pub fn cpu() -> Device {
        let backend = crate::backend::from_env(Some(cores())).unwrap_or_else(|e| {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("[lazytrain] {e}; using the cpu backend"));
            Arc::new(CpuBackend::default())
        });
        Device::with_backend(backend, Arc::new(CompileCache::new()), 0)
    }

    /// A lone device on the backend named `name` (`cpu` or `reference`,
    /// see [`crate::backend::by_name`]) with its own compile cache.
    pub fn on_backend(name: &str) -> Result<Device> {
        Ok(Device::with_backend(crate::backend::by_name(name, Some(cores()))?, Arc::new(CompileCache::new()), 0))
    }

    /// This device's backend.
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The name of this device's backend (`cpu`, `reference`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// A synchronous device on `backend` sharing `cache`, with replica `ordinal`.
    pub fn with_backend(backend: Arc<dyn Backend>, cache: Arc<CompileCache>, ordinal: usize) -> Device {
        let options = DeviceOptions { ordinal, ..DeviceOptions::default() };
        Device::new(backend, cache, options).expect("a synchronous device starts no thread")
    }

    /// A device on `backend` sharing `cache` (replicas share one), set up by
    /// `options`. Fails when the operating system refuses a thread.
    pub fn new(backend: Arc<dyn Backend>, cache: Arc<CompileCache>, options: DeviceOptions) -> Result<Device> {
        let debug = std::env::var("LAZYTRAIN_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0");
        let id = NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed);
        let thread_error = |e: &dyn fmt::Display| Error::Execution {
            node: 0,
            op: "device",
            detail: format!("could not start the device's threads: {e}"),
        };
        let metrics = Arc::new(Metrics::default());
        let runner = Arc::new(Runner {
            metrics: metrics.clone(),
            replica: options.replica.clone(),
            backend: backend.clone(),
            compared: Mutex::default(),
            settled: Mutex::default(),
        });
        let queue = Arc::new(Queue::default());
        let worker = match options.asynchronous {
            true => Some(Mutex::new(
                Worker::start(runner.clone(), queue.clone(), format!("lazytrain-{id}-worker"))
                    .map_err(|e| thread_error(&e))?,
            )),
            false => None,
        };
        Ok(Device {
            inner: Arc::new(DeviceInner {
                id,
                ordinal: options.ordinal,
                backend,
                cache,
                metrics,
                live: Mutex::new(LiveGraph::default()),
                debug,
                plan_only: std::sync::atomic::AtomicBool::new(false),
                step_tag: std::sync::atomic::AtomicU64::new(0),
                runner,
                queue,
                worker,
                autocast: Mutex::new(None),
                saved_activations: Mutex::new(None),
            }),
        })
    }

    /// The replica group this device belongs to, if any.
    pub fn replica(&self) -> Option<&ReplicaLink> {
        self.inner.runner.replica.as_ref()
    }

    /// This device's replica rank and the number of replicas in its group
    /// (`(0, 1)` for a lone device).
    pub fn replica_position(&self) -> (usize, usize) {
        self.replica().map_or((0, 1), |link| (link.rank, link.collective.world_size()))
    }

    /// Meet every replica of this device's group (PyTorch/XLA's
    /// `xm.rendezvous`), with every step this device enqueued finished first
    /// (an asynchronous device may still be running one). A lone device
    /// only waits for its steps. Fails when a step failed (the group is then
    /// aborted) or another replica stopped the group.
    pub fn rendezvous(&self) -> Result<()> {
        self.meet(false)
    }

    /// [`Device::rendezvous`] where one replica may be busy for long on the
    /// host (the master's last uploads): no collective timeout applies
    /// ([`Collective::patient_barrier`](crate::collective::Collective::patient_barrier)).
    pub fn patient_rendezvous(&self) -> Result<()> {
        self.meet(true)
    }

    /// Meet the group, through its patient barrier when `patient`.
    fn meet(&self, patient: bool) -> Result<()> {
        let failed = |detail: String| Error::Execution { node: 0, op: "rendezvous", detail };
        if let Err(e) = self.wait() {
            let message = format!("a step failed before the rendezvous: {e}");
            if let Some(link) = self.replica() {
                link.collective.abort(link.rank, &message);
            }
            return Err(failed(message));
        }
        match self.replica() {
            Some(link) if link.collective.world_size() > 1 => match patient {
                true => link.collective.patient_barrier(link.rank).map_err(failed),
                false => link.collective.barrier(link.rank).map_err(failed),
            },
            _ => Ok(()),
        }
    }

    /// `cpu:N`-style name (backend and replica ordinal).
    pub fn name(&self) -> String {
        format!("{}:{} (#{})", self.inner.backend.name(), self.inner.ordinal, self.inner.id)
    }

    /// The replica ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// This device's metrics.
    pub fn metrics(&self) -> MetricsReport {
        self.inner.metrics.snapshot()
    }

    /// This device's metrics as text.
    pub fn metrics_report(&self) -> String {
        self.inner.metrics.report()
    }

    /// The compile cache this device uses.
    pub fn cache(&self) -> &Arc<CompileCache> {
        &self.inner.cache
    }

    /// Nodes in the live (not yet synced) graph.
    pub fn live_nodes(&self) -> usize {
        self.lock_live().builder.len()
    }

    pub(crate) fn lock_live(&self) -> MutexGuard<'_, LiveGraph> {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn metrics_store(&self) -> &Metrics {
        &self.inner.metrics
    }
}
