//! Devices own the live graph of pending tensors and cut it at `sync`.
//!
//! Tracing appends hash-consed nodes to the device's live graph. `sync`
//! (alias `mark_step`) turns every live pending tensor into a graph output,
//! numbers the device-resident inputs as parameters in order of first use,
//! hashes the result, looks it up in the compile cache (compiling on a miss)
//! and runs it; the tensors then hold their buffers.

use crate::backend::{Backend, CpuBackend, Executable};
use crate::cache::CompileCache;
use crate::collective::{ReplicaLink, RunContext};
use crate::compile;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Graph, GraphBuilder, Node, NodeId, Op};
use crate::metrics::{CompileEvent, Metrics, MetricsReport};
use crate::storage::Buffer;
use crate::tensor::{TensorCell, TensorState};
use rustc_hash::FxHashMap;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

static NEXT_DEVICE_ID: AtomicUsize = AtomicUsize::new(0);

/// The graph traced since the last sync.
#[derive(Default)]
pub(crate) struct LiveGraph {
    pub(crate) builder: GraphBuilder,
    /// Device buffers read by the live graph, by parameter number.
    params: Vec<Arc<Buffer>>,
    /// Parameter node of each buffer, by buffer address.
    param_nodes: FxHashMap<usize, NodeId>,
    /// Tensors created since the last sync; the live ones become outputs.
    pending: Vec<Weak<TensorCell>>,
    /// Trainable leaves read by the live graph, by their parameter node.
    leaves: Vec<(NodeId, Weak<TensorCell>)>,
    /// Pending-list length at which dead entries are pruned next.
    prune_at: usize,
    /// Random streams handed out in this graph.
    next_rng_stream: u64,
}

impl LiveGraph {
    /// The node that reads `buffer` (a new parameter on first use).
    pub(crate) fn param_node(&mut self, buffer: &Arc<Buffer>, node: impl FnOnce(usize) -> Node) -> NodeId {
        let key = Arc::as_ptr(buffer) as usize;
        if let Some(&id) = self.param_nodes.get(&key) {
            return id;
        }
        let k = self.params.len();
        self.params.push(buffer.clone());
        let id = self.builder.push(node(k));
        self.param_nodes.insert(key, id);
        id
    }

    /// Remember that the trainable leaf `cell` is read through node `id`.
    pub(crate) fn record_leaf(&mut self, id: NodeId, cell: &Arc<TensorCell>) {
        if !self.leaves.iter().any(|(i, _)| *i == id) {
            self.leaves.push((id, Arc::downgrade(cell)));
        }
    }

    /// The trainable leaves the live graph reads, with their nodes.
    pub(crate) fn leaves(&self) -> Vec<(NodeId, Arc<TensorCell>)> {
        self.leaves.iter().filter_map(|(id, w)| w.upgrade().map(|c| (*id, c))).collect()
    }

    /// The parameter node already reading `buffer`, if the live graph uses it.
    pub(crate) fn existing_param_node(&self, buffer: &Arc<Buffer>) -> Option<NodeId> {
        self.param_nodes.get(&(Arc::as_ptr(buffer) as usize)).copied()
    }

    /// Remember a pending tensor so the next sync materialises it. Dropped
    /// tensors are pruned whenever the list doubles, so the list stays
    /// proportional to the live tensors and the sync has little to free.
    pub(crate) fn register(&mut self, cell: &Arc<TensorCell>) {
        if self.pending.len() >= self.prune_at {
            self.pending.retain(|w| w.strong_count() > 0);
            self.prune_at = (self.pending.len() * 2).max(64);
        }
        self.pending.push(Arc::downgrade(cell));
    }

    /// A fresh random stream number for this graph.
    pub(crate) fn next_rng_stream(&mut self) -> u64 {
        self.next_rng_stream += 1;
        self.next_rng_stream - 1
    }
}

/// How a device is set up: its place in a replica group, its threads and
/// whether `sync` waits for the step.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// The replica ordinal (0 for a lone device).
    pub ordinal: usize,
    /// The replica group `all_reduce` nodes reduce over (none: a lone device).
    pub replica: Option<ReplicaLink>,
    /// Threads for this device's kernels (none: the process-wide pool, all cores).
    pub threads: Option<usize>,
    /// `sync` enqueues the step on the device's worker thread and returns;
    /// reading a value waits for it.
    pub asynchronous: bool,
}

/// What running an executable needs, shared by the host (synchronous
/// devices) and the worker thread (asynchronous ones).
struct Runner {
    metrics: Arc<Metrics>,
    replica: Option<ReplicaLink>,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl Runner {
    fn run(&self, exe: &dyn Executable, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        let context = RunContext { replica: self.replica.as_ref() };
        let start = Instant::now();
        let results = match &self.pool {
            Some(pool) => pool.install(|| exe.run(inputs, &context)),
            None => exe.run(inputs, &context),
        }?;
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
struct Job {
    executable: Arc<dyn Executable>,
    inputs: Vec<Arc<Buffer>>,
    outputs: Vec<Weak<Buffer>>,
}

/// Steps enqueued but not finished, and the first failure since the last wait.
#[derive(Default)]
struct Queue {
    state: Mutex<(usize, Option<String>)>,
    drained: Condvar,
}

/// The worker thread of an asynchronous device.
struct Worker {
    sender: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    fn start(runner: Arc<Runner>, queue: Arc<Queue>, name: String) -> std::io::Result<Worker> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            let mut idle_since: Option<Instant> = None;
            while let Ok(job) = receiver.recv() {
                if let Some(t) = idle_since {
                    let idle = t.elapsed().as_secs_f64() * 1e3;
                    runner.metrics.update(|m| m.device_idle_ms += idle);
                }
                let outcome = runner.run(&*job.executable, job.inputs);
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
                        Ok(owned) => owned.into_host(),
                        Err(shared) => shared.wait().cloned(),
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

pub(crate) struct DeviceInner {
    id: usize,
    ordinal: usize,
    backend: Arc<dyn Backend>,
    cache: Arc<CompileCache>,
    metrics: Arc<Metrics>,
    live: Mutex<LiveGraph>,
    debug: bool,
    runner: Arc<Runner>,
    queue: Arc<Queue>,
    worker: Option<Mutex<Worker>>,
    /// The dtype matmuls of f32 values compute in, inside an autocast region.
    autocast: Mutex<Option<DType>>,
    /// The dtype autodiff stores the f32 forward values its backward reads in.
    saved_activations: Mutex<Option<DType>>,
}

/// The fewest elements an f32 activation has for
/// [`Device::save_activations_as`] to store it narrow: a smaller one costs
/// a kernel output more than its bytes save.
pub const SAVED_ACTIVATION_MIN_ELEMENTS: usize = 4096;

/// A mixed-precision setting that a [`PrecisionGuard`] scopes.
#[derive(Clone, Copy, Debug)]
enum PrecisionSetting {
    Autocast,
    SavedActivations,
}

/// Restores the previous value of the setting it scopes when dropped (see
/// [`Device::autocast`] and [`Device::save_activations_as`]).
#[must_use = "the setting ends when the guard is dropped"]
pub struct PrecisionGuard {
    device: Device,
    setting: PrecisionSetting,
    previous: Option<DType>,
}

impl Drop for PrecisionGuard {
    fn drop(&mut self) {
        *self.device.precision(self.setting).lock().unwrap_or_else(|p| p.into_inner()) = self.previous;
    }
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
    /// A new CPU device with its own compile cache and metrics. Its kernels
    /// run in a thread pool of its own, one thread per core: a step runs on
    /// a pool thread, so splitting a kernel wakes one other thread instead of
    /// handing both halves to a shared pool while the caller sleeps (5–8 %
    /// faster steps on 2 cores). Without threads it uses the shared pool.
    ///
    /// `LAZYTRAIN_BACKEND=reference` makes it a device on the reference
    /// backend instead (naive kernels, no fusion; for checking results); an
    /// unknown name is reported once and the CPU backend is used.
    pub fn cpu() -> Device {
        let backend = crate::backend::from_env().unwrap_or_else(|e| {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("[lazytrain] {e}; using the cpu backend"));
            Arc::new(CpuBackend::default())
        });
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let options = DeviceOptions { threads: Some(threads), ..DeviceOptions::default() };
        Device::new(backend.clone(), Arc::new(CompileCache::new()), options)
            .unwrap_or_else(|_| Device::with_backend(backend, Arc::new(CompileCache::new()), 0))
    }

    /// A lone device on the backend named `name` (`cpu` or `reference`,
    /// see [`crate::backend::by_name`]) with its own compile cache.
    pub fn on_backend(name: &str) -> Result<Device> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let options = DeviceOptions { threads: Some(threads), ..DeviceOptions::default() };
        Device::new(crate::backend::by_name(name)?, Arc::new(CompileCache::new()), options)
    }

    /// The name of this device's backend (`cpu`, `reference`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// A synchronous device on `backend` sharing `cache`, with replica `ordinal`.
    pub fn with_backend(backend: Arc<dyn Backend>, cache: Arc<CompileCache>, ordinal: usize) -> Device {
        let options = DeviceOptions { ordinal, ..DeviceOptions::default() };
        Device::new(backend, cache, options).expect("a synchronous device without its own pool starts no thread")
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
        let pool = match options.threads {
            Some(n) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .thread_name(move |i| format!("lazytrain-{id}-kernel-{i}"))
                    .build()
                    .map_err(|e| thread_error(&e))?,
            )),
            None => None,
        };
        let metrics = Arc::new(Metrics::default());
        let runner = Arc::new(Runner { metrics: metrics.clone(), replica: options.replica.clone(), pool });
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
                runner,
                queue,
                worker,
                autocast: Mutex::new(None),
                saved_activations: Mutex::new(None),
            }),
        })
    }

    /// Mixed precision for the ops traced while the guard lives (PyTorch's
    /// `torch.autocast`): matmuls of f32 values cast their operands to
    /// `dtype` (bf16), multiply with f32 accumulation and cast the product
    /// back to f32. Everything else (softmax, LayerNorm, the loss, the
    /// optimizer) stays f32, and parameters stay f32 master weights. The
    /// casts are graph ops: the backward pass of such a matmul runs in
    /// `dtype` too, and the fuser folds the casts into neighbouring kernels.
    #[track_caller]
    pub fn autocast(&self, dtype: DType) -> Result<PrecisionGuard> {
        self.scope_precision(PrecisionSetting::Autocast, dtype)
    }

    /// The dtype matmuls of f32 values compute in right now, if autocasting.
    pub fn autocast_dtype(&self) -> Option<DType> {
        *self.precision(PrecisionSetting::Autocast).lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Store activations for the backward pass in `dtype` (bf16) while the
    /// guard lives (what `torch.autograd.graph.saved_tensors_hooks` that
    /// pack to bf16 do): every f32 forward value of at least
    /// [`SAVED_ACTIVATION_MIN_ELEMENTS`] elements that a gradient computed
    /// by `backward`/`grad` here reads is rounded to `dtype` once and
    /// widened where the backward reads it. The f32 value then dies with
    /// the forward pass (the fuser writes the narrow copy from the kernel
    /// that computes it and widens it in the kernels that read it), so the
    /// values kept from forward to backward take half the memory. The
    /// forward pass and the loss are unchanged; gradients carry the
    /// rounding of their saved inputs (bf16: 8 significant bits).
    /// Parameters and constants are read as they are.
    #[track_caller]
    pub fn save_activations_as(&self, dtype: DType) -> Result<PrecisionGuard> {
        self.scope_precision(PrecisionSetting::SavedActivations, dtype)
    }

    /// The dtype saved activations are stored in right now, if narrowed.
    pub fn saved_activation_dtype(&self) -> Option<DType> {
        *self.precision(PrecisionSetting::SavedActivations).lock().unwrap_or_else(|p| p.into_inner())
    }

    fn precision(&self, setting: PrecisionSetting) -> &Mutex<Option<DType>> {
        match setting {
            PrecisionSetting::Autocast => &self.inner.autocast,
            PrecisionSetting::SavedActivations => &self.inner.saved_activations,
        }
    }

    /// Set `setting` to `dtype` (bf16, the one low precision these settings
    /// take) until the returned guard drops.
    #[track_caller]
    fn scope_precision(&self, setting: PrecisionSetting, dtype: DType) -> Result<PrecisionGuard> {
        if dtype != DType::BF16 {
            let (what, rule) = match setting {
                PrecisionSetting::Autocast => ("autocast", "autocast computes matmuls"),
                PrecisionSetting::SavedActivations => ("save_activations_as", "saved activations are stored"),
            };
            return Err(Error::Data {
                what,
                detail: format!("{rule} in bf16, not {dtype}"),
                location: Location::caller(),
            });
        }
        let previous = self.precision(setting).lock().unwrap_or_else(|p| p.into_inner()).replace(dtype);
        Ok(PrecisionGuard { device: self.clone(), setting, previous })
    }

    /// True when `sync` enqueues steps instead of running them.
    pub fn is_asynchronous(&self) -> bool {
        self.inner.worker.is_some()
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
        let failed = |detail: String| Error::Execution { node: 0, op: "rendezvous", detail };
        if let Err(e) = self.wait() {
            let message = format!("a step failed before the rendezvous: {e}");
            if let Some(link) = self.replica() {
                link.collective.abort(link.rank, &message);
            }
            return Err(failed(message));
        }
        match self.replica() {
            Some(link) if link.collective.world_size() > 1 => link.collective.barrier(link.rank).map_err(failed),
            _ => Ok(()),
        }
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

    /// Cut the live graph here and run it: every live pending tensor gets its
    /// value. Returns once the values are computed.
    #[track_caller]
    pub fn sync(&self) -> Result<()> {
        self.sync_at(Location::caller())
    }

    /// PyTorch/XLA's name for [`Device::sync`]: the end of a training step.
    #[track_caller]
    pub fn mark_step(&self) -> Result<()> {
        self.sync_at(Location::caller())
    }

    /// A sync caused by reading a pending value at `location`.
    pub(crate) fn forced_sync(&self, location: &'static Location<'static>) -> Result<()> {
        self.inner.metrics.record_forced_sync(&location.to_string());
        self.sync_at(location)
    }

    fn sync_at(&self, location: &'static Location<'static>) -> Result<()> {
        let mut live = self.lock_live();
        let taken = std::mem::take(&mut *live);
        let mut cells = Vec::new();
        let mut outputs = Vec::new();
        for weak in &taken.pending {
            if let Some(cell) = weak.upgrade() {
                if let TensorState::Pending(id) = *cell.lock_state() {
                    outputs.push(id);
                    cells.push(cell.clone());
                }
            }
        }
        if outputs.is_empty() {
            return Ok(());
        }
        self.inner.metrics.update(|m| m.syncs += 1);
        let cut_start = Instant::now();
        let traced_nodes = taken.builder.len() as u64;
        self.inner.metrics.update(|m| m.traced_nodes += traced_nodes);
        let num_params = taken.params.len();
        let traced = taken.builder.finish(outputs, num_params);
        let (mut graph, param_order) = canonicalize(traced);
        let mut params: Vec<Option<Arc<Buffer>>> = taken.params.into_iter().map(Some).collect();
        let inputs: Vec<Arc<Buffer>> = param_order.iter().filter_map(|&k| params[k].take()).collect();
        // A buffer only this sync still holds is donated: the executable may
        // write the step's new values into it.
        graph.donated = inputs.iter().map(|b| Arc::strong_count(b) == 1).collect();
        let executable = match self.executable_for(graph, location, cut_start) {
            Ok(exe) => exe,
            Err(e) => return Err(fail_cells(&cells, e)),
        };
        if let Some(worker) = &self.inner.worker {
            // Asynchronous: the outputs become in-flight buffers now and the
            // worker fills them; the host goes on tracing.
            let buffers: Vec<Arc<Buffer>> =
                cells.iter().map(|cell| Arc::new(Buffer::in_flight(cell.dtype()))).collect();
            let outputs = buffers.iter().map(Arc::downgrade).collect();
            for (cell, buffer) in cells.iter().zip(buffers) {
                *cell.lock_state() = TensorState::Ready(buffer);
            }
            self.inner.queue.state.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
            let job = Job { executable, inputs, outputs };
            let sent = worker.lock().unwrap_or_else(|p| p.into_inner()).sender.as_ref().map(|s| s.send(job));
            if !matches!(sent, Some(Ok(()))) {
                self.inner.queue.state.lock().unwrap_or_else(|p| p.into_inner()).0 -= 1;
                let e =
                    Error::Execution { node: 0, op: "device", detail: "the device's worker thread has stopped".into() };
                return Err(fail_cells(&cells, e));
            }
            return Ok(());
        }
        let results = match self.inner.runner.run(&*executable, inputs) {
            Ok(results) => results,
            Err(e) => return Err(fail_cells(&cells, e)),
        };
        for (cell, buffer) in cells.iter().zip(results) {
            *cell.lock_state() = TensorState::Ready(buffer);
        }
        drop(live);
        Ok(())
    }

    fn executable_for(
        &self,
        graph: Graph,
        location: &'static Location<'static>,
        cut_start: Instant,
    ) -> Result<Arc<dyn Executable>> {
        let hash = graph.structural_hash();
        let cached = self.inner.cache.get(hash, &graph);
        let lookup_ms = cut_start.elapsed().as_secs_f64() * 1e3;
        self.inner.metrics.update(|m| m.lookup_ms += lookup_ms);
        if let Some(exe) = cached {
            self.inner.metrics.update(|m| m.cache_hits += 1);
            return Ok(exe);
        }
        // Replicas trace the same step at the same time: one compiles it while
        // the others wait here and then find it cached.
        let _compiling = self.inner.cache.compile_guard();
        if let Some(exe) = self.inner.cache.get(hash, &graph) {
            self.inner.metrics.update(|m| m.cache_hits += 1);
            return Ok(exe);
        }
        let site = location.to_string();
        let reason = self.inner.cache.explain_miss(&site, &graph);
        let start = Instant::now();
        let optimized = compile::optimize(&graph, compile::dump_dir_from_env().as_deref())?;
        let exe = self.inner.backend.compile(&optimized)?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let event = CompileEvent {
            site: site.clone(),
            hash: format!("{hash:016x}"),
            nodes: graph.nodes.len(),
            kernels: exe.stats().kernels,
            fused_kernels: exe.stats().fused_kernels,
            compile_ms,
            reason,
        };
        if self.inner.debug {
            eprintln!(
                "[lazytrain] compile {} at {}: {} nodes -> {} kernels ({} fused) in {:.2} ms ({})",
                event.hash, event.site, event.nodes, event.kernels, event.fused_kernels, event.compile_ms, event.reason
            );
        }
        self.inner.metrics.record_compile(event);
        self.inner.cache.insert(hash, Arc::new(graph), &site, exe.clone());
        Ok(exe)
    }
}

/// Mark the cells of a failed step as failed and hand the error back.
fn fail_cells(cells: &[Arc<TensorCell>], e: Error) -> Error {
    let message: Arc<str> = e.to_string().into();
    for cell in cells {
        *cell.lock_state() = TensorState::Failed(message.clone());
    }
    e
}

/// Keep only what the outputs need and renumber parameters in order of first
/// appearance, so which buffer is which never enters the hash. Returns the
/// graph and, for each new parameter number, the traced one. Nodes are moved,
/// not cloned: this runs on every sync.
pub(crate) fn canonicalize(traced: Graph) -> (Graph, Vec<usize>) {
    let mut live = vec![false; traced.nodes.len()];
    for out in &traced.outputs {
        live[out.index()] = true;
    }
    for i in (0..traced.nodes.len()).rev() {
        if live[i] {
            for input in &traced.nodes[i].inputs {
                live[input.index()] = true;
            }
        }
    }
    let mut map = vec![NodeId(u32::MAX); traced.nodes.len()];
    let mut nodes = Vec::with_capacity(live.iter().filter(|&&l| l).count());
    let mut order = Vec::new();
    for (i, mut node) in traced.nodes.into_iter().enumerate() {
        if !live[i] {
            continue;
        }
        for input in node.inputs.iter_mut() {
            *input = map[input.index()];
        }
        if let Op::Parameter(k) = node.op {
            order.push(k);
            node.op = Op::Parameter(order.len() - 1);
        }
        map[i] = NodeId(nodes.len() as u32);
        nodes.push(node);
    }
    let outputs = traced.outputs.iter().map(|o| map[o.index()]).collect();
    (Graph { nodes, outputs, num_params: order.len(), donated: vec![false; order.len()] }, order)
}
