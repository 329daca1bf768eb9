//! Training callbacks, as in Hugging Face's `TrainerCallback`.

use super::state::TrainerState;
use serde_json::Value;
use std::path::Path;

/// What a callback asks the loop to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// Stop training after this step.
    pub should_stop: bool,
}

/// Hooks into the training loop; every method has a do-nothing default.
pub trait TrainerCallback {
    /// Before the first step.
    fn on_train_begin(&mut self, _state: &TrainerState) {}
    /// After every optimizer step.
    fn on_step_end(&mut self, _state: &TrainerState) -> Control {
        Control::default()
    }
    /// After a log entry is recorded.
    fn on_log(&mut self, _state: &TrainerState, _logs: &Value) {}
    /// After an evaluation.
    fn on_evaluate(&mut self, _state: &TrainerState, _metrics: &Value) -> Control {
        Control::default()
    }
    /// After a checkpoint is written.
    fn on_save(&mut self, _state: &TrainerState, _checkpoint: &Path) {}
    /// After the last step.
    fn on_train_end(&mut self, _state: &TrainerState) {}
}

/// Stop when `eval_loss` has not improved by more than `threshold` for
/// `patience` evaluations in a row.
#[derive(Clone, Debug)]
pub struct EarlyStopping {
    /// Evaluations without improvement to tolerate.
    pub patience: u64,
    /// Minimum improvement that counts.
    pub threshold: f64,
    best: Option<f64>,
    bad: u64,
}

impl EarlyStopping {
    /// A callback with the given patience.
    pub fn new(patience: u64, threshold: f64) -> EarlyStopping {
        EarlyStopping { patience, threshold, best: None, bad: 0 }
    }
}

impl TrainerCallback for EarlyStopping {
    fn on_evaluate(&mut self, _state: &TrainerState, metrics: &Value) -> Control {
        let Some(loss) = metrics.get("eval_loss").and_then(Value::as_f64) else { return Control::default() };
        if self.best.is_none_or(|b| loss < b - self.threshold) {
            self.best = Some(loss);
            self.bad = 0;
        } else {
            self.bad += 1;
        }
        Control { should_stop: self.bad >= self.patience }
    }
}
