//! Reductions: sum, max, mean over axes.

use super::{rule, trace, Tensor};
use crate::error::{Result, RuleError, RuleKind};
use crate::ir::{infer, Op, ReduceOp};
use crate::shape::Shape;
use std::panic::Location;

/// Resolve a possibly negative axis against `rank`.
pub(crate) fn normalize_axis(axis: isize, shape: &Shape) -> Result<usize, RuleError> {
    let rank = shape.rank() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return Err(RuleError::new(
            RuleKind::Axis,
            format!("axis {axis} is out of range for shape {shape} (rank {rank})"),
        ));
    }
    Ok(a as usize)
}

fn normalize_axes(axes: &[isize], shape: &Shape) -> Result<Vec<usize>, RuleError> {
    let mut out = axes.iter().map(|&a| normalize_axis(a, shape)).collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Tensor {
    #[track_caller]
    fn reduce(&self, name: &'static str, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let axes = rule(name, loc, normalize_axes(axes, self.shape()))?;
        let out = rule(name, loc, infer::reduce(self.meta(), &axes))?;
        let kept = trace(name, loc, self.device(), Op::Reduce { op, axes: axes.clone() }, &[self], out)?;
        if keepdim {
            return Ok(kept);
        }
        let dims: Vec<usize> =
            self.dims().iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, &n)| n).collect();
        kept.reshape(dims)
    }

    /// Sum over `axes` (negative counts from the end); `keepdim` keeps them as size 1.
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce("sum", ReduceOp::Sum, axes, keepdim)
    }

    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce("max", ReduceOp::Max, axes, keepdim)
    }

    /// Mean over `axes` (floating-point tensors).
    #[track_caller]
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let resolved = rule("mean", loc, normalize_axes(axes, self.shape()))?;
        if !self.dtype().is_float() {
            return Err(crate::error::Error::from_rule(
                "mean",
                RuleError::new(
                    RuleKind::DType,
                    format!("mean needs a floating-point tensor, got {} {}", self.dtype(), self.shape()),
                ),
                loc,
            ));
        }
        let count: usize = resolved.iter().map(|&a| self.dims()[a]).product();
        self.sum(axes, keepdim)?.mul_scalar(1.0 / count as f64)
    }

    /// Sum of all elements, as a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&axes, false)
    }

    /// Mean of all elements, as a scalar.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&axes, false)
    }
}
