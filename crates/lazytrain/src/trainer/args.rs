//! `TrainingArguments`: Hugging Face's names and defaults, from TOML or JSON,
//! overridden by flags, validated with messages that list the valid choices.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// When to evaluate or save.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntervalStrategy {
    /// Never.
    No,
    /// Every `*_steps` optimizer steps.
    Steps,
    /// At the end of every epoch.
    Epoch,
}

/// Training hyperparameters, named and defaulted as in `transformers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingArguments {
    /// Where checkpoints, logs and the final model go.
    pub output_dir: String,
    /// Allow writing into a non-empty `output_dir` without resuming.
    pub overwrite_output_dir: bool,
    /// Train; `false` with `do_eval` only evaluates the model (HF's
    /// `--do_eval` without `--do_train`).
    pub do_train: bool,
    /// Evaluate on the eval data.
    pub do_eval: bool,
    /// Total optimizer steps; overrides `num_train_epochs` when > 0.
    pub max_steps: i64,
    /// Epochs when `max_steps` is not set.
    pub num_train_epochs: f64,
    /// Sequences per replica per micro-batch.
    pub per_device_train_batch_size: usize,
    /// Sequences per replica per eval batch.
    pub per_device_eval_batch_size: usize,
    /// Micro-batches per optimizer step.
    pub gradient_accumulation_steps: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Decoupled weight decay (not applied to biases and LayerNorm weights).
    pub weight_decay: f64,
    /// AdamW β₁.
    pub adam_beta1: f64,
    /// AdamW β₂.
    pub adam_beta2: f64,
    /// AdamW ε.
    pub adam_epsilon: f64,
    /// Global gradient-norm clip (0 disables).
    pub max_grad_norm: f64,
    /// `linear`, `cosine`, `constant` or `constant_with_warmup`.
    pub lr_scheduler_type: String,
    /// Warmup steps, or a fraction of the total steps when below 1.
    pub warmup_steps: f64,
    /// Log every this many steps.
    pub logging_steps: u64,
    /// Log the first step too.
    pub logging_first_step: bool,
    /// `no`, `steps` or `epoch`.
    pub eval_strategy: IntervalStrategy,
    /// Evaluate every this many steps (defaults to `logging_steps`).
    pub eval_steps: Option<u64>,
    /// `no`, `steps` or `epoch`.
    pub save_strategy: IntervalStrategy,
    /// Save every this many steps.
    pub save_steps: u64,
    /// Keep at most this many checkpoints (oldest deleted first, the best kept).
    pub save_total_limit: Option<usize>,
    /// After training, load the checkpoint with the best `metric_for_best_model`.
    pub load_best_model_at_end: bool,
    /// The eval metric that picks the best checkpoint (`loss`, `accuracy`,
    /// `f1`, `perplexity`; the `eval_` prefix is optional).
    pub metric_for_best_model: String,
    /// Whether a larger metric is better (default: false for losses, true otherwise).
    pub greater_is_better: Option<bool>,
    /// Seed of initialisation, data order, masking and dropout.
    pub seed: u64,
    /// bf16 mixed precision: the forward pass's matmuls compute in bf16 with
    /// f32 accumulation (their backward too); weights, optimizer state,
    /// softmax, LayerNorm and the loss stay f32.
    pub bf16: bool,
    /// Keep the f32 activations the backward pass reads in bf16 (half their
    /// memory; gradients carry their bf16 rounding; the forward pass and
    /// the loss are unchanged): `Device::save_activations_as`. Works with
    /// or without `bf16`.
    pub bf16_saved_activations: bool,
    /// Drop the last partial batch (training batches are always full, as on XLA).
    pub dataloader_drop_last: bool,
    /// `true` (the latest valid checkpoint in `output_dir`) or a checkpoint path.
    pub resume_from_checkpoint: Option<String>,
    /// Any of `jsonl`, `tensorboard`, or `none`.
    pub report_to: Vec<String>,
    /// Data-parallel replicas (in each process, under `mpirun`).
    pub num_replicas: usize,
    /// Seconds a collective across processes (MPI) may wait for the other
    /// processes before the job is aborted.
    pub collective_timeout: f64,
    /// Fraction of tokens the MLM collator predicts.
    pub mlm_probability: f64,
    /// Batches the loader prepares ahead.
    pub dataloader_prefetch: usize,
    /// Skip corrupt records instead of failing.
    pub skip_corrupt: bool,
    /// Stop when the eval loss has not improved for this many evaluations.
    pub early_stopping_patience: Option<u64>,
}

impl Default for TrainingArguments {
    fn default() -> TrainingArguments {
        TrainingArguments {
            output_dir: "lazytrain-output".into(),
            overwrite_output_dir: false,
            do_train: true,
            do_eval: false,
            max_steps: -1,
            num_train_epochs: 3.0,
            per_device_train_batch_size: 8,
            per_device_eval_batch_size: 8,
            gradient_accumulation_steps: 1,
            learning_rate: 5e-5,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            lr_scheduler_type: "linear".into(),
            warmup_steps: 0.0,
            logging_steps: 500,
            logging_first_step: false,
            eval_strategy: IntervalStrategy::No,
            eval_steps: None,
            save_strategy: IntervalStrategy::Steps,
            save_steps: 500,
            save_total_limit: None,
            load_best_model_at_end: false,
            metric_for_best_model: "loss".into(),
            greater_is_better: None,
            seed: 42,
            bf16: false,
            bf16_saved_activations: false,
            dataloader_drop_last: false,
            resume_from_checkpoint: None,
            report_to: vec!["jsonl".into()],
            num_replicas: 1,
            collective_timeout: lazytrain_dist::DEFAULT_COLLECTIVE_TIMEOUT.as_secs_f64(),
            mlm_probability: 0.15,
            dataloader_prefetch: 2,
            skip_corrupt: false,
            early_stopping_patience: None,
        }
    }
}

fn invalid(detail: String) -> Error {
    Error::Input(format!("invalid training arguments: {detail}"))
}

impl TrainingArguments {
    /// Read a `.toml` or `.json` file (unknown keys are errors that list the valid ones).
    pub fn from_file(path: &Path) -> Result<TrainingArguments> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Input(format!("{}: cannot read the config: {e}", path.display())))?;
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text).map_err(|e| e.to_string()),
            Some("json") => serde_json::from_str(&text).map_err(|e| e.to_string()),
            _ => return Err(Error::Input(format!("{}: use a .toml or .json config file", path.display()))),
        };
        parsed.map_err(|e| Error::Input(format!("{}: {e}", path.display())))
    }

    /// Apply `key=value` overrides (keys in snake_case, as in the file).
    pub fn with_overrides(self, overrides: &[(String, String)]) -> Result<TrainingArguments> {
        let mut value = serde_json::to_value(&self).map_err(|e| invalid(e.to_string()))?;
        for (key, raw) in overrides {
            let parsed = match (key.as_str(), raw.as_str()) {
                ("report_to", r) => serde_json::json!(r.split(',').map(str::trim).collect::<Vec<_>>()),
                ("resume_from_checkpoint" | "output_dir" | "lr_scheduler_type" | "metric_for_best_model", r) => {
                    serde_json::json!(r)
                }
                (_, r) => serde_json::from_str(r).unwrap_or_else(|_| serde_json::json!(r)),
            };
            value[key] = parsed;
        }
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
    }

    /// Reject invalid values and combinations. `has_eval_data` says whether
    /// evaluation data was given.
    pub fn validate(&self, has_eval_data: bool) -> Result<()> {
        let schedulers = ["linear", "cosine", "constant", "constant_with_warmup"];
        if !schedulers.contains(&self.lr_scheduler_type.as_str()) {
            return Err(invalid(format!(
                "lr_scheduler_type `{}`; choose one of {}",
                self.lr_scheduler_type,
                schedulers.join(", ")
            )));
        }
        for r in &self.report_to {
            if !["jsonl", "tensorboard", "none"].contains(&r.as_str()) {
                return Err(invalid(format!("report_to `{r}`; choose from jsonl, tensorboard, none")));
            }
        }
        if (self.eval_strategy != IntervalStrategy::No || self.do_eval) && !has_eval_data {
            return Err(invalid("evaluation is on (eval_strategy or do_eval) but no eval data was given; pass --eval-data DIR or set eval_strategy = \"no\"".into()));
        }
        if self.early_stopping_patience.is_some() && self.eval_strategy == IntervalStrategy::No {
            return Err(invalid("early_stopping_patience needs eval_strategy `steps` or `epoch`".into()));
        }
        if self.per_device_train_batch_size == 0
            || self.per_device_eval_batch_size == 0
            || self.gradient_accumulation_steps == 0
        {
            return Err(invalid("batch sizes and gradient_accumulation_steps must be at least 1".into()));
        }
        let floats = [
            ("num_train_epochs", self.num_train_epochs),
            ("learning_rate", self.learning_rate),
            ("weight_decay", self.weight_decay),
            ("adam_beta1", self.adam_beta1),
            ("adam_beta2", self.adam_beta2),
            ("adam_epsilon", self.adam_epsilon),
            ("max_grad_norm", self.max_grad_norm),
            ("warmup_steps", self.warmup_steps),
            ("mlm_probability", self.mlm_probability),
            ("collective_timeout", self.collective_timeout),
        ];
        if let Some((name, value)) = floats.iter().find(|(_, v)| !v.is_finite()) {
            return Err(invalid(format!("{name} must be a finite number, got {value}")));
        }
        if self.max_steps <= 0 && self.num_train_epochs <= 0.0 {
            return Err(invalid("set max_steps > 0 or num_train_epochs > 0".into()));
        }
        if self.learning_rate <= 0.0 || self.warmup_steps < 0.0 || self.max_grad_norm < 0.0 {
            return Err(invalid("learning_rate must be positive; warmup_steps and max_grad_norm not negative".into()));
        }
        if self.save_strategy == IntervalStrategy::Steps && self.save_steps == 0 || self.logging_steps == 0 {
            return Err(invalid("save_steps and logging_steps must be at least 1".into()));
        }
        if self.load_best_model_at_end {
            if self.eval_strategy == IntervalStrategy::No || self.eval_strategy != self.save_strategy {
                return Err(invalid(format!(
                    "load_best_model_at_end needs eval_strategy and save_strategy to match and not be `no` (they are {:?} and {:?})",
                    self.eval_strategy, self.save_strategy
                ).to_lowercase()));
            }
            let eval_steps = self.eval_steps.unwrap_or(self.logging_steps);
            if self.save_strategy == IntervalStrategy::Steps && !self.save_steps.is_multiple_of(eval_steps.max(1)) {
                return Err(invalid(format!(
                    "load_best_model_at_end needs save_steps ({}) to be a multiple of eval_steps ({eval_steps})",
                    self.save_steps
                )));
            }
        }
        if self.num_replicas == 0 {
            return Err(invalid("num_replicas must be at least 1".into()));
        }
        if self.collective_timeout <= 0.0 || self.collective_timeout > 1e9 {
            return Err(invalid(format!(
                "collective_timeout must be a positive number of seconds, got {}",
                self.collective_timeout
            )));
        }
        Ok(())
    }

    /// The log key of `metric_for_best_model` (`eval_` prefixed).
    pub fn best_metric_key(&self) -> String {
        let name = self.metric_for_best_model.as_str();
        if name.starts_with("eval_") {
            name.to_string()
        } else {
            format!("eval_{name}")
        }
    }

    /// Whether a larger best-model metric is better: `greater_is_better`, or
    /// by default false for losses (and perplexity) and true otherwise.
    pub fn best_metric_greater_is_better(&self) -> bool {
        self.greater_is_better.unwrap_or_else(|| {
            let key = self.best_metric_key();
            !(key.ends_with("loss") || key.ends_with("perplexity"))
        })
    }

    /// Warmup steps for a run of `total` steps.
    pub fn warmup_for(&self, total: u64) -> u64 {
        if self.warmup_steps < 1.0 {
            (self.warmup_steps * total as f64).ceil() as u64
        } else {
            self.warmup_steps as u64
        }
    }
}
