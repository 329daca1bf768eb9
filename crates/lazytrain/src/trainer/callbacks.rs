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

/// Stop when the watched metric (`eval_loss` unless told otherwise) has not
/// improved by more than `threshold` for `patience` evaluations in a row.
#[derive(Clone, Debug)]
pub struct EarlyStopping {
    /// Evaluations without improvement to tolerate.
    pub patience: u64,
    /// Minimum improvement that counts.
    pub threshold: f64,
    metric: String,
    greater_is_better: bool,
    best: Option<f64>,
    bad: u64,
}

impl EarlyStopping {
    /// A callback with the given patience, watching `eval_loss`.
    pub fn new(patience: u64, threshold: f64) -> EarlyStopping {
        EarlyStopping { patience, threshold, metric: "eval_loss".into(), greater_is_better: false, best: None, bad: 0 }
    }

    /// Watch `metric` (a log key such as `eval_accuracy`) instead.
    pub fn on_metric(mut self, metric: &str, greater_is_better: bool) -> EarlyStopping {
        self.metric = metric.to_string();
        self.greater_is_better = greater_is_better;
        self
    }
}

impl TrainerCallback for EarlyStopping {
    fn on_evaluate(&mut self, _state: &TrainerState, metrics: &Value) -> Control {
        let Some(value) = metrics.get(&self.metric).and_then(Value::as_f64) else { return Control::default() };
        let improved = |best: f64| {
            if self.greater_is_better {
                value > best + self.threshold
            } else {
                value < best - self.threshold
            }
        };
        if self.best.is_none_or(improved) {
            self.best = Some(value);
            self.bad = 0;
        } else {
            self.bad += 1;
        }
        Control { should_stop: self.bad >= self.patience }
    }
}
