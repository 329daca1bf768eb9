//! AdamW with PyTorch's exact update (`torch.optim.AdamW`, no AMSGrad).

use super::{loaded_step, push_step, zeros_like, Optimizer, ParamGroup};
use crate::state::{check_and_load, StateDict};
use crate::{NnError, Result};
use lazytrain_core::Tensor;

/// AdamW hyperparameters (PyTorch's defaults, and HF's `adam_*` arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    weight_decay: f64,
}

/// AdamW with decoupled weight decay:
///
/// ```text
/// p ← p · (1 − lr·wd)
/// m ← β₁ m + (1 − β₁) g          v ← β₂ v + (1 − β₂) g²
/// p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
/// ```
pub struct AdamW {
    config: AdamWConfig,
    slots: Vec<Slot>,
    steps: u64,
}

impl AdamW {
    /// An optimizer over parameter groups (see [`super::decay_groups`]).
    pub fn new(groups: Vec<ParamGroup>, config: AdamWConfig) -> Result<AdamW> {
        if !(0.0..1.0).contains(&config.beta1) || !(0.0..1.0).contains(&config.beta2) || config.eps < 0.0 {
            return Err(NnError::Invalid {
                what: "AdamW hyperparameters",
                detail: format!(
                    "betas must be in [0, 1) and eps >= 0, got beta1 {}, beta2 {}, eps {}",
                    config.beta1, config.beta2, config.eps
                ),
            });
        }
        let mut slots = Vec::new();
        for group in &groups {
            for (name, param) in &group.params {
                slots.push(Slot {
                    name: name.clone(),
                    param: param.clone(),
                    exp_avg: zeros_like(param)?,
                    exp_avg_sq: zeros_like(param)?,
                    weight_decay: group.weight_decay,
                });
            }
        }
        Ok(AdamW { config, slots, steps: 0 })
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) -> Result<()> {
        let Some(device) = self.slots.first().map(|s| s.param.device().clone()) else { return Ok(()) };
        // β^t is 0 in f64 long before t leaves i32 (a step count from a file may be anything).
        let t = i32::try_from(self.steps.saturating_add(1)).unwrap_or(i32::MAX);
        let c = self.config;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        let lr = Tensor::scalar(c.lr as f32, &device);
        let step_size = Tensor::scalar((c.lr / bias1) as f32, &device);
        let bias2_sqrt = Tensor::scalar(bias2.sqrt() as f32, &device);
        for slot in &self.slots {
            let Some(g) = slot.param.grad() else { continue };
            let mut p = slot.param.clone();
            if slot.weight_decay != 0.0 {
                let keep = lr.mul_scalar(-slot.weight_decay)?.add_scalar(1.0)?;
                p = p.mul(&keep)?;
            }
            let m = slot.exp_avg.mul_scalar(c.beta1)?.add(&g.mul_scalar(1.0 - c.beta1)?)?;
            let v = slot.exp_avg_sq.mul_scalar(c.beta2)?.add(&g.square()?.mul_scalar(1.0 - c.beta2)?)?;
            let denom = v.sqrt()?.div(&bias2_sqrt)?.add_scalar(c.eps)?;
            let new_p = p.sub(&m.div(&denom)?.mul(&step_size)?)?;
            slot.param.assign(&new_p)?;
            slot.exp_avg.assign(&m)?;
            slot.exp_avg_sq.assign(&v)?;
        }
        self.steps = self.steps.saturating_add(1);
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
            state.push(format!("{}.exp_avg", slot.name), slot.exp_avg.clone());
            state.push(format!("{}.exp_avg_sq", slot.name), slot.exp_avg_sq.clone());
        }
        push_step(&mut state, self.slots.first().map(|s| &s.param), self.steps);
        state
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        let own = self.state_dict();
        check_and_load("optimizer", &own, state)?;
        if let Some(step) = loaded_step(state)? {
            self.steps = step;
        }
        Ok(())
    }
}
