//! Where small values are computed. Traced order puts a loss's bookkeeping
//! (label masks, counts, the loss sum) between the large kernels of the
//! forward and backward passes; moving it lets large kernels over the same
//! rows follow each other (a row chain, see [`crate::schedule::chain`]):
//! the log-softmax of the logits and its gradient.

use crate::ir::{Graph, GraphBuilder, NodeId, Op};

/// Values of at most this many elements are small: keeping one alive longer
/// costs no memory worth speaking of.
const SMALL: usize = 1 << 16;

/// Reorder `graph`: a small value read only by small values, which read only
/// small values (a loss and what only it needs), is computed at the end;
/// inputs and small constants come first, every other small value of small
/// values, inputs or matmul products as soon as its inputs are; large
/// values keep their order. Values do not change; a large value may die
/// sooner (its last small reader moved up), never later.
pub fn order_small_nodes(graph: &Graph) -> Graph {
    let n = graph.nodes.len();
    let small = |i: usize| graph.nodes[i].shape.numel() <= SMALL;
    // Inputs are there from the start; a large constant keeps its place
    // (where a kernel fills it, it would live longer).
    let fixed = |i: usize| matches!(graph.nodes[i].op, Op::Parameter(_) | Op::Constant(_));
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            readers[input.index()].push(i);
        }
    }
    // Values only the end needs: small, of small inputs, read only by such
    // values (decided back to front).
    let mut last = vec![false; n];
    for i in (0..n).rev() {
        let node = &graph.nodes[i];
        last[i] = small(i)
            && !fixed(i)
            && node.inputs.iter().all(|x| small(x.index()))
            && readers[i].iter().all(|&r| last[r]);
    }
    // A small value of a large one that a fused kernel computes (a row or
    // column sum) stays where it was traced: moved before that kernel's
    // other readers, it could no longer be summed inside it.
    let stored = |x: usize| small(x) || matches!(graph.nodes[x].op, Op::Parameter(_) | Op::Dot { .. });
    let early = |i: usize| small(i) && !fixed(i) && !last[i] && graph.nodes[i].inputs.iter().all(|x| stored(x.index()));
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    let mut waiting: Vec<usize> = graph.nodes.iter().map(|node| node.inputs.len()).collect();
    let place = |i: usize, order: &mut Vec<usize>, placed: &mut Vec<bool>, waiting: &mut Vec<usize>| {
        let mut ready = vec![i];
        while let Some(x) = ready.pop() {
            if placed[x] {
                continue;
            }
            placed[x] = true;
            order.push(x);
            // A small reader whose inputs are all placed now follows at once
            // (readers in traced order, so the result is deterministic; a
            // reader appears once per operand it reads `x` as).
            for &r in readers[x].iter().rev() {
                waiting[r] -= 1;
                if waiting[r] == 0 && early(r) {
                    ready.push(r);
                }
            }
        }
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let input = matches!(node.op, Op::Parameter(_)) || (fixed(i) && small(i));
        if input && !last[i] {
            place(i, &mut order, &mut placed, &mut waiting);
        }
    }
    for i in 0..n {
        if !last[i] && !placed[i] {
            place(i, &mut order, &mut placed, &mut waiting);
        }
    }
    order.extend((0..n).filter(|&i| last[i]));
    rebuilt_in_order(graph, &order)
}

/// `graph` rebuilt with its nodes in `order` (every node once, inputs
/// before their readers).
pub(super) fn rebuilt_in_order(graph: &Graph, order: &[usize]) -> Graph {
    let mut builder = GraphBuilder::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
    for &i in order {
        let mut node = graph.nodes[i].clone();
        for input in node.inputs.iter_mut() {
            *input = map[input.index()].expect("inputs come first");
        }
        map[i] = Some(builder.push(node));
    }
    let outputs = graph.outputs.iter().map(|o| map[o.index()].expect("every node is placed")).collect();
    builder.finish_like(outputs, graph)
}
