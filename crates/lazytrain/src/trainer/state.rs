//! What a run remembers: `trainer_state.json`, `scheduler.json`, `rng_state.json`.

use serde::{Deserialize, Serialize};

/// Hugging Face's `TrainerState`, plus the data position for exact resume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps done.
    pub global_step: u64,
    /// Fractional epochs done.
    pub epoch: f64,
    /// Steps the run will take.
    pub max_steps: u64,
    /// Logging interval.
    pub logging_steps: u64,
    /// Evaluation interval.
    pub eval_steps: u64,
    /// Save interval.
    pub save_steps: u64,
    /// Sequences per micro-batch.
    pub train_batch_size: usize,
    /// Epochs the run was asked for.
    pub num_train_epochs: f64,
    /// Every log and evaluation, in order.
    pub log_history: Vec<serde_json::Value>,
    /// The best eval loss so far.
    pub best_metric: Option<f64>,
    /// The checkpoint that had it.
    pub best_model_checkpoint: Option<String>,
    /// Epoch of the next batch to read.
    pub data_epoch: u64,
    /// Sample (within that epoch) of the next batch to read.
    pub data_sample: usize,
}

/// The LR schedule's state (`scheduler.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerState {
    /// HF scheduler name.
    pub lr_scheduler_type: String,
    /// Peak learning rate.
    pub base_lr: f64,
    /// Warmup steps.
    pub warmup_steps: u64,
    /// Total steps.
    pub total_steps: u64,
    /// Steps taken.
    pub last_step: u64,
}

impl SchedulerState {
    /// How the schedule `now` differs from this saved one, one `name old ->
    /// new` entry per changed setting (the step aside): empty when a resumed
    /// run continues the saved schedule.
    pub fn changes_to(&self, now: &SchedulerState) -> Vec<String> {
        let mut changes = Vec::new();
        if self.lr_scheduler_type != now.lr_scheduler_type {
            changes.push(format!("lr_scheduler_type {} -> {}", self.lr_scheduler_type, now.lr_scheduler_type));
        }
        if self.base_lr != now.base_lr {
            changes.push(format!("learning_rate {:e} -> {:e}", self.base_lr, now.base_lr));
        }
        if self.warmup_steps != now.warmup_steps {
            changes.push(format!("warmup steps {} -> {}", self.warmup_steps, now.warmup_steps));
        }
        if self.total_steps != now.total_steps {
            changes.push(format!("total steps {} -> {}", self.total_steps, now.total_steps));
        }
        changes
    }
}

/// Everything random in a run derives from these (`rng_state.json`):
/// dropout masks from `(seed, step)`, data order from `(seed, epoch)`,
/// MLM masking from `(seed, epoch, sample)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// The run's seed.
    pub seed: u64,
    /// The dropout step counter of the next step.
    pub dropout_step: u64,
    /// Data epoch of the next batch.
    pub data_epoch: u64,
    /// Data sample of the next batch.
    pub data_sample: usize,
    /// Replicas of the run that saved it, over every process (a resume
    /// with another number restarts the data epoch; absent in checkpoints
    /// of earlier versions).
    #[serde(default)]
    pub replicas: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::SchedulerState;

    /// Each changed setting is named with its old and new value; the step
    /// alone changing is no change of schedule.
    #[test]
    fn schedule_changes_name_each_setting() {
        let saved = SchedulerState {
            lr_scheduler_type: "linear".into(),
            base_lr: 1e-3,
            warmup_steps: 10,
            total_steps: 100,
            last_step: 40,
        };
        assert!(saved.changes_to(&SchedulerState { last_step: 41, ..saved.clone() }).is_empty());
        let now = SchedulerState {
            lr_scheduler_type: "cosine".into(),
            base_lr: 5e-4,
            warmup_steps: 20,
            total_steps: 200,
            last_step: 40,
        };
        assert_eq!(
            saved.changes_to(&now),
            [
                "lr_scheduler_type linear -> cosine",
                "learning_rate 1e-3 -> 5e-4",
                "warmup steps 10 -> 20",
                "total steps 100 -> 200"
            ]
        );
    }
}
