//! Nodes, the hash-consing builder and finished graphs.

use super::op::Op;
use crate::dtype::DType;
use crate::shape::Shape;
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};

/// Index of a node in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The index as `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One IR node: op with attributes, input ids, output shape and dtype.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The primitive and its attributes.
    pub op: Op,
    /// Input node ids, all smaller than this node's id.
    pub inputs: Vec<NodeId>,
    /// The output shape.
    pub shape: Shape,
    /// The output element type.
    pub dtype: DType,
}

/// Builds a graph node by node, returning the existing id for a node that is
/// already present (hash-consing, which is also common-subexpression elimination).
///
/// The index maps a node's hash to its id, so pushing clones nothing; the
/// rare hash collisions between different nodes go to a side table.
#[derive(Default, Debug)]
pub struct GraphBuilder {
    nodes: Vec<Node>,
    index: FxHashMap<u64, NodeId>,
    collisions: FxHashMap<u64, Vec<NodeId>>,
}

fn node_hash(node: &Node) -> u64 {
    let mut hasher = FxHasher::default();
    node.hash(&mut hasher);
    hasher.finish()
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// Add `node` (or find its twin) and return its id.
    pub fn push(&mut self, node: Node) -> NodeId {
        let hash = node_hash(&node);
        let id = NodeId(self.nodes.len() as u32);
        match self.index.get(&hash) {
            None => {
                self.index.insert(hash, id);
            }
            Some(&existing) if self.nodes[existing.index()] == node => return existing,
            Some(_) => {
                let chain = self.collisions.entry(hash).or_default();
                if let Some(&twin) = chain.iter().find(|c| self.nodes[c.index()] == node) {
                    return twin;
                }
                chain.push(id);
            }
        }
        self.nodes.push(node);
        id
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// How many distinct nodes have been added.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no node has been added.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Finish with the given outputs and parameter count.
    pub fn finish(self, outputs: Vec<NodeId>, num_params: usize) -> Graph {
        Graph { nodes: self.nodes, outputs, num_params, donated: vec![false; num_params] }
    }

    /// Finish with the given outputs and the parameters (count and donation)
    /// of `like`: what a pass that rebuilds `like` wants.
    pub fn finish_like(self, outputs: Vec<NodeId>, like: &Graph) -> Graph {
        Graph { nodes: self.nodes, outputs, num_params: like.num_params, donated: like.donated.clone() }
    }
}

/// A finished graph: what gets hashed, optimised, compiled and cached.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Graph {
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    /// The values the executable returns, in order (may repeat).
    pub outputs: Vec<NodeId>,
    /// How many input buffers the graph takes (`Parameter(0..num_params)`).
    pub num_params: usize,
    /// For each parameter, whether its buffer is donated: nothing outside
    /// the executable holds it, so the executable may overwrite it.
    pub donated: Vec<bool>,
}

impl Graph {
    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The structural hash: ops, attributes, shapes, dtypes, wiring,
    /// constants by value, the outputs and which inputs are donated. Never data.
    pub fn structural_hash(&self) -> u64 {
        let mut hasher = FxHasher::default();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// The hash of what the graph computes: [`Graph::structural_hash`]
    /// without donation (which buffers a replica still holds elsewhere does
    /// not change what its step computes). Replicas compare it.
    pub fn computation_hash(&self) -> u64 {
        let mut hasher = FxHasher::default();
        (&self.nodes, &self.outputs, self.num_params).hash(&mut hasher);
        hasher.finish()
    }

    /// The `(shape, dtype)` of each parameter, in parameter order (a
    /// parameter the graph no longer uses is `None`).
    pub fn param_signature(&self) -> Vec<Option<(Shape, DType)>> {
        let mut sig = vec![None; self.num_params];
        for node in &self.nodes {
            if let Op::Parameter(k) = node.op {
                sig[k] = Some((node.shape.clone(), node.dtype));
            }
        }
        sig
    }

    /// For each node, the index of the last node that reads it
    /// (`usize::MAX` for graph outputs, which stay alive to the end).
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last = vec![0usize; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            last[i] = i;
            for input in &node.inputs {
                last[input.index()] = i;
            }
        }
        for out in &self.outputs {
            last[out.index()] = usize::MAX;
        }
        last
    }
}
