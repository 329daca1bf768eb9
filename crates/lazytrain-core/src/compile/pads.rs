//! Gradients of a split, joined instead of summed.
//!
//! A tensor read through slices that tile one of its axes (GPT-2's fused
//! query-key-value projection, split into its three heads' inputs) gets,
//! from autodiff, one zero-padded gradient per slice and their sum:
//! `pad(dq) + pad(dk) + pad(dv)`, each pad writing the whole tensor (two
//! thirds of it zeros) and each add reading two of them. Where the padded
//! windows sit side by side along one axis, the sum is their concatenation,
//! written once: `add(pad(a), pad(b))` becomes `pad(concat(a, b))`, whose
//! pad spans the two windows; the next add joins the third window the same
//! way, and a pad that is left with nothing to add is the concatenation
//! itself. The values are the same but for the sign of a zero (`-0 + 0` is
//! `+0`, the concatenation keeps `-0`), as with the `x + 0 = x` rule.

use crate::dtype::Literal;
use crate::ir::{BinaryOp, GraphBuilder, Node, NodeId, Op};

/// A zero pad's input, and the window it places that input in along the
/// one axis it pads (`None` when it pads none or several).
struct PaddedWindow {
    input: NodeId,
    axis: usize,
    /// Elements before and after the window along `axis`.
    low: usize,
    high: usize,
}

/// `id` as a zero pad along one axis.
fn padded_window(b: &GraphBuilder, id: NodeId) -> Option<PaddedWindow> {
    let Op::Pad { low, high, value } = &b.node(id).op else { return None };
    if !is_zero(*value) {
        return None;
    }
    let mut padded = (0..low.len()).filter(|&d| low[d] != 0 || high[d] != 0);
    let axis = padded.next()?;
    if padded.next().is_some() {
        return None;
    }
    Some(PaddedWindow { input: b.node(id).inputs[0], axis, low: low[axis], high: high[axis] })
}

fn is_zero(value: Literal) -> bool {
    value.as_f64() == 0.0
}

/// The parts a concatenation along `axis` of `id` joins: the inputs of a
/// concatenation along the same axis, or `id` itself.
fn parts(b: &GraphBuilder, id: NodeId, axis: usize) -> Vec<NodeId> {
    match &b.node(id).op {
        Op::Concat { axis: a } if *a == axis => b.node(id).inputs.clone(),
        _ => vec![id],
    }
}

/// `node` (an add of two zero pads whose windows lie side by side along one
/// axis) as the pad of their inputs' concatenation, or as the
/// concatenation itself when the two windows fill the axis; the
/// concatenation is pushed to `b`. `None` for any other node.
pub(super) fn joined_pads(b: &mut GraphBuilder, node: &Node) -> Option<Node> {
    if node.op != Op::Binary(BinaryOp::Add) || !node.dtype.is_float() {
        return None;
    }
    let (x, y) = (padded_window(b, node.inputs[0])?, padded_window(b, node.inputs[1])?);
    let same_type = |w: &PaddedWindow| b.node(w.input).dtype == node.dtype;
    if x.axis != y.axis || !same_type(&x) || !same_type(&y) {
        return None;
    }
    let axis = x.axis;
    let extent = node.shape.dims()[axis];
    let end = |w: &PaddedWindow| extent - w.high;
    let (first, second) = match () {
        () if end(&x) == y.low => (x, y),
        () if end(&y) == x.low => (y, x),
        () => return None,
    };
    let inputs: Vec<NodeId> = [parts(b, first.input, axis), parts(b, second.input, axis)].concat();
    let mut dims = b.node(first.input).shape.dims().to_vec();
    dims[axis] = end(&second) - first.low;
    let concat = Node { op: Op::Concat { axis }, inputs, shape: dims.into(), dtype: node.dtype };
    if first.low == 0 && second.high == 0 {
        return Some(concat);
    }
    let joined = b.push(concat);
    let rank = node.shape.dims().len();
    let (mut low, mut high) = (vec![0; rank], vec![0; rank]);
    low[axis] = first.low;
    high[axis] = second.high;
    let value = Literal::new(0.0, node.dtype);
    Some(Node { op: Op::Pad { low, high, value }, inputs: vec![joined], ..node.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::simplify_algebra;
    use crate::dtype::DType;
    use crate::interp;
    use crate::ir::Graph;
    use crate::storage::HostData;

    /// `x` of shape `[2, 3, 9]` split into three slices of its last axis,
    /// and the sum of the three slices padded back (the gradient autodiff
    /// writes for `x`), added in `order`.
    fn split_gradient(order: [usize; 3]) -> Graph {
        let mut b = GraphBuilder::new();
        let x = b.push(Node { op: Op::Parameter(0), inputs: vec![], shape: [2, 3, 9].into(), dtype: DType::F32 });
        let pads: Vec<NodeId> = (0..3)
            .map(|k| {
                let piece = b.push(Node {
                    op: Op::Slice { starts: vec![0, 0, 3 * k] },
                    inputs: vec![x],
                    shape: [2, 3, 3].into(),
                    dtype: DType::F32,
                });
                let doubled = b.push(Node {
                    op: Op::Binary(BinaryOp::Add),
                    inputs: vec![piece, piece],
                    shape: [2, 3, 3].into(),
                    dtype: DType::F32,
                });
                let value = Literal::new(0.0, DType::F32);
                let op = Op::Pad { low: vec![0, 0, 3 * k], high: vec![0, 0, 6 - 3 * k], value };
                b.push(Node { op, inputs: vec![doubled], shape: [2, 3, 9].into(), dtype: DType::F32 })
            })
            .collect();
        let add = |b: &mut GraphBuilder, l: NodeId, r: NodeId| {
            b.push(Node {
                op: Op::Binary(BinaryOp::Add),
                inputs: vec![l, r],
                shape: [2, 3, 9].into(),
                dtype: DType::F32,
            })
        };
        let partial = add(&mut b, pads[order[0]], pads[order[1]]);
        let sum = add(&mut b, partial, pads[order[2]]);
        b.finish(vec![sum], 1)
    }

    fn run(graph: &Graph, x: &[f32]) -> Vec<f32> {
        let outputs = interp::interpret(graph, &[&HostData::F32(x.to_vec())]).expect("the graph runs");
        match &outputs[0] {
            HostData::F32(v) => v.clone(),
            other => panic!("an f32 output, not {}", other.dtype()),
        }
    }

    #[test]
    fn padded_gradients_of_a_split_are_joined_into_one_concatenation() {
        let x: Vec<f32> = (0..54).map(|i| i as f32 * 0.25 - 3.0).collect();
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1]] {
            let graph = split_gradient(order);
            let simplified = simplify_algebra(&graph);
            let ops: Vec<&str> = simplified.nodes.iter().map(|n| n.op.name()).collect();
            let expected: Vec<f32> = x.iter().map(|v| v + v).collect();
            assert_eq!(run(&graph, &x), expected, "the unsimplified sum, order {order:?}");
            assert_eq!(run(&simplified, &x), expected, "the joined gradient, order {order:?}");
            let out = &simplified.nodes[simplified.outputs[0].index()];
            match order {
                // The first two windows side by side: one concatenation of three.
                [0, 1, 2] | [2, 1, 0] | [1, 0, 2] => {
                    assert_eq!(out.op, Op::Concat { axis: 2 }, "order {order:?}: {ops:?}");
                    assert_eq!(out.inputs.len(), 3);
                }
                // The first and third windows apart: the sum stays.
                _ => assert_eq!(out.op, Op::Binary(BinaryOp::Add), "order {order:?}: {ops:?}"),
            }
        }
    }

    #[test]
    fn pads_of_other_values_or_axes_are_added_as_before() {
        let mut b = GraphBuilder::new();
        let x = b.push(Node { op: Op::Parameter(0), inputs: vec![], shape: [2, 4].into(), dtype: DType::F32 });
        let pad = |b: &mut GraphBuilder, low: Vec<usize>, high: Vec<usize>, value: f64| {
            let value = Literal::new(value, DType::F32);
            b.push(Node { op: Op::Pad { low, high, value }, inputs: vec![x], shape: [4, 4].into(), dtype: DType::F32 })
        };
        let ones = pad(&mut b, vec![0, 0], vec![2, 0], 1.0);
        let zeros = pad(&mut b, vec![2, 0], vec![0, 0], 0.0);
        let add =
            Node { op: Op::Binary(BinaryOp::Add), inputs: vec![ones, zeros], shape: [4, 4].into(), dtype: DType::F32 };
        assert!(joined_pads(&mut b, &add).is_none(), "a pad of ones is no gradient window");
        let zeros_first = pad(&mut b, vec![0, 0], vec![2, 0], 0.0);
        let add = Node { inputs: vec![zeros_first, zeros], ..add };
        assert!(joined_pads(&mut b, &add).is_some(), "two zero windows side by side");
    }
}
