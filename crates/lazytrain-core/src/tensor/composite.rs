//! Composite functions built from primitives: what layers call. The compiler
//! sees only the primitives, so fusion makes these fast without special cases.

use super::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result, RuleError, RuleKind};
use crate::shape::Shape;
use std::panic::Location;

impl Tensor {
    /// `softmax` along `axis`, stabilised by subtracting the maximum (a
    /// constant for autodiff: softmax does not depend on it).
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        let shifted = self.sub(&self.max(&[axis], true)?.stop_gradient()?)?;
        let e = shifted.exp()?;
        e.div(&e.sum(&[axis], true)?)
    }

    /// `log_softmax` along `axis`: `x - max - log(sum(exp(x - max)))`; the
    /// maximum is a constant for autodiff (its gradient is zero).
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        let shifted = self.sub(&self.max(&[axis], true)?.stop_gradient()?)?;
        let log_sum = shifted.exp()?.sum(&[axis], true)?.log()?;
        shifted.sub(&log_sum)
    }

    /// The logistic function `1 / (1 + exp(-x))` (exact to rounding for
    /// very negative x, where `0.5 (1 + tanh(x / 2))` cancels).
    #[track_caller]
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.neg()?.exp()?.add_scalar(1.0)?.recip()
    }

    /// The exact GELU: `0.5 x (1 + erf(x / sqrt 2))`.
    #[track_caller]
    pub fn gelu(&self) -> Result<Tensor> {
        let cdf = self.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?.mul_scalar(0.5)?;
        self.mul(&cdf)
    }

    /// Layer normalisation over the last axis with biased variance, then an
    /// optional elementwise `weight` and `bias` (both of the last axis' size).
    #[track_caller]
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let mean = self.mean(&[-1], true)?;
        let centered = self.sub(&mean)?;
        // The variance's gradient reaches `x` directly, not back through the
        // mean: that path adds `(2/N) d_var sum(centered)`, zero in exact
        // arithmetic, and without it the backward's two row sums (of `g w`
        // and of `g w centered`) are independent, one pass over the rows
        // instead of two in sequence. The forward values are the same (the
        // compiler merges the two subtractions once the stop is dropped).
        let var = self.sub(&mean.stop_gradient()?)?.square()?.mean(&[-1], true)?;
        let mut y = centered.mul(&var.add_scalar(eps)?.rsqrt()?)?;
        if let Some(w) = weight {
            y = y.mul(w)?;
        }
        if let Some(b) = bias {
            y = y.add(b)?;
        }
        Ok(y)
    }

    /// Cross-entropy of `[.., classes]` logits against integer class
    /// `labels` of the leading shape, averaged over the targets that are not
    /// `ignore_index` (PyTorch's `reduction="mean"`: NaN when all are ignored).
    #[track_caller]
    pub fn cross_entropy(&self, labels: &Tensor, ignore_index: i64) -> Result<Tensor> {
        let (total, count) = self.cross_entropy_parts(labels, ignore_index)?;
        total.div(&count)
    }

    /// The summed cross-entropy over the targets that are not `ignore_index`
    /// (PyTorch's `reduction="sum"`), for losses normalised by a token count
    /// known outside the batch (gradient accumulation).
    #[track_caller]
    pub fn cross_entropy_sum(&self, labels: &Tensor, ignore_index: i64) -> Result<Tensor> {
        Ok(self.cross_entropy_parts(labels, ignore_index)?.0)
    }

    /// `(summed loss, number of counted targets)`.
    #[track_caller]
    fn cross_entropy_parts(&self, labels: &Tensor, ignore_index: i64) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let leading = &self.dims()[..self.rank().saturating_sub(1)];
        if self.rank() < 1 || labels.dims() != leading || !matches!(labels.dtype(), DType::I64 | DType::I32) {
            let e = RuleError::new(
                RuleKind::Shape,
                format!(
                    "cross_entropy needs logits [.., classes] and integer labels of the leading shape, got logits {} {} and labels {} {}",
                    self.dtype(),
                    self.shape(),
                    labels.dtype(),
                    labels.shape()
                ),
            );
            return Err(Error::from_rule("cross_entropy", e, loc));
        }
        let classes = self.dims()[self.rank() - 1];
        let n = labels.numel();
        // loss_i = logsumexp(x_i) - x_i[label]: the [n, classes] work is one
        // max, one exp-and-sum and (backward) one softmax; the shift by the
        // row maximum is a constant for autodiff (its gradient is zero).
        let x = self.reshape([n, classes])?;
        let shift = x.max(&[-1], true)?.stop_gradient()?;
        let lse = x.sub(&shift)?.exp()?.sum(&[-1], true)?.log()?.add(&shift)?;
        let labels = labels.reshape([n])?;
        let valid = labels.ne_scalar(ignore_index as f64)?;
        let safe = Tensor::select(&valid, &labels, &Tensor::zeros(Shape::scalar(), labels.dtype(), self.device())?)?;
        let picked = x.gather(1, &safe.reshape([n, 1])?)?;
        let weights = valid.cast(self.dtype())?;
        let total = lse.sub(&picked)?.reshape([n])?.mul(&weights)?.sum_all()?;
        Ok((total, weights.sum_all()?))
    }
}
