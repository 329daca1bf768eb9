//! `TrainingArguments`: Hugging Face's names and defaults, from TOML or JSON,
//! overridden by flags, validated with messages that list the valid choices.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The most batches [`TrainingArguments::validate`] lets the loader prepare
/// ahead (each holds its tensors in memory).
pub const MAX_PREFETCH: usize = 64;

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

/// What `push_to` uploads, and when (Hugging Face's `hub_strategy` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HubStrategy {
    /// The final model folder, when training ends.
    End,
    /// Every checkpoint folder as it is saved (rotated remotely by
    /// `save_total_limit`), then the final model: a preempted run resumes
    /// from the newest complete one.
    EverySave,
    /// The model at the top of `push_to` at each save, and the newest
    /// checkpoint as `last-checkpoint/` (resume from it).
    Checkpoint,
    /// The model at the top of `push_to` at each save, and every checkpoint
    /// folder, never rotated.
    AllCheckpoints,
}

/// Declares [`TrainingArguments`] (fields, docs and defaults written once)
/// and [`FIELDS`], the same docs by name, from which the `lazytrain train`
/// flags and their help are made: the help cannot drift from the struct.
macro_rules! training_arguments {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty = $default:expr,)*) => {
        /// Training hyperparameters, named and defaulted as in `transformers`.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct TrainingArguments {
            $($(#[doc = $doc])+ pub $name: $ty,)*
        }

        impl Default for TrainingArguments {
            fn default() -> TrainingArguments {
                TrainingArguments { $($name: $default,)* }
            }
        }

        /// Every field of [`TrainingArguments`] as `(snake_case name, doc comment)`.
        pub const FIELDS: &[(&str, &str)] = &[$((stringify!($name), concat!($($doc, "\n"),+)),)*];
    };
}

training_arguments! {
    /// Where checkpoints, logs and the final model go.
    output_dir: String = "lazytrain-output".into(),
    /// Allow writing into a non-empty `output_dir` without resuming.
    overwrite_output_dir: bool = false,
    /// Train; `false` with `do_eval` only evaluates the model (HF's
    /// `--do_eval` without `--do_train`).
    do_train: bool = true,
    /// Evaluate on the eval data.
    do_eval: bool = false,
    /// Total optimizer steps; overrides `num_train_epochs` when > 0.
    max_steps: i64 = -1,
    /// Epochs when `max_steps` is not set.
    num_train_epochs: f64 = 3.0,
    /// Sequences per replica per micro-batch.
    per_device_train_batch_size: usize = 8,
    /// Sequences per replica per eval batch.
    per_device_eval_batch_size: usize = 8,
    /// Evaluate only the first this many eval records (`run_mlm.py`'s
    /// `--max_eval_samples`); all of them when unset.
    max_eval_samples: Option<usize> = None,
    /// Micro-batches per optimizer step.
    gradient_accumulation_steps: usize = 1,
    /// Peak learning rate.
    learning_rate: f64 = 5e-5,
    /// Decoupled weight decay (not applied to biases and LayerNorm weights).
    weight_decay: f64 = 0.0,
    /// AdamW β₁.
    adam_beta1: f64 = 0.9,
    /// AdamW β₂.
    adam_beta2: f64 = 0.999,
    /// AdamW ε.
    adam_epsilon: f64 = 1e-8,
    /// Global gradient-norm clip (0 disables).
    max_grad_norm: f64 = 1.0,
    /// `linear`, `cosine`, `constant` or `constant_with_warmup`.
    lr_scheduler_type: String = "linear".into(),
    /// Warmup steps, or a fraction of the total steps when below 1.
    warmup_steps: f64 = 0.0,
    /// Log every this many steps.
    logging_steps: u64 = 500,
    /// Log the first step too.
    logging_first_step: bool = false,
    /// `no`, `steps` or `epoch`.
    eval_strategy: IntervalStrategy = IntervalStrategy::No,
    /// Evaluate every this many steps (defaults to `logging_steps`).
    eval_steps: Option<u64> = None,
    /// `no`, `steps` or `epoch`.
    save_strategy: IntervalStrategy = IntervalStrategy::Steps,
    /// Save every this many steps.
    save_steps: u64 = 500,
    /// Keep at most this many checkpoints (oldest deleted first, the best kept).
    save_total_limit: Option<usize> = None,
    /// After training, load the checkpoint with the best `metric_for_best_model`.
    load_best_model_at_end: bool = false,
    /// The eval metric that picks the best checkpoint (`loss`, `accuracy`,
    /// `f1`, `perplexity`; the `eval_` prefix is optional).
    metric_for_best_model: String = "loss".into(),
    /// Whether a larger metric is better (default: false for losses, true otherwise).
    greater_is_better: Option<bool> = None,
    /// Seed of initialisation, data order, masking and dropout.
    seed: u64 = 42,
    /// bf16 mixed precision: the forward pass's matmuls compute in bf16 with
    /// f32 accumulation (their backward too); weights, optimizer state,
    /// softmax, LayerNorm and the loss stay f32.
    bf16: bool = false,
    /// Keep the f32 activations the backward pass reads in bf16 (half their
    /// memory; gradients carry their bf16 rounding; the forward pass and
    /// the loss are unchanged): `Device::save_activations_as`. Works with
    /// or without `bf16`.
    bf16_saved_activations: bool = false,
    /// Drop the last partial batch of an epoch: always, as on XLA (every
    /// training batch has the same shape); `false` is refused.
    dataloader_drop_last: bool = true,
    /// `true` (the latest valid checkpoint in `output_dir`, else in
    /// `push_to`), a checkpoint path, or a checkpoint's gs://, s3:// URL.
    resume_from_checkpoint: Option<String> = None,
    /// A gs://, s3:// (or local) folder the checkpoints and the final model
    /// are uploaded to in the background, as `hub_strategy` says (the
    /// PushToHub role; credentials come from the environment).
    push_to: Option<String> = None,
    /// `end`, `every_save`, `checkpoint` or `all_checkpoints`.
    hub_strategy: HubStrategy = HubStrategy::EverySave,
    /// Any of `jsonl`, `tensorboard`, or `none`.
    report_to: Vec<String> = vec!["jsonl".into()],
    /// Data-parallel replicas (in each process, under `mpirun`).
    num_replicas: usize = 1,
    /// Seconds a collective across processes (MPI) may wait for the other
    /// processes before the job is aborted.
    collective_timeout: f64 = lazytrain_dist::DEFAULT_COLLECTIVE_TIMEOUT.as_secs_f64(),
    /// Fraction of tokens the MLM collator predicts.
    mlm_probability: f64 = 0.15,
    /// Compute the masked-LM head (vocabulary logits) at every token, as
    /// Hugging Face's `BertForMaskedLM` does, instead of only at the labelled
    /// positions (BERT's `max_predictions_per_seq`; the same loss, a
    /// fraction of the head's work).
    mlm_dense_head: bool = false,
    /// Batches the loader prepares ahead.
    dataloader_prefetch: usize = 2,
    /// Skip corrupt records instead of failing.
    skip_corrupt: bool = false,
    /// Stop when the eval loss has not improved for this many evaluations.
    early_stopping_patience: Option<u64> = None,
}

fn invalid(detail: String) -> Error {
    Error::Input(format!("invalid training arguments: {detail}"))
}

/// The first setting of a TOML config whose value is `nan` or `inf`, named
/// (every number of the arguments must be finite; later steps would see it
/// only as a JSON `null`).
fn non_finite_setting(text: &str) -> Option<String> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let (key, value) = table.iter().find(|(_, v)| v.as_float().is_some_and(|f| !f.is_finite()))?;
    Some(format!("{key} = {value}: every number must be finite"))
}

impl TrainingArguments {
    /// Read a `.toml` or `.json` file (unknown keys are errors that list the valid ones).
    pub fn from_file(path: &Path) -> Result<TrainingArguments> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Input(format!("{}: cannot read the config: {e}", path.display())))?;
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => {
                non_finite_setting(&text).map_or_else(|| toml::from_str(&text).map_err(|e| e.to_string()), Err)
            }
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
                (
                    "resume_from_checkpoint" | "output_dir" | "lr_scheduler_type" | "metric_for_best_model" | "push_to",
                    r,
                ) => {
                    serde_json::json!(r)
                }
                (_, r) => serde_json::from_str(r).unwrap_or_else(|_| serde_json::json!(r)),
            };
            value[key] = parsed;
        }
        serde_json::from_value(value.clone()).map_err(|e| {
            // Name the flag whose value does not fit its field.
            let culprit = overrides.iter().find(|(key, _)| {
                let mut alone = serde_json::to_value(TrainingArguments::default()).unwrap_or_default();
                alone[key.as_str()] = value[key.as_str()].clone();
                serde_json::from_value::<TrainingArguments>(alone).is_err()
            });
            match culprit {
                Some((key, raw)) => invalid(format!("{key} = {raw:?}: {e}")),
                None => invalid(e.to_string()),
            }
        })
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
        if let Some(url) = &self.push_to {
            lazytrain_storage::StorageUrl::parse(url).map_err(|e| invalid(format!("push_to: {e}")))?;
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
        if self.max_eval_samples == Some(0) {
            return Err(invalid(
                "max_eval_samples must be at least 1 (leave it unset to evaluate every record)".into(),
            ));
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
        for (name, beta) in [("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(invalid(format!("{name} must be in [0, 1), got {beta}")));
            }
        }
        if self.adam_epsilon < 0.0 {
            return Err(invalid(format!("adam_epsilon must not be negative, got {}", self.adam_epsilon)));
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
        if !self.dataloader_drop_last {
            return Err(invalid(
                "dataloader_drop_last = false is not supported: training batches always have the same shape (as \
                 on XLA), so an epoch's last partial batch is dropped; leave it true"
                    .into(),
            ));
        }
        if !(1..=lazytrain_dist::MAX_REPLICAS).contains(&self.num_replicas) {
            return Err(invalid(format!(
                "num_replicas must be in 1..={} (threads of one process), got {}",
                lazytrain_dist::MAX_REPLICAS,
                self.num_replicas
            )));
        }
        if self.dataloader_prefetch > MAX_PREFETCH {
            return Err(invalid(format!(
                "dataloader_prefetch must be at most {MAX_PREFETCH} batches, got {}",
                self.dataloader_prefetch
            )));
        }
        if !(self.mlm_probability > 0.0 && self.mlm_probability <= 1.0) {
            return Err(invalid(format!(
                "mlm_probability must be in (0, 1] (at 0 no token is masked and nothing is learned), got {}",
                self.mlm_probability
            )));
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
