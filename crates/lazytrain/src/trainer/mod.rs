//! The `Trainer`: Hugging Face's training loop on lazy tensors.
//!
//! Each optimizer step (all its gradient-accumulation micro-batches, the
//! backward passes, clipping and the AdamW update) is one traced graph,
//! compiled once. The `DeviceLoader` prepares the next batches while a step
//! runs. Checkpoints hold everything needed to continue bit for bit.

pub mod args;
pub mod callbacks;
pub mod checkpoint;
mod evaluate;
pub mod events;
mod logs;
pub mod plan;
pub mod push;
mod replicas;
pub mod state;
pub mod task;
mod train_loop;

pub use args::{HubStrategy, IntervalStrategy, TrainingArguments};
pub use callbacks::{Control, EarlyStopping, TrainerCallback};
pub use replicas::{run_replicas, run_replicas_for};
pub use state::{RngState, SchedulerState, TrainerState};
pub use task::{EvalMetrics, TaskData};

use crate::{Error, Result};
use checkpoint::{checkpoints, latest_checkpoint, read_json, rotate, save_checkpoint, CheckpointContents};
use lazytrain_core::{DType, Device, PrecisionGuard};
use lazytrain_data::classification::ClassificationManifest;
use lazytrain_data::dataset::{EpochSampler, ShardedDataset};
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ForMaskedLM, ForSequenceClassification, Gpt2LMHeadModel, TaskModel};
use lazytrain_nn::named_parameters;
use lazytrain_nn::optim::{decay_groups, AdamW, AdamWConfig, LrSchedule, Optimizer, ScheduleKind};
use lazytrain_nn::state::load_safetensors;
use logs::LogSinks;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Replica `r` seeds its dropout with `seed + r * REPLICA_SEED_STRIDE`.
const REPLICA_SEED_STRIDE: i64 = 1_000_000_007;

/// Set by Ctrl-C: the loop saves a checkpoint and returns.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Install the Ctrl-C handler (once per process).
pub fn install_interrupt_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    });
}

/// How a training run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOutput {
    /// Optimizer steps done.
    pub global_step: u64,
    /// Mean training loss over the steps of this run.
    pub training_loss: f64,
    /// Every step's loss in this run.
    pub losses: Vec<f32>,
    /// Ctrl-C stopped the run (after saving).
    pub interrupted: bool,
    /// Wall time of the loop.
    pub seconds: f64,
    /// Training tokens per second (all micro-batches).
    pub tokens_per_second: f64,
}

/// Trains a model with a task head: a masked LM ([`Trainer::new`]), a
/// causal LM ([`Trainer::for_causal_lm`]) or a sequence classifier
/// ([`Trainer::for_classification`]).
pub struct Trainer<M: TaskModel = ForMaskedLM> {
    /// The arguments.
    pub args: TrainingArguments,
    /// The model.
    pub model: M,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
    /// The run's state.
    pub state: TrainerState,
    device: Device,
    train: Arc<ShardedDataset>,
    eval: Option<Arc<ShardedDataset>>,
    callbacks: Vec<Box<dyn TrainerCallback>>,
    task: TaskData,
    show_progress: bool,
    /// The step of the last evaluation that set a new best metric.
    new_best_at: Option<u64>,
    /// Uploads to `push_to` (the master replica, while training).
    sync: Option<push::CheckpointSync>,
}

impl Trainer<ForMaskedLM> {
    /// A masked-LM trainer over `prepare` shards (`block_size` tokens per record).
    pub fn new(
        args: TrainingArguments,
        model: ForMaskedLM,
        tokenizer: TextTokenizer,
        train: Arc<ShardedDataset>,
        eval: Option<Arc<ShardedDataset>>,
        block_size: usize,
        device: &Device,
    ) -> Result<Trainer> {
        check_fits_positions(model.config(), "the data", block_size, "--block-size")?;
        Trainer::with_task(args, model, tokenizer, train, eval, TaskData::MaskedLm { block_size }, device)
    }
}

impl Trainer<Gpt2LMHeadModel> {
    /// A causal-LM trainer over `prepare` shards (`block_size` tokens per
    /// record): every token predicts the next, as `run_clm.py` trains GPT-2.
    pub fn for_causal_lm(
        args: TrainingArguments,
        model: Gpt2LMHeadModel,
        tokenizer: TextTokenizer,
        train: Arc<ShardedDataset>,
        eval: Option<Arc<ShardedDataset>>,
        block_size: usize,
        device: &Device,
    ) -> Result<Trainer<Gpt2LMHeadModel>> {
        check_fits_positions(model.config(), "the data", block_size, "--block-size")?;
        Trainer::with_task(args, model, tokenizer, train, eval, TaskData::CausalLm { block_size }, device)
    }
}

/// Refuse `data` (as a message names it: "the data", "the eval data DIR")
/// whose sequences of `tokens` exceed `config`'s positions; `flag` is the
/// `prepare` flag that sets their length.
pub fn check_fits_positions(
    config: &lazytrain_models::ModelConfig,
    data: &str,
    tokens: usize,
    flag: &str,
) -> Result<()> {
    let max = config.max_sequence_length();
    if tokens > max {
        return Err(Error::Input(format!(
            "{data} has sequences of {tokens} tokens but the model accepts at most {max} positions; prepare it with \
             {flag} {max} or less"
        )));
    }
    Ok(())
}

/// Refuse text pairs whose second text the tokenizer gives a token type
/// the model has no embedding for (a BERT tokenizer's type 1 with a RoBERTa
/// model of one token type): the first step would fail on a gather index.
fn check_pair_token_types(tokenizer: &TextTokenizer, config: &lazytrain_models::ModelConfig) -> Result<()> {
    let encoding = tokenizer
        .inner()
        .encode(("a", "b"), true)
        .map_err(|e| Error::Input(format!("the tokenizer cannot encode a pair of texts: {e}")))?;
    let highest = encoding.get_type_ids().iter().copied().max().unwrap_or(0) as usize;
    if highest >= config.type_vocab_size {
        return Err(Error::Input(format!(
            "the tokenizer gives the second text of a pair token type {highest}, but the model has \
             type_vocab_size {}; fine-tune a model with {} token types (BERT's 2) or use the model's own tokenizer",
            config.type_vocab_size,
            highest + 1
        )));
    }
    Ok(())
}

impl Trainer<ForSequenceClassification> {
    /// A sequence-classification trainer over `prepare-classification`
    /// shards described by `manifest`; the model has one output per label.
    pub fn for_classification(
        args: TrainingArguments,
        model: ForSequenceClassification,
        tokenizer: TextTokenizer,
        train: Arc<ShardedDataset>,
        eval: Option<Arc<ShardedDataset>>,
        manifest: &ClassificationManifest,
        device: &Device,
    ) -> Result<Trainer<ForSequenceClassification>> {
        if model.num_labels() != manifest.labels.len() {
            return Err(Error::Input(format!(
                "the model has {} outputs but the data has {} labels ({}); pass --num-labels {}",
                model.num_labels(),
                manifest.labels.len(),
                manifest.labels.join(", "),
                manifest.labels.len()
            )));
        }
        if let Some(kind) = model.config().problem_type.as_deref().filter(|k| *k != "single_label_classification") {
            return Err(Error::Input(format!(
                "the model's config.json has problem_type `{kind}`, but the Trainer fine-tunes single-label \
                 classifiers (cross-entropy); set problem_type to single_label_classification or remove it"
            )));
        }
        check_fits_positions(model.config(), "the data", manifest.max_length, "--max-length")?;
        if manifest.columns.text_pair.is_some() {
            check_pair_token_types(&tokenizer, model.config())?;
        }
        let task =
            TaskData::SequenceClassification { max_length: manifest.max_length, labels: manifest.labels.clone() };
        Trainer::with_task(args, model, tokenizer, train, eval, task, device)
    }
}

impl<M: TaskModel> Trainer<M> {
    fn with_task(
        args: TrainingArguments,
        model: M,
        tokenizer: TextTokenizer,
        train: Arc<ShardedDataset>,
        eval: Option<Arc<ShardedDataset>>,
        task: TaskData,
        device: &Device,
    ) -> Result<Trainer<M>> {
        args.validate(eval.is_some())?;
        if eval.as_ref().is_some_and(|e| e.is_empty()) {
            return Err(Error::Input(
                "the eval data holds no records; prepare it again with more text or a larger --validation-fraction, \
                 or leave out --eval-data"
                    .into(),
            ));
        }
        crate::folder::check_tokenizer_fits(model.config(), &tokenizer)?;
        let key = args.best_metric_key();
        if eval.is_some() && !task.metric_keys().contains(&key.as_str()) {
            return Err(Error::Input(format!(
                "metric_for_best_model `{}` is not among this task's eval metrics ({}); use one of them",
                args.metric_for_best_model,
                task.metric_keys().join(", ")
            )));
        }
        let (_, world) = device.replica_position();
        // Under `mpirun -n N` every process runs num_replicas of them.
        let processes = lazytrain_dist::mpi_job_position().map_or(1, |(_, size)| size);
        if world != args.num_replicas * processes {
            return Err(Error::Input(format!(
                "num_replicas = {} but the trainer's device is one of {world} replicas; build each replica's trainer inside `trainer::run_replicas`",
                args.num_replicas
            )));
        }
        let mut callbacks: Vec<Box<dyn TrainerCallback>> = Vec::new();
        if let Some(patience) = args.early_stopping_patience {
            let stopping = EarlyStopping::new(patience, 0.0)
                .on_metric(&args.best_metric_key(), args.best_metric_greater_is_better());
            callbacks.push(Box::new(stopping));
        }
        Ok(Trainer {
            args,
            model,
            tokenizer,
            state: TrainerState::default(),
            device: device.clone(),
            train,
            eval,
            callbacks,
            task,
            show_progress: false,
            new_best_at: None,
            sync: None,
        })
    }

    /// Draw a progress bar while training.
    pub fn with_progress_bar(mut self, show: bool) -> Trainer<M> {
        self.show_progress = show;
        self
    }

    /// Add a callback.
    pub fn add_callback(&mut self, callback: Box<dyn TrainerCallback>) {
        self.callbacks.push(callback);
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bf16 autocast region of a forward pass, when `bf16` is set.
    fn autocast(&self) -> Result<Option<PrecisionGuard>> {
        Ok(if self.args.bf16 { Some(self.device.autocast(DType::BF16)?) } else { None })
    }

    /// This trainer's replica rank and the number of replicas (its device's
    /// place in a replica group; `(0, 1)` for a lone device).
    pub fn replica_position(&self) -> (usize, usize) {
        self.device.replica_position()
    }

    /// True on the replica that logs and writes checkpoints.
    pub fn is_master(&self) -> bool {
        self.replica_position().0 == 0
    }

    /// What the trainer trains on.
    pub fn task(&self) -> &TaskData {
        &self.task
    }

    /// The collator; training batches of a masked LM gather their labelled
    /// positions unless `mlm_dense_head` (evaluation always scores densely).
    fn collator(&self, seed: u64, training: bool) -> Result<task::TaskCollator> {
        let gather = training && !self.args.mlm_dense_head;
        let positions = self.model.config().max_sequence_length();
        Ok(self.task.collator(&self.tokenizer, self.args.mlm_probability, seed, gather, positions)?)
    }

    fn batches_per_epoch(&self) -> Result<u64> {
        let (_, world) = self.replica_position();
        let sampler = EpochSampler::new(self.train.len(), self.args.seed, true, 0, world)?;
        let per = (sampler.samples_per_epoch() / self.args.per_device_train_batch_size) as u64;
        if per < self.args.gradient_accumulation_steps as u64 {
            return Err(Error::Input(format!(
                "{} training blocks give {per} batches of {} per epoch, fewer than one optimizer step; add data or lower the batch size",
                self.train.len(),
                self.args.per_device_train_batch_size
            )));
        }
        Ok(per)
    }

    /// Total optimizer steps of the run.
    pub fn total_steps(&self) -> Result<u64> {
        if self.args.max_steps > 0 {
            return Ok(self.args.max_steps as u64);
        }
        let steps_per_epoch = self.batches_per_epoch()? / self.args.gradient_accumulation_steps as u64;
        Ok(((self.args.num_train_epochs * steps_per_epoch as f64).ceil() as u64).max(1))
    }

    fn schedule(&self, total: u64) -> Result<LrSchedule> {
        let kind = ScheduleKind::parse(&self.args.lr_scheduler_type)?;
        Ok(LrSchedule {
            kind,
            base_lr: self.args.learning_rate,
            warmup_steps: self.args.warmup_for(total),
            total_steps: total,
        })
    }

    fn optimizer(&self) -> Result<AdamW> {
        let config = AdamWConfig {
            lr: self.args.learning_rate,
            beta1: self.args.adam_beta1,
            beta2: self.args.adam_beta2,
            eps: self.args.adam_epsilon,
        };
        Ok(AdamW::new(decay_groups(named_parameters(&self.model), self.args.weight_decay), config)?)
    }

    /// Where a resumed run should continue from, per `resume_from_checkpoint`.
    fn resume_dir(&self) -> Result<Option<PathBuf>> {
        let output = Path::new(&self.args.output_dir);
        match self.args.resume_from_checkpoint.as_deref() {
            None | Some("false") => Ok(None),
            // Nothing to resume yet (a run killed before its first
            // checkpoint): start from step 0, so a restart loop can always
            // run the same command.
            Some("true") => {
                let latest = latest_checkpoint(output);
                if latest.is_none() && self.is_master() {
                    eprintln!(
                        "note: resume_from_checkpoint = true but {} holds no complete checkpoint yet; starting from step 0",
                        output.display()
                    );
                }
                Ok(latest)
            }
            Some(path) => {
                let dir = PathBuf::from(path);
                if dir.join("trainer_state.json").is_file() {
                    Ok(Some(dir))
                } else {
                    Err(Error::Input(format!("{path} is not a complete checkpoint (no trainer_state.json)")))
                }
            }
        }
    }

    /// Refuse to start a fresh run over an earlier run's checkpoints unless
    /// `overwrite_output_dir` says to; starting over then removes them (the
    /// master replica does), so rotation and a later resume never mistake
    /// them for this run's. A step only `planning` (`--dry-run`) removes
    /// nothing.
    fn check_output_dir(&self, planning: bool) -> Result<()> {
        let output = Path::new(&self.args.output_dir);
        lazytrain_core::check_output_folder("output_dir", output, "the run's checkpoints, logs and model")
            .map_err(|e| Error::Input(e.to_string()))?;
        let resuming = !matches!(self.args.resume_from_checkpoint.as_deref(), None | Some("false"));
        if self.is_master() && !planning {
            let removed = checkpoint::remove_leftovers(output)?;
            if removed > 0 {
                eprintln!(
                    "removed {removed} unfinished checkpoint folder(s) of a killed run from {}",
                    output.display()
                );
            }
        }
        let earlier = checkpoints(output);
        if !earlier.is_empty() && !resuming {
            if !self.args.overwrite_output_dir {
                return Err(Error::Input(format!(
                    "{} already holds checkpoints; pass --resume-from-checkpoint true to continue, or --overwrite-output-dir true to start over",
                    output.display()
                )));
            }
            if planning {
                eprintln!(
                    "dry run: overwrite_output_dir would remove {} checkpoint(s) from {}; nothing removed",
                    earlier.len(),
                    output.display()
                );
            } else if self.is_master() {
                for dir in &earlier {
                    std::fs::remove_dir_all(dir).map_err(|e| Error::Input(format!("{}: {e}", dir.display())))?;
                }
                eprintln!(
                    "overwrite_output_dir: removed {} checkpoint(s) of an earlier run from {}",
                    earlier.len(),
                    output.display()
                );
            }
        }
        // The master lists the bucket (a replica that fails takes the
        // others down with it): one LIST, not one per replica.
        if !resuming && self.is_master() {
            self.check_push_target(planning)?;
        }
        std::fs::create_dir_all(output).map_err(|e| Error::Input(format!("{}: {e}", output.display())))
    }

    /// The same for `push_to` on a fresh run: an earlier run's checkpoints
    /// there would be rotated away as this run's, or resumed from instead of
    /// this run's newest; `overwrite_output_dir` deletes them (not when only
    /// `planning`).
    fn check_push_target(&self, planning: bool) -> Result<()> {
        let Some(url) = &self.args.push_to else { return Ok(()) };
        let target = lazytrain_storage::StorageUrl::parse(url)?;
        let earlier = push::earlier_remote_checkpoints(&target)?;
        if earlier.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = earlier.iter().map(ToString::to_string).collect();
        if !self.args.overwrite_output_dir {
            return Err(Error::Input(format!(
                "{target} already holds checkpoints of an earlier run ({}); pass --resume-from-checkpoint true to \
                 continue it, push to another prefix, or pass --overwrite-output-dir true to start over (which \
                 deletes them)",
                names.join(", ")
            )));
        }
        if planning {
            eprintln!("dry run: overwrite_output_dir would delete {}; nothing deleted", names.join(", "));
        } else {
            push::remove_remote_checkpoints(&earlier)?;
            eprintln!("overwrite_output_dir: deleted {} of an earlier run", names.join(", "));
        }
        Ok(())
    }

    fn log(&mut self, entry: Value, sinks: &mut LogSinks) -> Result<()> {
        sinks.write(&entry)?;
        for cb in &mut self.callbacks {
            cb.on_log(&self.state, &entry);
        }
        self.state.log_history.push(entry);
        Ok(())
    }

    fn evaluate_and_log(&mut self, sinks: &mut LogSinks) -> Result<Value> {
        let start = Instant::now();
        let m = self.evaluate()?;
        let mut entry = m.log_entry();
        let key = self.args.best_metric_key();
        let Some(value) = entry.get(&key).and_then(Value::as_f64) else {
            let names: Vec<&str> = entry.keys().map(String::as_str).collect();
            return Err(Error::Input(format!(
                "metric_for_best_model `{}` is not among the eval metrics ({}); use one of them",
                self.args.metric_for_best_model,
                names.join(", ")
            )));
        };
        let better = |best: f64| {
            if self.args.best_metric_greater_is_better() {
                value > best
            } else {
                value < best
            }
        };
        self.new_best_at = None;
        if self.args.load_best_model_at_end && self.state.best_metric == Some(value) && self.is_master() {
            eprintln!(
                "warning: {key} = {value} at step {} ties the best so far ({}); the earlier checkpoint stays the best, \
                 as in Hugging Face; ties usually mean the validation split is too small to tell checkpoints apart",
                self.state.global_step,
                self.state.best_model_checkpoint.as_deref().unwrap_or("not saved yet")
            );
        }
        if self.state.best_metric.is_none_or(better) {
            self.state.best_metric = Some(value);
            self.new_best_at = Some(self.state.global_step);
        }
        entry.insert("eval_runtime".into(), json!(start.elapsed().as_secs_f64()));
        entry.insert("epoch".into(), json!(self.state.epoch));
        entry.insert("step".into(), json!(self.state.global_step));
        let entry = Value::Object(entry);
        self.log(entry.clone(), sinks)?;
        Ok(entry)
    }

    /// Load the weights of `best_model_checkpoint` (`load_best_model_at_end`):
    /// where the state says, or a checkpoint of that name in this run's
    /// output folder (a run resumed elsewhere, or on a fresh machine). If
    /// neither exists the final weights stay, with a warning, as in Hugging
    /// Face: the final model is still saved.
    fn load_best_model(&mut self) -> Result<()> {
        let Some(recorded) = self.state.best_model_checkpoint.clone() else { return Ok(()) };
        let here = Path::new(&recorded).file_name().map(|name| Path::new(&self.args.output_dir).join(name));
        let found =
            std::iter::once(PathBuf::from(&recorded)).chain(here).find(|dir| dir.join("model.safetensors").is_file());
        let Some(best) = found else {
            eprintln!(
                "warning: the best checkpoint {recorded} is not there (nor under {}); keeping the final weights",
                self.args.output_dir
            );
            return Ok(());
        };
        let weights = best.join("model.safetensors");
        hub::load_weights(&self.model, self.model.config().model_type, &weights, &self.device, &|_| false)?;
        let best = best.display();
        if self.show_progress {
            eprintln!(
                "loaded the best model from {best} ({} = {})",
                self.args.best_metric_key(),
                self.state.best_metric.unwrap_or(f64::NAN)
            );
        }
        Ok(())
    }

    /// `schedule` at the current step, as `scheduler.json` records it.
    fn scheduler_state(&self, schedule: &LrSchedule) -> SchedulerState {
        SchedulerState {
            lr_scheduler_type: self.args.lr_scheduler_type.clone(),
            base_lr: schedule.base_lr,
            warmup_steps: schedule.warmup_steps,
            total_steps: schedule.total_steps,
            last_step: self.state.global_step,
        }
    }

    fn checkpoint(&mut self, optimizer: &AdamW, schedule: &LrSchedule, output_dir: &Path) -> Result<PathBuf> {
        let scheduler = self.scheduler_state(schedule);
        let rng = RngState {
            seed: self.args.seed,
            dropout_step: self.state.global_step,
            data_epoch: self.state.data_epoch,
            data_sample: self.state.data_sample,
            replicas: Some(self.replica_position().1),
        };
        if self.new_best_at == Some(self.state.global_step) {
            let path = output_dir.join(format!("checkpoint-{}", self.state.global_step));
            self.state.best_model_checkpoint = Some(path.display().to_string());
        }
        let contents = CheckpointContents {
            model: &self.model,
            config: self.model.config(),
            tokenizer: &self.tokenizer,
            optimizer,
            scheduler: &scheduler,
            rng: &rng,
            state: &self.state,
            args: &self.args,
        };
        let path = output_dir.join(format!("checkpoint-{}", self.state.global_step));
        if !self.is_master() {
            return Ok(path);
        }
        let path = save_checkpoint(output_dir, &contents)?;
        if let Some(limit) = self.args.save_total_limit {
            rotate(output_dir, limit, self.state.best_model_checkpoint.as_deref(), &path)?;
        }
        if let Some(sync) = &mut self.sync {
            sync.checkpoint_saved(&path, output_dir)?;
        }
        for cb in &mut self.callbacks {
            cb.on_save(&self.state, &path);
        }
        Ok(path)
    }

    /// Restore weights, optimizer, schedule position, RNG and data position;
    /// `schedule` (this run's) is compared with the saved one. Returns the
    /// seed the checkpoint was trained with, which the caller compares with
    /// this run's (a mismatch is not a damaged checkpoint).
    fn restore(&mut self, dir: &Path, optimizer: &mut AdamW, schedule: &LrSchedule) -> Result<u64> {
        hub::load_weights(
            &self.model,
            self.model.config().model_type,
            &dir.join("model.safetensors"),
            &self.device,
            &|_| false,
        )?;
        optimizer.load_state_dict(&load_safetensors(&dir.join("optimizer.safetensors"), &self.device)?)?;
        let saved: TrainerState = read_json(dir, "trainer_state.json")?;
        let rng: RngState = read_json(dir, "rng_state.json")?;
        let scheduler: SchedulerState = read_json(dir, "scheduler.json")?;
        // Every file, and the folder's name, must be of the same step.
        let steps = [
            ("scheduler.json is", Some(scheduler.last_step)),
            ("optimizer.safetensors is", Some(optimizer.steps())),
            ("rng_state.json is", Some(rng.dropout_step)),
            ("the folder's name is", checkpoint::step_of(dir)),
        ];
        if let Some((what, Some(step))) = steps.iter().find(|(_, step)| step.is_some_and(|s| s != saved.global_step)) {
            return Err(Error::Input(format!(
                "{}: {what} at step {step} but trainer_state.json at step {}: the files come from two saves; \
                 resume from another checkpoint",
                dir.display(),
                saved.global_step
            )));
        }
        if rng.replicas == Some(0) {
            return Err(Error::Input(format!(
                "{}: rng_state.json says 0 replicas saved it; the file is damaged, resume from another checkpoint",
                dir.display()
            )));
        }
        // This run's intervals apply from here on (as in Hugging Face, which
        // recomputes them from the arguments after loading the state).
        let TrainerState { max_steps, logging_steps, eval_steps, save_steps, .. } = self.state;
        self.state = TrainerState { max_steps, logging_steps, eval_steps, save_steps, ..saved };
        // So does this run's schedule (a longer run, a new learning rate),
        // said once so that a changed curve is not a surprise.
        let changes = scheduler.changes_to(&self.scheduler_state(schedule));
        if !changes.is_empty() && self.is_master() {
            eprintln!(
                "note: the learning-rate schedule differs from the one {} was saved with ({}); this run's applies \
                 from step {}",
                dir.display(),
                changes.join(", "),
                self.state.global_step
            );
        }
        // Each replica's share of the data depends on the number of
        // replicas: with another number, the saved position within the
        // epoch means other samples, so the epoch starts over (the same
        // for every replica, whatever the layout).
        let world = self.replica_position().1;
        if let Some(saved_world) = rng.replicas.filter(|&w| w != world) {
            if self.is_master() {
                eprintln!(
                    "{} was saved by {saved_world} replicas and this run has {world}: data epoch {} restarts from its \
                     first sample (steps, schedule, optimizer and dropout continue)",
                    dir.display(),
                    self.state.data_epoch
                );
            }
            self.state.data_sample = 0;
        }
        self.device.sync()?;
        Ok(rng.seed)
    }
}
