//! Vector-Jacobian products: for each primitive, the cotangents of its
//! inputs given the cotangent `g` of its output, emitted as lazy ops.

use crate::error::Result;
use crate::ir::{BinaryOp, Node, Op, ReduceOp, UnaryOp};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Input cotangents of `node` (one per input; `None` where an input takes no
/// gradient or `wanted` is false). `x` are the inputs, `y` the output.
pub(crate) fn vjp(node: &Node, x: &[Tensor], y: &Tensor, g: &Tensor, wanted: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let want = |k: usize| wanted.get(k).copied().unwrap_or(false);
    Ok(match &node.op {
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } | Op::RngUniform { .. } | Op::Compare(_) => {
            vec![None; x.len()]
        }
        Op::Unary(op) => vec![Some(unary(*op, &x[0], y, g)?)],
        Op::Cast => vec![if x[0].dtype().is_float() { Some(g.cast(x[0].dtype())?) } else { None }],
        Op::Binary(op) => binary(*op, &x[0], &x[1], y, g, want(0), want(1))?,
        Op::Select => {
            let zero = Tensor::zeros(Shape::scalar(), g.dtype(), g.device())?;
            vec![
                None,
                if want(1) { Some(Tensor::select(&x[0], g, &zero)?) } else { None },
                if want(2) { Some(Tensor::select(&x[0], &zero, g)?) } else { None },
            ]
        }
        Op::Reduce { op: ReduceOp::Sum, .. } => vec![Some(g.broadcast_to(x[0].shape())?)],
        Op::Reduce { op: ReduceOp::Max, axes } => {
            // Ties share the gradient evenly, as torch.amax does.
            let hits = x[0].eq(&y.broadcast_to(x[0].shape())?)?.cast(g.dtype())?;
            let signed: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let count = hits.sum(&signed, true)?;
            vec![Some(hits.mul(&g.div(&count)?)?)]
        }
        Op::Reshape => vec![Some(g.reshape(x[0].shape().clone())?)],
        Op::Permute(perm) => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(g.permute(&inverse)?)]
        }
        Op::Expand => {
            let axes: Vec<isize> = x[0]
                .dims()
                .iter()
                .zip(node.shape.dims())
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, _)| i as isize)
                .collect();
            vec![Some(if axes.is_empty() { g.clone() } else { g.sum(&axes, true)? })]
        }
        Op::Slice { starts } => {
            let high: Vec<usize> =
                x[0].dims().iter().zip(starts).zip(node.shape.dims()).map(|((d, s), n)| d - s - n).collect();
            vec![Some(g.pad(starts, &high, 0.0)?)]
        }
        Op::Concat { axis } => {
            let mut offset = 0;
            let mut grads = Vec::with_capacity(x.len());
            for (k, input) in x.iter().enumerate() {
                let len = input.dims()[*axis];
                grads.push(if want(k) { Some(g.narrow(*axis as isize, offset, len)?) } else { None });
                offset += len;
            }
            grads
        }
        Op::Pad { low, .. } => vec![Some(g.slice(low, x[0].dims())?)],
        Op::Gather { axis } => {
            let zeros = Tensor::zeros(x[0].shape().clone(), g.dtype(), g.device())?;
            vec![Some(zeros.scatter_add(*axis as isize, &x[1], g)?), None]
        }
        Op::ScatterAdd { axis } => vec![
            if want(0) { Some(g.clone()) } else { None },
            None,
            if want(2) { Some(g.gather(*axis as isize, &x[1])?) } else { None },
        ],
        Op::Dot { lhs_t, rhs_t } => {
            let (a, b) = (&x[0], &x[1]);
            // Logical C = A B with A = a or aᵀ, B = b or bᵀ.
            let ga = if !want(0) {
                None
            } else if *lhs_t {
                Some(b.matmul_transposed(g, *rhs_t, true)?)
            } else {
                Some(g.matmul_transposed(b, false, !*rhs_t)?)
            };
            let gb = if !want(1) {
                None
            } else if *rhs_t {
                Some(g.matmul_transposed(a, true, *lhs_t)?)
            } else {
                Some(a.matmul_transposed(g, !*lhs_t, false)?)
            };
            vec![ga, gb]
        }
        Op::AllReduce(op) => vec![Some(g.all_reduce(*op)?)],
        Op::StopGradient => vec![None],
    })
}

fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Exp => g.mul(y),
        UnaryOp::Log => g.div(x),
        UnaryOp::Sqrt => g.mul_scalar(0.5)?.div(y),
        UnaryOp::Rsqrt => g.mul(&y.div(x)?.mul_scalar(-0.5)?),
        UnaryOp::Tanh => g.mul(&y.square()?.neg()?.add_scalar(1.0)?),
        UnaryOp::Erf => {
            let d = x.square()?.neg()?.exp()?.mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?;
            g.mul(&d)
        }
        UnaryOp::Abs => {
            let zero = Tensor::zeros(Shape::scalar(), x.dtype(), x.device())?;
            let one = Tensor::ones(Shape::scalar(), x.dtype(), x.device())?;
            let sign = Tensor::select(&x.gt(&zero)?, &one, &Tensor::select(&x.lt(&zero)?, &one.neg()?, &zero)?)?;
            g.mul(&sign)
        }
        UnaryOp::Recip => g.mul(&y.square()?)?.neg(),
    }
}

fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
    g: &Tensor,
    want_a: bool,
    want_b: bool,
) -> Result<Vec<Option<Tensor>>> {
    let (ga, gb) = match op {
        BinaryOp::Add => (Some(g.clone()), Some(g.clone())),
        BinaryOp::Sub => (Some(g.clone()), if want_b { Some(g.neg()?) } else { None }),
        BinaryOp::Mul => (if want_a { Some(g.mul(b)?) } else { None }, if want_b { Some(g.mul(a)?) } else { None }),
        BinaryOp::Div => {
            (if want_a { Some(g.div(b)?) } else { None }, if want_b { Some(g.mul(y)?.div(b)?.neg()?) } else { None })
        }
        BinaryOp::Max | BinaryOp::Min => {
            // The winner takes the gradient; ties split it, as torch.maximum does.
            let wins = if op == BinaryOp::Max { a.gt(b)? } else { a.lt(b)? };
            let ties = a.eq(b)?;
            let half = g.mul_scalar(0.5)?;
            let zero = Tensor::zeros(Shape::scalar(), g.dtype(), g.device())?;
            let to_a = Tensor::select(&wins, g, &Tensor::select(&ties, &half, &zero)?)?;
            let to_b = if want_b { Some(g.sub(&to_a)?) } else { None };
            (Some(to_a), to_b)
        }
        BinaryOp::Pow => {
            // torch's masks: no gradient to the base where the exponent is 0
            // (b·a^(b-1) is 0·0^-1 = NaN at a = 0), nor to the exponent where
            // a = 0 and b >= 0 (y·log a is 0·-inf).
            let zero = Tensor::zeros(Shape::scalar(), g.dtype(), g.device())?;
            let to_a = || -> Result<Tensor> {
                let raw = g.mul(b)?.mul(&a.pow(&b.add_scalar(-1.0)?)?)?;
                Tensor::select(&b.eq_scalar(0.0)?, &zero, &raw)
            };
            let to_b = || -> Result<Tensor> {
                let raw = g.mul(y)?.mul(&a.log()?)?;
                let masked = Tensor::select(&b.ge_scalar(0.0)?, &zero, &raw)?;
                Tensor::select(&a.eq_scalar(0.0)?, &masked, &raw)
            };
            (want_a.then(to_a).transpose()?, want_b.then(to_b).transpose()?)
        }
    };
    Ok(vec![if want_a { ga } else { None }, if want_b { gb } else { None }])
}
