//! Elementwise ops with NumPy broadcasting.

use super::{rule, trace, Tensor};
use crate::device::trace::TensorState;
use crate::dtype::DType;
use crate::error::{Result, RuleError, RuleKind};
use crate::ir::{infer, BinaryOp, CmpOp, Op, UnaryOp};
use crate::shape::Shape;
use std::panic::Location;

/// The NumPy broadcast of two shapes.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, RuleError> {
    let rank = a.rank().max(b.rank());
    let mut dims = vec![0; rank];
    for (i, d) in dims.iter_mut().enumerate() {
        let da = if i + a.rank() >= rank { a.dims()[i + a.rank() - rank] } else { 1 };
        let db = if i + b.rank() >= rank { b.dims()[i + b.rank() - rank] } else { 1 };
        *d = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(RuleError::new(RuleKind::Shape, format!("shapes {a} and {b} cannot be broadcast together")))
            }
        };
    }
    Ok(Shape::new(dims))
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => Neg;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// The error function.
    erf => Erf;
    /// `|x|`.
    abs => Abs;
    /// `1 / x`.
    recip => Recip;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.binary(BinaryOp::$op, rhs)
                }

                $(#[$doc])*
                /// (with a constant right-hand side of this tensor's dtype)
                #[track_caller]
                pub fn $scalar(&self, rhs: f64) -> Result<Tensor> {
                    let c = self.constant_like(rhs)?;
                    self.binary(BinaryOp::$op, &c)
                }
            )*
        }
    };
}

binary_methods! {
    /// `self + rhs`, broadcasting.
    add, add_scalar => Add;
    /// `self - rhs`, broadcasting.
    sub, sub_scalar => Sub;
    /// `self * rhs`, broadcasting.
    mul, mul_scalar => Mul;
    /// `self / rhs`, broadcasting (integers truncate; division by zero gives 0).
    div, div_scalar => Div;
    /// Elementwise maximum, broadcasting.
    maximum, maximum_scalar => Max;
    /// Elementwise minimum, broadcasting.
    minimum, minimum_scalar => Min;
    /// `self ^ rhs`, broadcasting (floats).
    pow, pow_scalar => Pow;
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.compare(CmpOp::$op, rhs)
                }

                $(#[$doc])*
                /// (against a constant of this tensor's dtype)
                #[track_caller]
                pub fn $scalar(&self, rhs: f64) -> Result<Tensor> {
                    let c = self.constant_like(rhs)?;
                    self.compare(CmpOp::$op, &c)
                }
            )*
        }
    };
}

compare_methods! {
    /// `self == rhs` as bool, broadcasting.
    eq, eq_scalar => Eq;
    /// `self != rhs` as bool, broadcasting.
    ne, ne_scalar => Ne;
    /// `self < rhs` as bool, broadcasting.
    lt, lt_scalar => Lt;
    /// `self <= rhs` as bool, broadcasting.
    le, le_scalar => Le;
    /// `self > rhs` as bool, broadcasting.
    gt, gt_scalar => Gt;
    /// `self >= rhs` as bool, broadcasting.
    ge, ge_scalar => Ge;
}

impl Tensor {
    #[track_caller]
    pub(crate) fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let loc = Location::caller();
        let out = rule(op.name(), loc, infer::unary(op, self.meta()))?;
        trace(op.name(), loc, self.device(), Op::Unary(op), &[self], out)
    }

    /// A splat constant with this tensor's shape and dtype.
    #[track_caller]
    fn constant_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(self.shape().clone(), value, self.dtype(), self.device())
    }

    /// Both operands broadcast to their common shape.
    #[track_caller]
    fn broadcast_pair(&self, name: &'static str, rhs: &Tensor) -> Result<(Tensor, Tensor)> {
        let shape = rule(name, Location::caller(), broadcast_shapes(self.shape(), rhs.shape()))?;
        Ok((self.broadcast_to(&shape)?, rhs.broadcast_to(&shape)?))
    }

    #[track_caller]
    pub(crate) fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        if self.dtype() != rhs.dtype() {
            rule(op.name(), loc, infer::binary(op, self.meta(), (self.shape(), rhs.dtype())))?;
        }
        let (a, b) = self.broadcast_pair(op.name(), rhs)?;
        let out = rule(op.name(), loc, infer::binary(op, a.meta(), b.meta()))?;
        trace(op.name(), loc, self.device(), Op::Binary(op), &[&a, &b], out)
    }

    #[track_caller]
    fn compare(&self, op: CmpOp, rhs: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        if self.dtype() != rhs.dtype() {
            rule(op.name(), loc, infer::compare(op, self.meta(), (self.shape(), rhs.dtype())))?;
        }
        let (a, b) = self.broadcast_pair(op.name(), rhs)?;
        let out = rule(op.name(), loc, infer::compare(op, a.meta(), b.meta()))?;
        trace(op.name(), loc, self.device(), Op::Compare(op), &[&a, &b], out)
    }

    /// `cond ? on_true : on_false` elementwise (`torch.where`), broadcasting all three.
    #[track_caller]
    pub fn select(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let shape = rule("select", loc, broadcast_shapes(cond.shape(), on_true.shape()))?;
        let shape = rule("select", loc, broadcast_shapes(&shape, on_false.shape()))?;
        let (c, a, b) = (cond.broadcast_to(&shape)?, on_true.broadcast_to(&shape)?, on_false.broadcast_to(&shape)?);
        let out = rule("select", loc, infer::select(c.meta(), a.meta(), b.meta()))?;
        trace("select", loc, cond.device(), Op::Select, &[&c, &a, &b], out)
    }

    /// Convert to `dtype` (floats to integers truncate toward zero). A
    /// materialised f32 value that an assignment gave a kept 16-bit copy
    /// (see `narrow_copy`) is cast by reading that copy.
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let loc = Location::caller();
        let out = rule("cast", loc, infer::cast(self.meta(), dtype))?;
        let kept = self.cell().narrow_copy_for_cast(dtype);
        let cast = trace("cast", loc, self.device(), Op::Cast, &[self], out)?;
        let id = match &*cast.cell().lock_state() {
            TensorState::Pending(id) => Some(*id),
            TensorState::Ready(_) | TensorState::Failed(_) => None,
        };
        if let (Some((source, copy)), Some(id)) = (kept, id) {
            self.device().lock_live().provide(id, source, copy);
        }
        Ok(cast)
    }

    /// `x^2`.
    #[track_caller]
    pub fn square(&self) -> Result<Tensor> {
        self.mul(self)
    }
}
