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
mod replicas;
pub mod state;
pub mod task;

pub use args::{IntervalStrategy, TrainingArguments};
pub use callbacks::{Control, EarlyStopping, TrainerCallback};
pub use replicas::run_replicas;
pub use state::{RngState, SchedulerState, TrainerState};
pub use task::{EvalMetrics, TaskData};

use crate::{Error, Result};
use checkpoint::{checkpoints, latest_checkpoint, read_json, rotate, save_checkpoint, CheckpointContents};
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DType, Device, PrecisionGuard, Tensor};
use lazytrain_data::classification::ClassificationManifest;
use lazytrain_data::dataset::{EpochSampler, ShardedDataset};
use lazytrain_data::loader::{DeviceBatch, DeviceLoader, LoaderPlan};
use lazytrain_data::prepare::progress_bar;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ForMaskedLM, ForSequenceClassification, TaskModel};
use lazytrain_nn::optim::{clip_grad_norm, decay_groups, AdamW, AdamWConfig, LrSchedule, Optimizer, ScheduleKind};
use lazytrain_nn::state::load_safetensors;
use lazytrain_nn::{named_parameters, Context};
use logs::LogSinks;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Replica `r` seeds its dropout with `seed + r * REPLICA_SEED_STRIDE`.
const REPLICA_SEED_STRIDE: i64 = 1_000_000_007;

/// `[mean of loss over the replicas, number of replicas that saw Ctrl-C]`.
fn replica_mean_and_flag(loss: &Tensor, stop: bool) -> Result<Tensor> {
    let device = loss.device();
    let flag = Tensor::from_vec(vec![if stop { 1.0f32 } else { 0.0 }], [1], device)?;
    let both = Tensor::cat(&[&loss.reshape([1])?, &flag], 0)?;
    let mean = both.all_reduce(AllReduceOp::Mean)?;
    Ok(mean)
}

/// Wait until every replica of the device's group gets here (a one-element
/// all-reduce that is read back).
fn replica_barrier(device: &Device) -> Result<()> {
    Tensor::zeros([1], DType::F32, device)?.all_reduce(AllReduceOp::Sum)?.to_vec::<f32>()?;
    Ok(())
}

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

/// Trains a model with a task head: a masked LM ([`Trainer::new`]) or a
/// sequence classifier ([`Trainer::for_classification`]).
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
        let max = model.config().max_sequence_length();
        if block_size > max {
            return Err(Error::Input(format!(
                "the data has blocks of {block_size} tokens but the model accepts at most {max} positions; prepare the data with --block-size {max} or less"
            )));
        }
        Trainer::with_task(args, model, tokenizer, train, eval, TaskData::MaskedLm { block_size }, device)
    }
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
        let max = model.config().max_sequence_length();
        if manifest.max_length > max {
            return Err(Error::Input(format!(
                "the data has sequences of up to {} tokens but the model accepts at most {max} positions; prepare the data with --max-length {max} or less",
                manifest.max_length
            )));
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
        let (_, world) = device.replica_position();
        if world != args.num_replicas {
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

    /// Where the backward pass keeps its activations in bf16, when
    /// `bf16_saved_activations` is set.
    fn saved_activations(&self) -> Result<Option<PrecisionGuard>> {
        Ok(if self.args.bf16_saved_activations { Some(self.device.save_activations_as(DType::BF16)?) } else { None })
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

    fn collator(&self, seed: u64) -> task::TaskCollator {
        self.task.collator(&self.tokenizer, self.args.mlm_probability, seed)
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
            Some("true") => latest_checkpoint(output).map(Some).ok_or_else(|| {
                Error::Input(format!(
                    "resume_from_checkpoint = true but {} holds no complete checkpoint",
                    output.display()
                ))
            }),
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
    /// them for this run's.
    fn check_output_dir(&self) -> Result<()> {
        let output = Path::new(&self.args.output_dir);
        let resuming = !matches!(self.args.resume_from_checkpoint.as_deref(), None | Some("false"));
        let earlier = checkpoints(output);
        if !earlier.is_empty() && !resuming {
            if !self.args.overwrite_output_dir {
                return Err(Error::Input(format!(
                    "{} already holds checkpoints; pass --resume-from-checkpoint true to continue, or --overwrite-output-dir true to start over",
                    output.display()
                )));
            }
            if self.is_master() {
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
        std::fs::create_dir_all(output).map_err(|e| Error::Input(format!("{}: {e}", output.display())))
    }

    /// Run the loop: returns when `max_steps` are done, a callback stops it,
    /// or Ctrl-C (after a checkpoint). A NaN/Inf loss stops with an error
    /// naming the step; the last good checkpoint stays as it was.
    pub fn train(&mut self) -> Result<TrainOutput> {
        self.check_output_dir()?;
        let total = self.total_steps()?;
        let schedule = self.schedule(total)?;
        let mut optimizer = self.optimizer()?;
        let output_dir = PathBuf::from(&self.args.output_dir);
        self.state = TrainerState {
            max_steps: total,
            logging_steps: self.args.logging_steps,
            eval_steps: self.args.eval_steps.unwrap_or(self.args.logging_steps),
            save_steps: self.args.save_steps,
            train_batch_size: self.args.per_device_train_batch_size,
            num_train_epochs: self.args.num_train_epochs,
            ..TrainerState::default()
        };
        if let Some(dir) = self.resume_dir()? {
            self.restore(&dir, &mut optimizer)?;
        }
        let (rank, world) = self.replica_position();
        let master = rank == 0;
        let report_to = if master { self.args.report_to.clone() } else { Vec::new() };
        let mut sinks = LogSinks::open(&output_dir, &report_to)?;
        let accumulation = self.args.gradient_accumulation_steps;
        let batch_size = self.args.per_device_train_batch_size;
        let batches_per_epoch = self.batches_per_epoch()?;
        let remaining = total.saturating_sub(self.state.global_step);
        let sampler = EpochSampler::new(self.train.len(), self.args.seed, true, rank, world)?;
        let plan = LoaderPlan {
            batch_size,
            prefetch: self.args.dataloader_prefetch,
            start_epoch: self.state.data_epoch,
            start_sample: self.state.data_sample,
            max_batches: Some(remaining.saturating_mul(accumulation as u64)),
            epochs: u64::MAX,
        };
        let mut loader =
            DeviceLoader::new(self.train.clone(), sampler, self.collator(self.args.seed), plan, &self.device)?;
        let params: Vec<Tensor> = named_parameters(&self.model).into_iter().map(|(_, t)| t).collect();
        let bar = progress_bar(total, self.show_progress && master, "step {pos}/{len} [{bar:30}] {msg} eta {eta}");
        bar.set_position(self.state.global_step);
        for cb in &mut self.callbacks {
            cb.on_train_begin(&self.state);
        }
        let start = Instant::now();
        let mut losses = Vec::new();
        let (mut logged_loss, mut logged_steps, mut tokens) = (0f64, 0u64, 0u64);
        let mut interrupted = false;
        while self.state.global_step < total {
            let mut window: Vec<DeviceBatch> = Vec::with_capacity(accumulation);
            for _ in 0..accumulation {
                match loader.next() {
                    Some(batch) => window.push(batch?),
                    None => break,
                }
            }
            if window.len() < accumulation {
                break;
            }
            let step = self.state.global_step;
            let labelled: usize = window.iter().map(|b| b.label_count).sum();
            let scale = Tensor::scalar(1.0f32 / labelled.max(1) as f32, &self.device);
            // Each replica draws its own dropout masks.
            let dropout_seed = (self.args.seed as i64).wrapping_add((rank as i64).wrapping_mul(REPLICA_SEED_STRIDE));
            let ctx = Context::train(&self.device, dropout_seed, step as i64)?;
            let mut step_loss: Option<Tensor> = None;
            for batch in &window {
                let types = batch.token_type_ids.as_ref();
                let autocast = self.autocast()?;
                let logits = self.model.forward(&batch.input_ids, Some(&batch.attention_mask), types, &ctx)?;
                drop(autocast);
                let loss = logits.cross_entropy_sum(&batch.labels, -100)?.mul(&scale)?;
                let saving = self.saved_activations()?;
                loss.backward()?;
                drop(saving);
                step_loss = Some(match step_loss {
                    Some(l) => l.add(&loss)?,
                    None => loss,
                });
            }
            // Replicas average their gradients before clipping, so all clip
            // and apply the same update.
            lazytrain_dist::reduce_gradients(&optimizer)?;
            if self.args.max_grad_norm > 0.0 {
                clip_grad_norm(&params, self.args.max_grad_norm)?;
            }
            let lr = schedule.lr_at(step);
            optimizer.set_lr(lr);
            optimizer.step()?;
            optimizer.zero_grad();
            // The logged loss is the mean over replicas, and Ctrl-C stops
            // every replica after the same step.
            let stop_requested = world > 1 && INTERRUPTED.load(Ordering::SeqCst);
            let shared = match step_loss {
                Some(loss) if world > 1 => Some(replica_mean_and_flag(&loss, stop_requested)?),
                other => other,
            };
            self.device.mark_step()?;
            let (loss_value, interrupt_seen) = match shared {
                Some(t) if world > 1 => {
                    let v = t.to_vec::<f32>()?;
                    (v[0], v[1] > 0.0)
                }
                Some(t) => (t.item::<f32>()?, false),
                None => (f32::NAN, false),
            };
            if !loss_value.is_finite() {
                bar.abandon();
                let kept = latest_checkpoint(&output_dir).map_or("no checkpoint was saved".to_string(), |p| {
                    format!("the last good checkpoint is {}", p.display())
                });
                return Err(Error::Input(format!(
                    "the loss became {loss_value} at step {}; training stopped ({kept}); lower the learning rate or check the data",
                    step + 1
                )));
            }
            let last = window.last().expect("a full window");
            let next_sample = last.first_sample + batch_size;
            (self.state.data_epoch, self.state.data_sample) =
                if next_sample + batch_size > (batches_per_epoch as usize) * batch_size {
                    (last.epoch + 1, 0)
                } else {
                    (last.epoch, next_sample)
                };
            self.state.global_step += 1;
            self.state.epoch = (self.state.data_epoch as f64)
                + self.state.data_sample as f64 / (batches_per_epoch as usize * batch_size) as f64;
            losses.push(loss_value);
            logged_loss += loss_value as f64;
            logged_steps += 1;
            tokens +=
                (world * window.iter().map(|b| b.input_ids.dims().iter().product::<usize>()).sum::<usize>()) as u64;
            let gs = self.state.global_step;
            let mut control = Control::default();
            for cb in &mut self.callbacks {
                control.should_stop |= cb.on_step_end(&self.state).should_stop;
            }
            let elapsed = start.elapsed().as_secs_f64().max(1e-9);
            bar.set_position(gs);
            bar.set_message(format!("loss {loss_value:.4} lr {lr:.2e} {:.0} tok/s", tokens as f64 / elapsed));
            if gs.is_multiple_of(self.args.logging_steps) || (self.args.logging_first_step && gs == 1) || gs == total {
                let entry = json!({
                    "loss": logged_loss / logged_steps as f64, "learning_rate": lr, "epoch": self.state.epoch,
                    "step": gs, "tokens_per_second": tokens as f64 / elapsed,
                });
                (logged_loss, logged_steps) = (0.0, 0);
                self.log(entry, &mut sinks)?;
            }
            let epoch_ended = self.state.data_sample == 0;
            let due = |strategy: IntervalStrategy, every: u64| match strategy {
                IntervalStrategy::No => false,
                IntervalStrategy::Steps => gs.is_multiple_of(every.max(1)),
                IntervalStrategy::Epoch => epoch_ended,
            };
            if due(self.args.eval_strategy, self.state.eval_steps) {
                let metrics = self.evaluate_and_log(&mut sinks)?;
                for cb in &mut self.callbacks {
                    control.should_stop |= cb.on_evaluate(&self.state, &metrics).should_stop;
                }
            }
            interrupted = if world > 1 { interrupt_seen } else { INTERRUPTED.swap(false, Ordering::SeqCst) };
            if interrupted || due(self.args.save_strategy, self.args.save_steps) {
                self.checkpoint(&optimizer, &schedule, &output_dir)?;
            }
            if interrupted || control.should_stop {
                break;
            }
        }
        bar.finish_and_clear();
        drop(loader);
        for cb in &mut self.callbacks {
            cb.on_train_end(&self.state);
        }
        let seconds = start.elapsed().as_secs_f64();
        if world > 1 {
            INTERRUPTED.store(false, Ordering::SeqCst);
            // The master may still be writing the last checkpoint.
            replica_barrier(&self.device)?;
        }
        if !interrupted && self.args.load_best_model_at_end {
            self.load_best_model()?;
        }
        if !interrupted && master {
            crate::folder::save_folder(&output_dir, &self.model, self.model.config(), &self.tokenizer)?;
            let text = serde_json::to_string_pretty(&self.state).map_err(|e| Error::Input(e.to_string()))?;
            lazytrain_nn::state::write_atomically(&output_dir.join("trainer_state.json"), text.as_bytes())?;
        }
        let training_loss = losses.iter().map(|&l| l as f64).sum::<f64>() / losses.len().max(1) as f64;
        Ok(TrainOutput {
            global_step: self.state.global_step,
            training_loss,
            losses,
            interrupted,
            seconds,
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
        })
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

    /// Load the weights of `best_model_checkpoint` (`load_best_model_at_end`).
    fn load_best_model(&mut self) -> Result<()> {
        let Some(best) = self.state.best_model_checkpoint.clone() else { return Ok(()) };
        let weights = Path::new(&best).join("model.safetensors");
        hub::load_weights(&self.model, self.model.config().model_type, &weights, &self.device, &|_| false)?;
        if self.show_progress {
            eprintln!(
                "loaded the best model from {best} ({} = {})",
                self.args.best_metric_key(),
                self.state.best_metric.unwrap_or(f64::NAN)
            );
        }
        Ok(())
    }

    fn checkpoint(&mut self, optimizer: &AdamW, schedule: &LrSchedule, output_dir: &Path) -> Result<PathBuf> {
        let scheduler = SchedulerState {
            lr_scheduler_type: self.args.lr_scheduler_type.clone(),
            base_lr: schedule.base_lr,
            warmup_steps: schedule.warmup_steps,
            total_steps: schedule.total_steps,
            last_step: self.state.global_step,
        };
        let rng = RngState {
            seed: self.args.seed,
            dropout_step: self.state.global_step,
            data_epoch: self.state.data_epoch,
            data_sample: self.state.data_sample,
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
            rotate(output_dir, limit, self.state.best_model_checkpoint.as_deref())?;
        }
        for cb in &mut self.callbacks {
            cb.on_save(&self.state, &path);
        }
        Ok(path)
    }

    /// Restore weights, optimizer, schedule position, RNG and data position.
    fn restore(&mut self, dir: &Path, optimizer: &mut AdamW) -> Result<()> {
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
        if rng.seed != self.args.seed {
            return Err(Error::Input(format!(
                "{} was trained with seed {}, not {}; resume with the same seed to continue the same run",
                dir.display(),
                rng.seed,
                self.args.seed
            )));
        }
        // This run's intervals apply from here on (as in Hugging Face, which
        // recomputes them from the arguments after loading the state).
        let TrainerState { max_steps, logging_steps, eval_steps, save_steps, .. } = self.state;
        self.state = TrainerState { max_steps, logging_steps, eval_steps, save_steps, ..saved };
        self.device.sync()?;
        Ok(())
    }
}
