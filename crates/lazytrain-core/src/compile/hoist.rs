//! Where a matmul product's elementwise readers run. Traced order puts a
//! layer's weight gradient (`dW = gᵀ x`) between its input gradient
//! (`dx = g W`) and what reads `dx` (GELU's gradient, a layer norm's): the
//! reader's kernel then cannot run on each panel of `dx` while it is still
//! in cache (a matmul epilogue, see [`crate::schedule::epilogue`]), and
//! `dx` is written out and read back.

use crate::ir::{Graph, Op};
use std::collections::BTreeSet;

/// True for the ops moved with a product's readers: the elementwise ops,
/// reductions and views a fused kernel computes or folds into its loads.
fn moves_with_product(op: &Op) -> bool {
    match op {
        Op::Unary(_)
        | Op::Cast
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Permute(_)
        | Op::Expand => true,
        Op::Parameter(_)
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RngUniform { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Dot { .. }
        | Op::AllReduce(_)
        | Op::StopGradient => false,
    }
}

/// True for the nodes a product's readers may move ahead of: matmuls (a
/// weight gradient), and constants and views of them, which cost nothing.
fn overtakable(op: &Op) -> bool {
    matches!(op, Op::Dot { .. } | Op::Constant(_) | Op::Iota { .. } | Op::Reshape | Op::Permute(_) | Op::Expand)
}

/// True when every node of `range` not placed yet and not among `moved`
/// may be overtaken: a matmul, a constant or view, or a cast of the range's
/// matmuls (the f32 copy of a bf16 weight gradient traced between an input
/// gradient and its readers).
fn overtakes_only_matmuls(
    graph: &Graph,
    placed: &[bool],
    moved: &BTreeSet<usize>,
    range: std::ops::Range<usize>,
) -> bool {
    // The range's matmuls and the values computed from them there.
    let mut of_matmuls = BTreeSet::new();
    for k in range {
        if placed[k] || moved.contains(&k) {
            continue;
        }
        let node = &graph.nodes[k];
        let reads_matmuls = node.inputs.iter().any(|x| of_matmuls.contains(&x.index()));
        let reads_only_those = node
            .inputs
            .iter()
            .all(|x| placed[x.index()] || moved.contains(&x.index()) || of_matmuls.contains(&x.index()));
        let reader = node.op == Op::Cast && reads_matmuls && reads_only_those;
        if !overtakable(&node.op) && !reader {
            return false;
        }
        if matches!(node.op, Op::Dot { .. }) || reads_matmuls {
            of_matmuls.insert(k);
        }
    }
    true
}

/// The nodes not placed yet that node `c` needs computed first (its
/// inputs, theirs, ...), ascending, when all of them can move: elementwise
/// ops, reductions, views and constants (`None` otherwise).
fn inputs_to_move(graph: &Graph, placed: &[bool], c: usize) -> Option<BTreeSet<usize>> {
    let mut needed = BTreeSet::new();
    let mut pending = vec![c];
    while let Some(v) = pending.pop() {
        for x in graph.nodes[v].inputs.iter().map(|x| x.index()) {
            if placed[x] || !needed.insert(x) {
                continue;
            }
            let op = &graph.nodes[x].op;
            if !moves_with_product(op) && !matches!(op, Op::Constant(_) | Op::Iota { .. }) {
                return None;
            }
            pending.push(x);
        }
    }
    Some(needed)
}

/// Reorder `graph`: right after each matmul product come the nodes that
/// read it, or read such nodes, through elementwise ops, reductions and
/// views, as soon as all their inputs are computed (in traced order among
/// themselves, constants they need first), when they move ahead of nothing
/// but other matmuls (and casts of those: a bf16 weight gradient's f32
/// copy); every other node keeps its order. Values do not change.
pub fn hoist_product_readers(graph: &Graph) -> Graph {
    let n = graph.nodes.len();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            readers[input.index()].push(i);
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    for i in 0..n {
        if placed[i] {
            continue;
        }
        placed[i] = true;
        order.push(i);
        if !matches!(graph.nodes[i].op, Op::Dot { .. }) {
            continue;
        }
        // Inputs come before their readers, so candidates taken in
        // ascending order see every input that can still be placed.
        let mut candidates: BTreeSet<usize> = readers[i].iter().copied().collect();
        while let Some(c) = candidates.pop_first() {
            if placed[c] || !moves_with_product(&graph.nodes[c].op) {
                continue;
            }
            let Some(inputs) = inputs_to_move(graph, &placed, c) else { continue };
            // Only matmuls (and constants and views) are overtaken, and
            // what reads nothing but them (a bf16 weight gradient's f32
            // copy): anything else keeps its place relative to the readers,
            // which must not, say, start computing backward-pass values in
            // the forward pass and keep them alive in between.
            if !overtakes_only_matmuls(graph, &placed, &inputs, i + 1..c) {
                continue;
            }
            for x in inputs.into_iter().chain([c]) {
                placed[x] = true;
                order.push(x);
            }
            candidates.extend(&readers[c]);
        }
    }
    super::order::rebuilt_in_order(graph, &order)
}
