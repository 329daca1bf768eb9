//! The gradient checker: central finite differences in `f64` against the
//! VJP rules, in the spirit of `torch.autograd.gradcheck`.

use super::grad;
use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;

/// The outcome of a gradient check.
#[derive(Clone, Debug, PartialEq)]
pub struct GradCheckReport {
    /// The largest `|analytic - numeric| / (1 + |numeric|)` over all elements.
    pub max_error: f64,
    /// Which input and element that was, with both values.
    pub worst: String,
    /// How many partial derivatives were compared.
    pub checked: usize,
}

/// Fixed weights in `[0.5, 1.5)` with alternating sign, so the checked loss
/// `sum(f(x) * w)` probes every output element with a different cotangent.
fn probe_weights(n: usize) -> Vec<f64> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            if i % 2 == 0 {
                0.5 + u
            } else {
                -0.5 - u
            }
        })
        .collect()
}

fn weighted_loss(f: &dyn Fn(&[Tensor]) -> Result<Tensor>, xs: &[Tensor]) -> Result<Tensor> {
    let out = f(xs)?.cast(crate::DType::F64)?;
    let w = Tensor::from_vec(probe_weights(out.numel()), out.shape().clone(), out.device())?;
    out.mul(&w)?.sum_all()
}

/// Compare the gradients of `sum(f(inputs) * w)` from autodiff with central
/// differences of step `eps`. Inputs are `(values, shape)` pairs made into
/// `f64` tensors on a fresh CPU device.
pub fn check_gradients(
    inputs: &[(Vec<f64>, Vec<usize>)],
    eps: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<GradCheckReport> {
    check_gradients_on(&Device::cpu(), inputs, eps, f)
}

/// [`check_gradients`] on `dev` (to check a backend's kernels).
pub fn check_gradients_on(
    dev: &Device,
    inputs: &[(Vec<f64>, Vec<usize>)],
    eps: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<GradCheckReport> {
    let make = |values: &[Vec<f64>]| -> Result<Vec<Tensor>> {
        values.iter().zip(inputs).map(|(v, (_, shape))| Tensor::from_vec(v.clone(), shape.clone(), dev)).collect()
    };
    let base: Vec<Vec<f64>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    let xs = make(&base)?;
    let loss = weighted_loss(&f, &xs)?;
    let refs: Vec<&Tensor> = xs.iter().collect();
    let analytic = grad(&loss, &refs)?;
    dev.sync()?;
    let mut report = GradCheckReport { max_error: 0.0, worst: String::new(), checked: 0 };
    for (k, g) in analytic.iter().enumerate() {
        let g = g.to_f64_vec()?;
        for i in 0..base[k].len() {
            let at = |delta: f64| -> Result<f64> {
                let mut values = base.clone();
                values[k][i] += delta;
                weighted_loss(&f, &make(&values)?)?.item::<f64>()
            };
            let numeric = (at(eps)? - at(-eps)?) / (2.0 * eps);
            let error = (g[i] - numeric).abs() / (1.0 + numeric.abs());
            report.checked += 1;
            if error > report.max_error || report.worst.is_empty() {
                report.max_error = error;
                report.worst = format!("input {k} element {i}: analytic {} vs numeric {numeric}", g[i]);
            }
        }
    }
    Ok(report)
}
