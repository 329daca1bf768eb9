//! SGD with momentum, PyTorch's formula (`torch.optim.SGD`).

use super::{loaded_step, push_step, zeros_like, Optimizer, ParamGroup};
use crate::state::{check_and_load, StateDict};
use crate::{NnError, Result};
use lazytrain_core::Tensor;

/// SGD hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 disables the buffer).
    pub momentum: f64,
    /// Dampening of the momentum's gradient term.
    pub dampening: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 1e-2, momentum: 0.0, dampening: 0.0, nesterov: false }
    }
}

struct Slot {
    name: String,
    param: Tensor,
    momentum: Tensor,
    weight_decay: f64,
}

/// Stochastic gradient descent:
///
/// ```text
/// g ← g + wd·p
/// b ← g on the first step, else μ b + (1 − dampening) g
/// g ← g + μ b (Nesterov) or b
/// p ← p − lr·g
/// ```
///
/// The first-step special case is fed as scalar coefficients, so step 1 and
/// step 2 share one compiled graph.
pub struct Sgd {
    config: SgdConfig,
    slots: Vec<Slot>,
    steps: u64,
}

impl Sgd {
    /// An optimizer over parameter groups.
    pub fn new(groups: Vec<ParamGroup>, config: SgdConfig) -> Result<Sgd> {
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(NnError::Invalid {
                what: "SGD hyperparameters",
                detail: "Nesterov momentum needs momentum > 0 and zero dampening".into(),
            });
        }
        let mut slots = Vec::new();
        for group in &groups {
            for (name, param) in &group.params {
                slots.push(Slot {
                    name: name.clone(),
                    param: param.clone(),
                    momentum: zeros_like(param)?,
                    weight_decay: group.weight_decay,
                });
            }
        }
        Ok(Sgd { config, slots, steps: 0 })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let Some(device) = self.slots.first().map(|s| s.param.device().clone()) else { return Ok(()) };
        let c = self.config;
        let lr = Tensor::scalar(c.lr as f32, &device);
        let first = self.steps == 0;
        let keep = Tensor::scalar(if first { 0.0f32 } else { c.momentum as f32 }, &device);
        let take = Tensor::scalar(if first { 1.0f32 } else { (1.0 - c.dampening) as f32 }, &device);
        for slot in &self.slots {
            let Some(mut g) = slot.param.grad() else { continue };
            if slot.weight_decay != 0.0 {
                g = g.add(&slot.param.mul_scalar(slot.weight_decay)?)?;
            }
            if c.momentum != 0.0 {
                let buf = slot.momentum.mul(&keep)?.add(&g.mul(&take)?)?;
                g = if c.nesterov { g.add(&buf.mul_scalar(c.momentum)?)? } else { buf.clone() };
                slot.momentum.assign(&buf)?;
            }
            slot.param.assign(&slot.param.sub(&g.mul(&lr)?)?)?;
        }
        self.steps += 1;
        Ok(())
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.slots.iter().map(|s| s.param.clone()).collect()
    }

    fn zero_grad(&mut self) {
        for slot in &self.slots {
            slot.param.set_grad(None);
        }
    }

    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn state_dict(&self) -> StateDict {
        let mut state = StateDict::new();
        for slot in &self.slots {
            state.push(format!("{}.momentum_buffer", slot.name), slot.momentum.clone());
        }
        push_step(&mut state, self.slots.first().map(|s| &s.param), self.steps);
        state
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        check_and_load("optimizer", &self.state_dict(), state)?;
        if let Some(step) = loaded_step(state)? {
            self.steps = step;
        }
        Ok(())
    }
}
