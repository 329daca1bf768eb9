//! Moving float casts across movement ops so fewer bytes move: a narrowing
//! cast (f32 → bf16) goes before `reshape`/`permute`/`expand` (the movement
//! then copies half the bytes, and an `expand` casts the small tensor), a
//! widening cast (bf16 → f32) goes after them (the movement reads the
//! narrow data, and the cast lands next to the elementwise op that reads it,
//! where the fuser folds it into that kernel's loads). Casts commute with
//! movement exactly, so results do not change; and a narrow value widened
//! and narrowed back is the narrow value itself.

use crate::dtype::DType;
use crate::ir::{Graph, GraphBuilder, Node, NodeId, Op};

fn is_movement(op: &Op) -> bool {
    matches!(op, Op::Reshape | Op::Permute(_) | Op::Expand)
}

/// Bytes per element of a float dtype (0 for other dtypes: never reordered).
fn float_width(dtype: DType) -> usize {
    match dtype {
        DType::F64 => 8,
        DType::F32 => 4,
        DType::BF16 | DType::F16 => 2,
        _ => 0,
    }
}

/// Narrowing, widening or neither, for a cast from `from` to `to`.
fn narrows(from: DType, to: DType) -> Option<bool> {
    let (a, b) = (float_width(from), float_width(to));
    (a > 0 && b > 0 && a != b).then_some(b < a)
}

/// `cast(x)` to `dtype`, applied below every movement op on top of `x`.
fn cast_below_movement(builder: &mut GraphBuilder, x: NodeId, dtype: DType) -> NodeId {
    let node = builder.node(x).clone();
    if is_movement(&node.op) {
        let inner = cast_below_movement(builder, node.inputs[0], dtype);
        return builder.push(Node { op: node.op, inputs: vec![inner], shape: node.shape, dtype });
    }
    builder.push(Node { op: Op::Cast, inputs: vec![x], shape: node.shape, dtype })
}

/// The reordering pass (see the module docs).
pub fn reorder_casts(graph: &Graph) -> Graph {
    let mut builder = GraphBuilder::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let mut node = node.clone();
        for input in node.inputs.iter_mut() {
            *input = map[input.index()];
        }
        let id = match &node.op {
            Op::Cast => {
                let source = builder.node(node.inputs[0]);
                // A narrow value widened and narrowed back (autocast's bf16
                // copy of a value the model holds in f32, e.g. merged
                // attention heads) is the narrow value: widening is exact.
                let round_trip = source.op == Op::Cast
                    && builder.node(source.inputs[0]).dtype == node.dtype
                    && narrows(node.dtype, source.dtype) == Some(false);
                if round_trip {
                    source.inputs[0]
                } else if narrows(source.dtype, node.dtype) == Some(true) && is_movement(&source.op) {
                    cast_below_movement(&mut builder, node.inputs[0], node.dtype)
                } else {
                    builder.push(node)
                }
            }
            op if is_movement(op) => {
                let source = builder.node(node.inputs[0]).clone();
                let widening =
                    source.op == Op::Cast && narrows(builder.node(source.inputs[0]).dtype, source.dtype) == Some(false);
                if widening {
                    let narrow = builder.node(source.inputs[0]).dtype;
                    let shape = node.shape.clone();
                    let moved = builder.push(Node {
                        op: node.op,
                        inputs: source.inputs.clone(),
                        shape: shape.clone(),
                        dtype: narrow,
                    });
                    builder.push(Node { op: Op::Cast, inputs: vec![moved], shape, dtype: source.dtype })
                } else {
                    builder.push(node)
                }
            }
            _ => builder.push(node),
        };
        map.push(id);
    }
    let outputs = graph.outputs.iter().map(|o| map[o.index()]).collect();
    builder.finish_like(outputs, graph)
}

/// True for each node that is a narrowing cast read only by widening casts:
/// a value kept narrow on purpose until it is read back (an activation
/// saved for backward in bf16, see `Device::save_activations_as`).
pub(crate) fn narrow_copies(graph: &Graph) -> Vec<bool> {
    let n = graph.nodes.len();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            readers[input.index()].push(i);
        }
    }
    let widens = |i: usize| {
        let node = &graph.nodes[i];
        node.op == Op::Cast && narrows(graph.nodes[node.inputs[0].index()].dtype, node.dtype) == Some(false)
    };
    (0..n)
        .map(|i| {
            let node = &graph.nodes[i];
            node.op == Op::Cast
                && narrows(graph.nodes[node.inputs[0].index()].dtype, node.dtype) == Some(true)
                && !readers[i].is_empty()
                && readers[i].iter().all(|&r| widens(r))
        })
        .collect()
}

/// Schedule every narrow copy (see [`narrow_copies`]) right after the node
/// it copies, wherever it was traced (autodiff traces them in the backward
/// pass): the wide value can then die with its last other reader instead
/// of living until the copy is made.
pub fn schedule_narrow_copies(graph: &Graph) -> Graph {
    let copies = narrow_copies(graph);
    let mut copies_of: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if copies[i] {
            copies_of[node.inputs[0].index()].push(i);
        }
    }
    let mut builder = GraphBuilder::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if copies[i] {
            continue;
        }
        let mut node = node.clone();
        for input in node.inputs.iter_mut() {
            *input = map[input.index()].expect("inputs come first");
        }
        let id = builder.push(node);
        map[i] = Some(id);
        for &c in &copies_of[i] {
            let copy = &graph.nodes[c];
            map[c] = Some(builder.push(Node {
                op: Op::Cast,
                inputs: vec![id],
                shape: copy.shape.clone(),
                dtype: copy.dtype,
            }));
        }
    }
    let outputs = graph.outputs.iter().map(|o| map[o.index()].expect("every node is mapped")).collect();
    builder.finish_like(outputs, graph)
}
