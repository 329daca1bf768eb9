//! Devices own the live graph of pending tensors and cut it at `sync`.
//!
//! Tracing appends hash-consed nodes to the device's live graph. `sync`
//! (alias `mark_step`) turns every live pending tensor into a graph output,
//! numbers the device-resident inputs as parameters in order of first use,
//! hashes the result, looks it up in the compile cache (compiling on a miss)
//! and runs it; the tensors then hold their buffers.

use crate::backend::{Backend, CpuBackend};
use crate::cache::CompileCache;
use crate::compile;
use crate::error::Result;
use crate::ir::{Graph, GraphBuilder, Node, NodeId, Op};
use crate::metrics::{CompileEvent, Metrics, MetricsReport};
use crate::storage::Buffer;
use crate::tensor::{TensorCell, TensorState};
use rustc_hash::FxHashMap;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
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

pub(crate) struct DeviceInner {
    id: usize,
    ordinal: usize,
    backend: Arc<dyn Backend>,
    cache: Arc<CompileCache>,
    metrics: Metrics,
    live: Mutex<LiveGraph>,
    debug: bool,
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
    /// A new CPU device with its own compile cache and metrics.
    pub fn cpu() -> Device {
        Device::with_backend(Arc::new(CpuBackend::default()), Arc::new(CompileCache::new()), 0)
    }

    /// A device on `backend` sharing `cache` (replicas share one), with replica `ordinal`.
    pub fn with_backend(backend: Arc<dyn Backend>, cache: Arc<CompileCache>, ordinal: usize) -> Device {
        let debug = std::env::var("LAZYTRAIN_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0");
        Device {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                ordinal,
                backend,
                cache,
                metrics: Metrics::default(),
                live: Mutex::new(LiveGraph::default()),
                debug,
            }),
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
        let outcome = self.executable_for(graph, location, cut_start).and_then(|exe| {
            let start = Instant::now();
            let results = exe.run(inputs)?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let peak = exe.stats().peak_bytes as u64;
            self.inner.metrics.update(|m| {
                m.executions += 1;
                m.execute_ms += ms;
                m.peak_execution_bytes = m.peak_execution_bytes.max(peak);
            });
            Ok(results)
        });
        let results = match outcome {
            Ok(results) => results,
            Err(e) => {
                let message: Arc<str> = e.to_string().into();
                for cell in &cells {
                    *cell.lock_state() = TensorState::Failed(message.clone());
                }
                return Err(e);
            }
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
    ) -> Result<Arc<dyn crate::backend::Executable>> {
        let hash = graph.structural_hash();
        let cached = self.inner.cache.get(hash, &graph);
        let lookup_ms = cut_start.elapsed().as_secs_f64() * 1e3;
        self.inner.metrics.update(|m| m.lookup_ms += lookup_ms);
        if let Some(exe) = cached {
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
