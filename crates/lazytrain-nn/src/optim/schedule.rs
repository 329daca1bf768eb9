//! Learning-rate schedules (Hugging Face's `get_scheduler` formulas),
//! computed on the host and fed to the step graph as a scalar input.

use crate::{NnError, Result};
use std::f64::consts::PI;

/// The schedule families, with Hugging Face's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// `constant`: the base rate throughout.
    Constant,
    /// `constant_with_warmup`: linear warmup, then constant.
    ConstantWithWarmup,
    /// `linear`: linear warmup, then linear decay to 0 at the last step.
    Linear,
    /// `cosine`: linear warmup, then a half cosine to 0 at the last step.
    Cosine,
}

impl ScheduleKind {
    /// Parse a Hugging Face `lr_scheduler_type` name.
    pub fn parse(name: &str) -> Result<ScheduleKind> {
        Ok(match name {
            "constant" => ScheduleKind::Constant,
            "constant_with_warmup" => ScheduleKind::ConstantWithWarmup,
            "linear" => ScheduleKind::Linear,
            "cosine" => ScheduleKind::Cosine,
            other => {
                return Err(NnError::Invalid {
                    what: "lr_scheduler_type",
                    detail: format!("`{other}`; choose one of constant, constant_with_warmup, linear, cosine"),
                })
            }
        })
    }
}

/// A schedule over `total_steps` optimizer steps with `warmup_steps` of warmup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// The family.
    pub kind: ScheduleKind,
    /// The peak (base) learning rate.
    pub base_lr: f64,
    /// Warmup steps.
    pub warmup_steps: u64,
    /// Total optimizer steps.
    pub total_steps: u64,
}

impl LrSchedule {
    /// The learning rate for 0-based optimizer step `step`.
    pub fn lr_at(&self, step: u64) -> f64 {
        let (s, w, t) = (step as f64, self.warmup_steps as f64, self.total_steps as f64);
        let warming = step < self.warmup_steps;
        let factor = match self.kind {
            ScheduleKind::Constant => 1.0,
            ScheduleKind::ConstantWithWarmup if warming => s / w.max(1.0),
            ScheduleKind::ConstantWithWarmup => 1.0,
            ScheduleKind::Linear | ScheduleKind::Cosine if warming => s / w.max(1.0),
            ScheduleKind::Linear => ((t - s) / (t - w).max(1.0)).max(0.0),
            ScheduleKind::Cosine => {
                let progress = (s - w) / (t - w).max(1.0);
                (0.5 * (1.0 + (PI * progress).cos())).max(0.0)
            }
        };
        self.base_lr * factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(kind: ScheduleKind) -> LrSchedule {
        LrSchedule { kind, base_lr: 1.0, warmup_steps: 4, total_steps: 12 }
    }

    #[test]
    fn matches_hugging_face_lambdas() {
        let linear = sched(ScheduleKind::Linear);
        assert_eq!([0, 2, 4, 8, 12, 20].map(|s| linear.lr_at(s)), [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]);
        let cosine = sched(ScheduleKind::Cosine);
        assert_eq!(cosine.lr_at(1), 0.25);
        assert!((cosine.lr_at(8) - 0.5).abs() < 1e-12);
        assert!(cosine.lr_at(12).abs() < 1e-12);
        let warm = sched(ScheduleKind::ConstantWithWarmup);
        assert_eq!([0, 3, 4, 100].map(|s| warm.lr_at(s)), [0.0, 0.75, 1.0, 1.0]);
        assert_eq!(sched(ScheduleKind::Constant).lr_at(0), 1.0);
        assert!(ScheduleKind::parse("polynomial").unwrap_err().to_string().contains("choose one of"));
    }
}
