//! The simplifying passes: dead-code elimination, constant folding and
//! algebraic identities.

use super::rewrite::{rebuild, Rewrite};
use crate::dtype::{DType, Literal};
use crate::ir::{BinaryOp, Graph, GraphBuilder, Node, NodeId, Op, ReduceOp, UnaryOp};
use crate::kernels::{self, MatmulKernel};
use crate::storage::HostData;
use crate::Shape;

/// Which nodes an output depends on (the liveness sweep of dead-code
/// elimination, shared with the cut at `sync`).
pub fn live_nodes(graph: &Graph) -> Vec<bool> {
    let mut live = vec![false; graph.nodes.len()];
    for out in &graph.outputs {
        live[out.index()] = true;
    }
    for i in (0..graph.nodes.len()).rev() {
        if live[i] {
            for input in &graph.nodes[i].inputs {
                live[input.index()] = true;
            }
        }
    }
    live
}

/// Drop nodes no output depends on (parameters keep their numbers).
pub fn dead_code_elimination(graph: &Graph) -> Graph {
    let live = live_nodes(graph);
    let mut builder = GraphBuilder::new();
    let mut map = vec![NodeId(u32::MAX); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if live[i] {
            let mut n = node.clone();
            for input in n.inputs.iter_mut() {
                *input = map[input.index()];
            }
            map[i] = builder.push(n);
        }
    }
    let outputs = graph.outputs.iter().map(|o| map[o.index()]).collect();
    builder.finish_like(outputs, graph)
}

fn constant(builder: &GraphBuilder, id: NodeId) -> Option<Literal> {
    match builder.node(id).op {
        Op::Constant(v) => Some(v),
        _ => None,
    }
}

/// Evaluate a single element of an elementwise op whose inputs are constants.
fn fold_elementwise(node: &Node, values: &[Literal], input_dtypes: &[crate::dtype::DType]) -> Option<Literal> {
    let inputs: Vec<HostData> = values
        .iter()
        .zip(input_dtypes)
        .map(|(v, &dt)| {
            let mut d = HostData::zeros(dt, 1);
            kernels::numeric::fill_literal(&mut d, *v);
            d
        })
        .collect();
    let refs: Vec<&HostData> = inputs.iter().collect();
    let shapes: Vec<&[usize]> = vec![&[]; inputs.len()];
    let scalar = Node { shape: crate::shape::Shape::scalar(), ..node.clone() };
    let mut out = HostData::zeros(node.dtype, 1);
    kernels::eval(&scalar, &refs, &shapes, &mut out, MatmulKernel::Naive).ok()?;
    // Integers are read as integers: through f64 they would lose bits above 2^53.
    Some(match out {
        HostData::I64(v) => Literal::Int(v[0]),
        HostData::I32(v) => Literal::Int(v[0].into()),
        HostData::U8(v) => Literal::Int(v[0].into()),
        HostData::Bool(v) => Literal::Int(v[0].into()),
        float => Literal::Float(float.get_f64(0).to_bits()),
    })
}

/// The value of a reduction over no elements: 0 for a sum, the dtype's
/// lowest value (-inf for floats) for a max.
fn empty_reduction(op: ReduceOp, dtype: DType) -> Literal {
    match (op, dtype) {
        (ReduceOp::Sum, d) if d.is_float() => Literal::Float(0f64.to_bits()),
        (ReduceOp::Sum, _) => Literal::Int(0),
        (ReduceOp::Max, d) if d.is_float() => Literal::Float(f64::NEG_INFINITY.to_bits()),
        (ReduceOp::Max, DType::I64) => Literal::Int(i64::MIN),
        (ReduceOp::Max, DType::I32) => Literal::Int(i32::MIN.into()),
        (ReduceOp::Max, _) => Literal::Int(0),
    }
}

/// Replace ops whose inputs are all splat constants by a splat constant:
/// elementwise math, and movement ops that keep every element equal; and
/// reductions over no elements by their identity (kernels never see them).
pub fn fold_constants(graph: &Graph) -> Graph {
    rebuild(graph, |b, node| {
        let values: Option<Vec<Literal>> = node.inputs.iter().map(|&i| constant(b, i)).collect();
        let folded = match (&node.op, values) {
            (Op::Reduce { op, .. }, _) if b.node(node.inputs[0]).shape.numel() == 0 => {
                Some(empty_reduction(*op, node.dtype))
            }
            (_, None) => None,
            (op, Some(values)) => match op {
                Op::Unary(_) | Op::Cast | Op::Binary(_) | Op::Compare(_) | Op::Select => {
                    let dtypes: Vec<_> = node.inputs.iter().map(|&i| b.node(i).dtype).collect();
                    fold_elementwise(&node, &values, &dtypes)
                }
                // Every element of a constant is the same value.
                Op::Reshape | Op::Permute(_) | Op::Expand | Op::Slice { .. } => Some(values[0]),
                // Not folded: leaves, values that differ per element or per
                // replica, and ops whose result is not one repeated value.
                Op::Parameter(_)
                | Op::Constant(_)
                | Op::Iota { .. }
                | Op::RngUniform { .. }
                | Op::Reduce { .. }
                | Op::Concat { .. }
                | Op::Pad { .. }
                | Op::Gather { .. }
                | Op::ScatterAdd { .. }
                | Op::Dot { .. }
                | Op::AllReduce(_)
                | Op::StopGradient => None,
            },
        };
        match folded {
            Some(v) => {
                Rewrite::Emit(Node { op: Op::Constant(v), inputs: Vec::new(), shape: node.shape, dtype: node.dtype })
            }
            None => Rewrite::Emit(node),
        }
    })
}

fn is_splat(b: &GraphBuilder, id: NodeId, value: f64) -> bool {
    constant(b, id).is_some_and(|v| v.as_f64() == value)
}

/// The axis of `id` when it is a scatter-add into zeros.
fn zero_scatter(b: &GraphBuilder, id: NodeId) -> Option<usize> {
    match b.node(id).op {
        Op::ScatterAdd { axis } if is_splat(b, b.node(id).inputs[0], 0.0) => Some(axis),
        _ => None,
    }
}

/// Algebraic identities: `x+0`, `x-0`, `x*1`, `x/1`, `--x`,
/// `scatter_add(0, i, u) + y = scatter_add(y, i, u)`, zero pads of windows
/// side by side added as one concatenation (see `pads`), and movement ops
/// that do nothing (same shape, identity permutation, full slice, zero pad)
/// or that compose (reshape of reshape, permute of permute).
pub fn simplify_algebra(graph: &Graph) -> Graph {
    rebuild(graph, |b, node| {
        if let Some(product) = reciprocal_product(b, &node) {
            return Rewrite::Emit(product);
        }
        if let Some(joined) = super::pads::joined_pads(b, &node) {
            return Rewrite::Emit(joined);
        }
        let b = &*b;
        let input = |k: usize| node.inputs[k];
        let in_node = |k: usize| b.node(node.inputs[k]);
        match &node.op {
            Op::Binary(BinaryOp::Add) if is_splat(b, input(1), 0.0) => Rewrite::Forward(input(0)),
            // scatter_add(0, i, u) + y = scatter_add(y, i, u): no dense zeros, one pass fewer.
            Op::Binary(BinaryOp::Add) if zero_scatter(b, input(0)).is_some() || zero_scatter(b, input(1)).is_some() => {
                let (scatter, other) =
                    if zero_scatter(b, input(0)).is_some() { (input(0), input(1)) } else { (input(1), input(0)) };
                let s = b.node(scatter).clone();
                Rewrite::Emit(Node { op: s.op, inputs: vec![other, s.inputs[1], s.inputs[2]], ..node })
            }
            Op::Binary(BinaryOp::Add) if is_splat(b, input(0), 0.0) => Rewrite::Forward(input(1)),
            Op::Binary(BinaryOp::Sub) if is_splat(b, input(1), 0.0) => Rewrite::Forward(input(0)),
            Op::Binary(BinaryOp::Mul) if is_splat(b, input(1), 1.0) => Rewrite::Forward(input(0)),
            Op::Binary(BinaryOp::Mul) if is_splat(b, input(0), 1.0) => Rewrite::Forward(input(1)),
            Op::Binary(BinaryOp::Div) if is_splat(b, input(1), 1.0) => Rewrite::Forward(input(0)),
            Op::Unary(UnaryOp::Neg) if in_node(0).op == Op::Unary(UnaryOp::Neg) => {
                Rewrite::Forward(in_node(0).inputs[0])
            }
            Op::Cast | Op::Reshape | Op::Expand if in_node(0).shape == node.shape && in_node(0).dtype == node.dtype => {
                Rewrite::Forward(input(0))
            }
            Op::Reshape if in_node(0).op == Op::Reshape => {
                let source = in_node(0).inputs[0];
                if b.node(source).shape == node.shape {
                    Rewrite::Forward(source)
                } else {
                    Rewrite::Emit(Node { inputs: vec![source], ..node })
                }
            }
            Op::Permute(perm) if perm.iter().enumerate().all(|(i, &p)| i == p) => Rewrite::Forward(input(0)),
            Op::Permute(outer) => match &in_node(0).op {
                Op::Permute(inner) => {
                    let composed: Vec<usize> = outer.iter().map(|&p| inner[p]).collect();
                    let source = in_node(0).inputs[0];
                    if composed.iter().enumerate().all(|(i, &p)| i == p) {
                        Rewrite::Forward(source)
                    } else {
                        Rewrite::Emit(Node { op: Op::Permute(composed), inputs: vec![source], ..node })
                    }
                }
                _ => Rewrite::Emit(node),
            },
            Op::Slice { starts } if starts.iter().all(|&s| s == 0) && in_node(0).shape == node.shape => {
                Rewrite::Forward(input(0))
            }
            Op::Pad { low, high, .. } if low.iter().chain(high).all(|&w| w == 0) => Rewrite::Forward(input(0)),
            Op::Concat { .. } if node.inputs.len() == 1 => Rewrite::Forward(input(0)),
            Op::StopGradient => Rewrite::Forward(input(0)),
            _ => Rewrite::Emit(node),
        }
    })
}

/// `x / expand(s)` as `x * expand(1 / s)` for a float `s` broadcast to a
/// larger shape (a softmax's row sums): one division per broadcast value
/// instead of one per element (a vector division costs about ten
/// multiplications), as PyTorch's softmax kernels do. The reciprocal is
/// pushed to `b`; returns the product to emit in `node`'s place.
fn reciprocal_product(b: &mut GraphBuilder, node: &Node) -> Option<Node> {
    let Op::Binary(BinaryOp::Div) = node.op else { return None };
    let divisor = b.node(node.inputs[1]).clone();
    if divisor.op != Op::Expand || !node.dtype.is_float() {
        return None;
    }
    let small = divisor.inputs[0];
    let small_node = b.node(small).clone();
    if small_node.shape.numel() >= divisor.shape.numel() {
        return None;
    }
    let reciprocal = b.push(Node { op: Op::Unary(UnaryOp::Recip), inputs: vec![small], ..small_node });
    let expanded = b.push(Node { inputs: vec![reciprocal], ..divisor });
    Some(Node { op: Op::Binary(BinaryOp::Mul), inputs: vec![node.inputs[0], expanded], ..node.clone() })
}

/// Column sums of a scatter-add's result split in two:
/// `sum(scatter_add(m, i, u), axis 0) = scatter_add(sum(m, axis 0), i', u')`
/// for a rank-2 `m` scattered along axis 1, with `i'` and `u'` the index
/// and updates laid out as one row. The sum of `m` then runs in the kernel
/// that computes `m` (the bias gradient of a vocabulary projection is summed
/// while the cross-entropy's softmax gradient is written, before the labels'
/// updates are scattered into it) instead of reading the scattered result
/// back in a pass of its own; the scatter keeps its other readers. The
/// updates are added after the column's other values instead of among them
/// (a different rounding of the same sum).
pub fn split_scatter_sums(graph: &Graph) -> Graph {
    rebuild(graph, |b, node| {
        let Op::Reduce { op: ReduceOp::Sum, axes } = &node.op else { return Rewrite::Emit(node) };
        let scatter = b.node(node.inputs[0]).clone();
        let splits = axes == &[0]
            && scatter.op == (Op::ScatterAdd { axis: 1 })
            && scatter.shape.rank() == 2
            && scatter.dtype.is_float();
        if !splits {
            return Rewrite::Emit(node);
        }
        let [base, index, updates] = scatter.inputs[..] else { return Rewrite::Emit(node) };
        let count = b.node(index).shape.numel();
        let row = |b: &mut GraphBuilder, id: NodeId| {
            let source = b.node(id);
            let reshaped = Node { op: Op::Reshape, inputs: vec![id], shape: [1, count].into(), dtype: source.dtype };
            b.push(reshaped)
        };
        let (index, updates) = (row(b, index), row(b, updates));
        let sums = b.push(Node { inputs: vec![base], ..node.clone() });
        Rewrite::Emit(Node { op: Op::ScatterAdd { axis: 1 }, inputs: vec![sums, index, updates], ..node })
    })
}

/// A gather of a few elements of a large sum (or other elementwise binary
/// op) of a matmul product and a row vector broadcast over its rows, along
/// the rows (the label logits of `logits + bias`), picks from the product
/// and the vector instead: `gather(p + expand(b), i) = gather(p, i) +
/// b[i]`, the same values. The sum is then read only by fused kernels,
/// which recompute it from the product instead of storing it (the dense
/// masked-LM head's `[tokens, vocab]` biased logits: one write and one read
/// of the logits fewer a step).
pub fn gather_from_operands(graph: &Graph) -> Graph {
    rebuild(graph, |b, node| {
        let Op::Gather { axis: 1 } = node.op else { return Rewrite::Emit(node) };
        let (data, index) = (b.node(node.inputs[0]).clone(), node.inputs[1]);
        let Op::Binary(op) = data.op else { return Rewrite::Emit(node) };
        let dims = data.shape.dims().to_vec();
        if dims.len() != 2 || node.shape.numel().saturating_mul(2) > data.shape.numel() {
            return Rewrite::Emit(node);
        }
        // Each operand: a product (which has a buffer anyway) or a row
        // vector broadcast over the rows, as its `[columns]` vector.
        let picks: Vec<Result<NodeId, NodeId>> = data
            .inputs
            .iter()
            .filter_map(|&x| {
                let operand = b.node(x);
                match operand.op {
                    Op::Dot { .. } if operand.shape == data.shape => Some(Ok(x)),
                    Op::Expand if b.node(operand.inputs[0]).shape.dims() == [1, dims[1]] => {
                        Some(Err(operand.inputs[0]))
                    }
                    _ => None,
                }
            })
            .collect();
        if picks.len() != 2 || !picks.iter().any(Result::is_ok) {
            return Rewrite::Emit(node);
        }
        let picked: Vec<NodeId> = picks
            .into_iter()
            .map(|pick| match pick {
                Ok(product) => {
                    let dtype = b.node(product).dtype;
                    b.push(Node { inputs: vec![product, index], dtype, ..node.clone() })
                }
                Err(row) => {
                    let (dtype, index_dtype) = (b.node(row).dtype, b.node(index).dtype);
                    let flat = |n: usize| Shape::new([n]);
                    let vector = b.push(Node { op: Op::Reshape, inputs: vec![row], shape: flat(dims[1]), dtype });
                    let count = node.shape.numel();
                    let indices =
                        b.push(Node { op: Op::Reshape, inputs: vec![index], shape: flat(count), dtype: index_dtype });
                    let values = b.push(Node {
                        op: Op::Gather { axis: 0 },
                        inputs: vec![vector, indices],
                        shape: flat(count),
                        dtype,
                    });
                    b.push(Node { op: Op::Reshape, inputs: vec![values], dtype, ..node.clone() })
                }
            })
            .collect();
        Rewrite::Emit(Node { op: Op::Binary(op), inputs: picked, ..node })
    })
}

/// Gathers and scatter-adds whose index is one constant `c` everywhere (the
/// token-type embedding of inputs without token types) as movement and a
/// sum: `gather(x, c)` reads row `c` of `x` broadcast (a view, no kernel),
/// and `scatter_add(base, c, u)` adds the sum of `u` along the axis into
/// row `c` of `base` (a column sum its producer's kernel computes, instead
/// of one scattered add per element). An index outside the axis is left to
/// the kernel, which reports it.
pub fn fold_constant_indices(graph: &Graph) -> Graph {
    rebuild(graph, |b, node| {
        let (Op::Gather { axis } | Op::ScatterAdd { axis }) = node.op else { return Rewrite::Emit(node) };
        let Some(c) = constant(b, node.inputs[1]) else { return Rewrite::Emit(node) };
        let data = b.node(node.inputs[0]).clone();
        let Some(c) = usize::try_from(c.as_i64()).ok().filter(|&c| c < data.shape.dims()[axis]) else {
            return Rewrite::Emit(node);
        };
        let mut row = b.node(node.inputs[1]).shape.dims().to_vec();
        row[axis] = 1;
        // Where row `c` starts: `c` along the axis, 0 along the others.
        let corner: Vec<usize> = (0..row.len()).map(|d| if d == axis { c } else { 0 }).collect();
        match node.op {
            Op::Gather { .. } => {
                let starts = corner;
                let picked =
                    b.push(Node { op: Op::Slice { starts }, inputs: vec![node.inputs[0]], shape: row.into(), ..node });
                Rewrite::Emit(Node { op: Op::Expand, inputs: vec![picked], ..node })
            }
            _ => {
                let updates = node.inputs[2];
                let sums = b.push(Node {
                    op: Op::Reduce { op: ReduceOp::Sum, axes: vec![axis] },
                    inputs: vec![updates],
                    shape: row.clone().into(),
                    ..node.clone()
                });
                let high = data.shape.dims().iter().zip(&row).zip(&corner).map(|((&d, &r), &l)| d - r - l).collect();
                let low = corner;
                let value = Literal::new(0.0, node.dtype);
                let placed = Node { op: Op::Pad { low, high, value }, inputs: vec![sums], ..node.clone() };
                if is_splat(b, node.inputs[0], 0.0) {
                    return Rewrite::Emit(placed);
                }
                let placed = b.push(placed);
                Rewrite::Emit(Node { op: Op::Binary(BinaryOp::Add), inputs: vec![node.inputs[0], placed], ..node })
            }
        }
    })
}
