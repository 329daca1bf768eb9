//! Graph-building helpers the engine tests share: f32 parameters and
//! constants, and nodes whose shape and dtype follow from their inputs.

use lazytrain_core::ir::{infer, GraphBuilder, Node, NodeId, Op};
use lazytrain_core::{DType, Literal, Shape};

/// f32 parameter `k` of shape `dims`.
pub fn param(b: &mut GraphBuilder, k: usize, dims: &[usize]) -> NodeId {
    b.push(Node { op: Op::Parameter(k), inputs: vec![], shape: Shape::new(dims), dtype: DType::F32 })
}

/// The f32 constant `v` over `dims`.
pub fn constant(b: &mut GraphBuilder, v: f64, dims: &[usize]) -> NodeId {
    b.push(Node {
        op: Op::Constant(Literal::new(v, DType::F32)),
        inputs: vec![],
        shape: Shape::new(dims),
        dtype: DType::F32,
    })
}

/// `op` of `inputs`, its shape and dtype by the shape rules.
pub fn node(b: &mut GraphBuilder, op: Op, inputs: Vec<NodeId>) -> NodeId {
    let (shape, dtype) = {
        let metas: Vec<_> = inputs.iter().map(|i| (&b.node(*i).shape, b.node(*i).dtype)).collect();
        derive(&op, &metas).expect("valid node")
    };
    b.push(Node { op, inputs, shape, dtype })
}

/// The shape rule of `op` for ops whose output shape follows from the inputs.
pub fn derive(op: &Op, m: &[infer::Meta]) -> Result<(Shape, DType), lazytrain_core::RuleError> {
    match op {
        Op::Unary(u) => infer::unary(*u, m[0]),
        Op::Binary(o) => infer::binary(*o, m[0], m[1]),
        Op::Compare(c) => infer::compare(*c, m[0], m[1]),
        Op::Select => infer::select(m[0], m[1], m[2]),
        Op::Reduce { axes, .. } => infer::reduce(m[0], axes),
        Op::Permute(p) => infer::permute(m[0], p),
        Op::Concat { axis } => infer::concat(m, *axis),
        Op::Pad { low, high, .. } => infer::pad(m[0], low, high),
        Op::Dot { lhs_t, rhs_t } => infer::dot(m[0], m[1], *lhs_t, *rhs_t),
        other => panic!("derive: {other:?} needs an explicit shape"),
    }
}
