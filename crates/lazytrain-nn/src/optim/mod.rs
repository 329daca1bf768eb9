//! Optimizers, LR schedules and gradient clipping.
//!
//! Updates are traced: `step()` reads each parameter's pending gradient,
//! emits the update as lazy ops and [`Tensor::assign`]s the new values, so
//! forward, backward and update are one graph. Per-step scalars (learning
//! rate, bias corrections) are fed as inputs and never cause a recompile;
//! the old parameter and moment buffers are donated to the new values.

mod adamw;
mod clip;
mod schedule;
mod sgd;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::clip_grad_norm;
pub use schedule::{LrSchedule, ScheduleKind};
pub use sgd::{Sgd, SgdConfig};

use crate::state::StateDict;
use crate::Result;
use lazytrain_core::Tensor;

/// Parameters that share a weight decay.
#[derive(Clone)]
pub struct ParamGroup {
    /// `(name, parameter)` pairs.
    pub params: Vec<(String, Tensor)>,
    /// Decoupled weight decay for this group.
    pub weight_decay: f64,
}

/// Whether `name` is a LayerNorm parameter: BERT's `LayerNorm`, RoBERTa's
/// head `layer_norm`, GPT-2's `ln_1`, `ln_2` and `ln_f`.
fn is_layer_norm(name: &str) -> bool {
    name.contains("LayerNorm") || name.contains("layer_norm") || name.split('.').any(|part| part.starts_with("ln_"))
}

/// Split parameters as Hugging Face's Trainer does: biases and LayerNorm
/// weights get no weight decay, everything else gets `weight_decay`.
pub fn decay_groups(params: Vec<(String, Tensor)>, weight_decay: f64) -> Vec<ParamGroup> {
    let (no_decay, decay): (Vec<_>, Vec<_>) =
        params.into_iter().partition(|(name, _)| name.ends_with("bias") || is_layer_norm(name));
    vec![ParamGroup { params: decay, weight_decay }, ParamGroup { params: no_decay, weight_decay: 0.0 }]
}

/// What every optimizer offers the training loop.
pub trait Optimizer {
    /// Trace one update from the parameters' current gradients.
    fn step(&mut self) -> Result<()>;
    /// Drop every parameter's gradient (so it is not a graph output).
    fn zero_grad(&mut self);
    /// The parameters this optimizer updates, in order (data-parallel
    /// training all-reduces their gradients before [`Optimizer::step`]).
    fn parameters(&self) -> Vec<Tensor>;
    /// Set the learning rate of the next step (fed as a graph input).
    fn set_lr(&mut self, lr: f64);
    /// The learning rate of the next step.
    fn lr(&self) -> f64;
    /// Completed steps.
    fn steps(&self) -> u64;
    /// Optimizer state by name (`{param}.exp_avg`, ..., `step`).
    fn state_dict(&self) -> StateDict;
    /// Restore state saved by [`Optimizer::state_dict`].
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// A device-resident zero tensor shaped like `t` (optimizer state starts here).
pub(crate) fn zeros_like(t: &Tensor) -> Result<Tensor> {
    let data = lazytrain_core::HostData::zeros(t.dtype(), t.numel());
    Ok(Tensor::from_host(data, t.shape().clone(), t.device())?)
}

/// Append the optimizer's step counter (as PyTorch's `state["step"]`).
pub(crate) fn push_step(state: &mut StateDict, param: Option<&Tensor>, steps: u64) {
    if let Some(device) = param.map(Tensor::device) {
        state.push("step".to_string(), Tensor::scalar(steps as i64, device));
    }
}

/// The step counter saved by [`push_step`], if present.
pub(crate) fn loaded_step(state: &StateDict) -> Result<Option<u64>> {
    match state.get("step") {
        Some(step) => Ok(Some(step.item::<i64>().map_err(crate::NnError::from)?.max(0) as u64)),
        None => Ok(None),
    }
}
