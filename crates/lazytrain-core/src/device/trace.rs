//! Tracing state and the cut: the live graph of pending tensors, and the
//! canonical graph a `sync` cuts from it (only what the outputs need,
//! parameters numbered in order of first use).

use crate::compile::live_nodes;
use crate::dtype::DType;
use crate::error::Error;
use crate::ir::{Graph, GraphBuilder, Node, NodeId, Op};
use crate::storage::Buffer;
use rustc_hash::FxHashMap;
use std::any::Any;
use std::sync::{Arc, MutexGuard, Weak};

/// Where a lazy value is.
pub(crate) enum TensorState {
    /// A node of the device's live graph.
    Pending(NodeId),
    /// Computed, in a device buffer.
    Ready(Arc<Buffer>),
    /// The graph that should have computed it failed.
    Failed(Arc<str>),
}

impl TensorState {
    /// A second handle on the same state.
    pub(crate) fn duplicate(&self) -> TensorState {
        match self {
            TensorState::Pending(id) => TensorState::Pending(*id),
            TensorState::Ready(buffer) => TensorState::Ready(buffer.clone()),
            TensorState::Failed(message) => TensorState::Failed(message.clone()),
        }
    }
}

/// What the device sees of a traced value (a tensor's shared cell): its
/// dtype and state, which a sync moves from pending to ready or failed.
pub(crate) trait Traced: Send + Sync {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The value's state, locked.
    fn lock_state(&self) -> MutexGuard<'_, TensorState>;
    /// The value as `Any`, for the layer that knows its concrete type.
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// A cast node whose value a buffer already holds.
pub(crate) struct Provided {
    /// The cast node.
    pub(crate) id: NodeId,
    /// The buffer it casts: the node is replaced only while it still reads
    /// this buffer (a node id traced before another thread's sync would
    /// name a node of another graph).
    pub(crate) source: Arc<Buffer>,
    /// Its value.
    pub(crate) value: Arc<Buffer>,
}

/// The graph traced since the last sync.
#[derive(Default)]
pub(crate) struct LiveGraph {
    /// The traced nodes.
    pub(crate) builder: GraphBuilder,
    /// Device buffers read by the live graph, by parameter number.
    pub(super) params: Vec<Arc<Buffer>>,
    /// Parameter node of each buffer, by buffer address and whether it is
    /// read as a trainable leaf (a detached handle of a leaf's buffer reads
    /// it through a node of its own, so no gradient reaches the leaf).
    pub(super) param_nodes: FxHashMap<(usize, bool), NodeId>,
    /// Tensors created since the last sync; the live ones become outputs.
    pub(super) pending: Vec<Weak<dyn Traced>>,
    /// Trainable leaves read by the live graph, by their parameter node.
    pub(super) leaves: Vec<(NodeId, Weak<dyn Traced>)>,
    /// Pending-list length at which dead entries are pruned next.
    pub(super) prune_at: usize,
    /// Random streams handed out in this graph.
    pub(super) next_rng_stream: u64,
    /// Cast nodes whose values are already computed (a weight's kept
    /// narrow copy): the node, the buffer it casts and the one holding its
    /// value, which the sync reads in its place.
    pub(super) provided: Vec<Provided>,
}

impl LiveGraph {
    /// The node that reads `buffer`, as a trainable leaf or not (a new
    /// parameter on first use).
    pub(crate) fn param_node(
        &mut self,
        buffer: &Arc<Buffer>,
        trainable: bool,
        node: impl FnOnce(usize) -> Node,
    ) -> NodeId {
        let key = (Arc::as_ptr(buffer) as usize, trainable);
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
    pub(crate) fn record_leaf(&mut self, id: NodeId, cell: Weak<dyn Traced>) {
        if !self.leaves.iter().any(|(i, _)| *i == id) {
            self.leaves.push((id, cell));
        }
    }

    /// The trainable leaves the live graph reads, with their nodes.
    pub(crate) fn leaves(&self) -> Vec<(NodeId, Arc<dyn Traced>)> {
        self.leaves.iter().filter_map(|(id, w)| w.upgrade().map(|c| (*id, c))).collect()
    }

    /// The parameter node already reading `buffer` (as a trainable leaf or
    /// not), if the live graph uses it.
    pub(crate) fn existing_param_node(&self, buffer: &Arc<Buffer>, trainable: bool) -> Option<NodeId> {
        self.param_nodes.get(&(Arc::as_ptr(buffer) as usize, trainable)).copied()
    }

    /// Remember a pending tensor so the next sync materialises it. Dropped
    /// tensors are pruned whenever the list doubles, so the list stays
    /// proportional to the live tensors and the sync has little to free.
    pub(crate) fn register(&mut self, cell: Weak<dyn Traced>) {
        if self.pending.len() >= self.prune_at {
            self.pending.retain(|w| w.strong_count() > 0);
            self.prune_at = (self.pending.len() * 2).max(64);
        }
        self.pending.push(cell);
    }

    /// Read `value` instead of computing node `id`, the cast of the buffer
    /// `source` (see `tensor::narrow_copy`).
    pub(crate) fn provide(&mut self, id: NodeId, source: Arc<Buffer>, value: Arc<Buffer>) {
        self.provided.push(Provided { id, source, value });
    }

    /// A fresh random stream number for this graph.
    pub(crate) fn next_rng_stream(&mut self) -> u64 {
        self.next_rng_stream += 1;
        self.next_rng_stream - 1
    }
}

/// Mark the cells of a failed step as failed and hand the error back.
pub(super) fn fail_cells(cells: &[Arc<dyn Traced>], e: Error) -> Error {
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
    let live = live_nodes(&traced);
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
