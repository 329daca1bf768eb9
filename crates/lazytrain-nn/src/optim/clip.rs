//! Global-norm gradient clipping, inside the graph.

use crate::Result;
use lazytrain_core::Tensor;

/// Scale every gradient by `min(1, max_norm / (‖g‖ + 1e-6))` where `‖g‖` is
/// the L2 norm over all gradients together (`torch.nn.utils.clip_grad_norm_`).
/// Nothing is read back to the host; returns the (pending) total norm.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Option<Tensor>> {
    let grads: Vec<(Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p.clone(), g))).collect();
    let Some((_, first)) = grads.first() else { return Ok(None) };
    let mut total = first.square()?.sum_all()?;
    for (_, g) in &grads[1..] {
        total = total.add(&g.square()?.sum_all()?)?;
    }
    let norm = total.sqrt()?;
    let coef = norm.add_scalar(1e-6)?.recip()?.mul_scalar(max_norm)?.minimum_scalar(1.0)?;
    for (p, g) in &grads {
        p.set_grad(Some(g.mul(&coef)?));
    }
    Ok(Some(norm))
}
