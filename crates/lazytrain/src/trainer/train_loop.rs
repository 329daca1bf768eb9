//! `Trainer::train`: a loop over [`lazytrain_dist::train_step`] with the
//! bookkeeping around it (data position, logging, evaluation, checkpoints),
//! each a named step of its own.

use super::callbacks::Control;
use super::checkpoint::{checkpoints, latest_checkpoint, step_of};
use super::logs::LogSinks;
use super::plan;
use super::{IntervalStrategy, TrainOutput, Trainer, TrainerState, INTERRUPTED, REPLICA_SEED_STRIDE};
use crate::{Error, Result};
use lazytrain_core::{DType, Tensor};
use lazytrain_data::dataset::EpochSampler;
use lazytrain_data::loader::{DeviceBatch, DeviceLoader, LoaderPlan};
use lazytrain_data::prepare::progress_bar;
use lazytrain_dist::{train_step, StepConfig};
use lazytrain_models::TaskModel;
use lazytrain_nn::optim::{AdamW, LrSchedule};
use lazytrain_nn::{named_parameters, Context};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Without a terminal, a progress line is printed at least this often.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// What a training run carries from step to step.
struct Run {
    total: u64,
    schedule: LrSchedule,
    optimizer: AdamW,
    output_dir: PathBuf,
    sinks: LogSinks,
    loader: DeviceLoader,
    /// The parameters in the model's order (the order of the clip norm's sum).
    params: Vec<Tensor>,
    /// Samples per epoch that whole batches cover.
    epoch_samples: usize,
    bar: indicatif::ProgressBar,
    /// When the progress goes to a log rather than a terminal: the time of
    /// the last progress line (one per logging interval or 30 s).
    plain_progress: Option<Instant>,
    start: Instant,
    losses: Vec<f32>,
    /// Loss summed over the steps since the last log entry, and their count.
    logged: (f64, u64),
    tokens: u64,
    interrupted: bool,
    /// Masked tokens unmasked because their batch was over its label
    /// capacity (the masked-position head), since the start of the run.
    unmasked_over_capacity: u64,
}

/// One finished optimizer step, as the bookkeeping sees it.
struct StepResult {
    loss: f32,
    lr: f64,
    /// A replica saw Ctrl-C (every replica learns it in the step).
    interrupt_seen: bool,
}

impl<M: TaskModel> Trainer<M> {
    /// Train for `max_steps` (or `num_train_epochs`) optimizer steps,
    /// resuming from a checkpoint when asked, with logging, evaluation and
    /// checkpoints at their intervals. Returns when the steps are done, a
    /// callback stops it, or Ctrl-C (after a checkpoint). A NaN/Inf loss
    /// stops with an error naming the step; the last good checkpoint stays
    /// as it was.
    pub fn train(&mut self) -> Result<TrainOutput> {
        let mut run = self.begin_run(false)?;
        while self.state.global_step < run.total {
            let Some(window) = self.next_window(&mut run)? else { break };
            let step = self.run_step(&mut run, &window)?;
            self.advance(&mut run, &window, &step);
            let mut control = Control::default();
            for cb in &mut self.callbacks {
                control.should_stop |= cb.on_step_end(&self.state).should_stop;
            }
            self.report_progress(&mut run, &step)?;
            control.should_stop |= self.evaluate_if_due(&mut run)?;
            self.save_if_due(&mut run, &step)?;
            if run.interrupted || control.should_stop {
                break;
            }
        }
        self.finish_run(run)
    }

    /// Compile the first training step and plan its memory without running
    /// it (`--dry-run`): parameters, optimizer state, the rest, the largest
    /// buffers and the batch size that fits.
    pub fn plan_step(&mut self) -> Result<plan::StepPlan> {
        let mut run = self.begin_run(true)?;
        let Some(window) = self.next_window(&mut run)? else {
            return Err(Error::Input("the training data holds no full batch to plan a step with".into()));
        };
        let parameter_bytes: u64 = run.params.iter().map(|p| (p.numel() * p.dtype().size_in_bytes()) as u64).sum();
        self.device.plan_next_sync();
        let outcome = self.run_step(&mut run, &window);
        run.bar.finish_and_clear();
        let error = match outcome {
            Err(e) => e,
            Ok(_) => return Err(Error::Input("the step ran instead of being planned".into())),
        };
        plan::StepPlan::from_dry_run(error, self.args.per_device_train_batch_size, parameter_bytes, 2 * parameter_bytes)
    }

    /// Check the output folder, build the schedule, optimizer and loader,
    /// restore a checkpoint when resuming, and open the log sinks; when only
    /// `planning` a step, without removing anything from the output folder.
    fn begin_run(&mut self, planning: bool) -> Result<Run> {
        self.check_output_dir(planning)?;
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
        let resumed = self.resume_dir()?;
        if let Some(dir) = &resumed {
            let seed = self.restore(dir, &mut optimizer, &schedule).map_err(|e| {
                // Weights of another shape mean another model, which every
                // earlier checkpoint of the run shares: no checkpoint to suggest.
                let damaged = !matches!(e, Error::Model(lazytrain_models::ModelError::Checkpoint { .. }));
                let parent = dir.parent().unwrap_or(std::path::Path::new("."));
                let step = step_of(dir).unwrap_or(u64::MAX);
                let earlier = checkpoints(parent).into_iter().rev().find(|c| step_of(c).is_some_and(|s| s < step));
                Error::Resume {
                    checkpoint: dir.display().to_string(),
                    earlier: earlier.filter(|_| damaged).map(|c| c.display().to_string()),
                    source: Box::new(e),
                }
            })?;
            if seed != self.args.seed {
                return Err(Error::Input(format!(
                    "{} was trained with seed {seed}, not {}; resume with the same seed to continue the same run",
                    dir.display(),
                    self.args.seed
                )));
            }
        }
        if self.is_master() {
            self.sync = super::push::CheckpointSync::for_args(&self.args)?;
        }
        let (rank, world) = self.replica_position();
        // Replicas start from replica 0's weights and must share its seed
        // (the data order and dropout derive from it).
        let params: Vec<Tensor> = named_parameters(&self.model).into_iter().map(|(_, t)| t).collect();
        lazytrain_dist::check_same_as_master(&self.device, "seed", self.args.seed, "give every replica the same seed")?;
        // A process that found no checkpoint (a folder per host, the
        // checkpoint on the master's only) would start over at step 0.
        lazytrain_dist::check_same_as_master(
            &self.device,
            "resumed at step",
            self.state.global_step,
            "every process must read the checkpoint it resumes from: with a folder per host, copy it into each \
             host's --output-dir, pass --resume-from-checkpoint with a path every host reads, or resume from a \
             bucket (--push-to URL --resume-from-checkpoint true)",
        )?;
        lazytrain_dist::broadcast_from_master(&self.device, &params)?;
        let report_to = if rank == 0 { self.args.report_to.clone() } else { Vec::new() };
        // A resumed run continues its JSONL log; a fresh one starts it anew.
        let sinks = LogSinks::open(&output_dir, &report_to, resumed.is_some() || planning)?;
        let epoch_samples = self.batches_per_epoch()? as usize * self.args.per_device_train_batch_size;
        if self.state.data_sample >= epoch_samples {
            // Saved over more data (or a damaged file): that epoch is over here.
            if rank == 0 {
                eprintln!(
                    "note: the checkpoint's data position (sample {} of epoch {}) is past this data's epoch of {} \
                     samples; training goes on with epoch {}",
                    self.state.data_sample,
                    self.state.data_epoch,
                    epoch_samples,
                    self.state.data_epoch + 1
                );
            }
            (self.state.data_epoch, self.state.data_sample) = (self.state.data_epoch + 1, 0);
        }
        let remaining = total.saturating_sub(self.state.global_step);
        let sampler = EpochSampler::new(self.train.len(), self.args.seed, true, rank, world)?;
        let plan = LoaderPlan {
            batch_size: self.args.per_device_train_batch_size,
            prefetch: self.args.dataloader_prefetch,
            start_epoch: self.state.data_epoch,
            start_sample: self.state.data_sample,
            max_batches: Some(remaining.saturating_mul(self.args.gradient_accumulation_steps as u64)),
            epochs: u64::MAX,
        };
        let loader =
            DeviceLoader::new(self.train.clone(), sampler, self.collator(self.args.seed, true)?, plan, &self.device)?;
        let bar = progress_bar(total, self.show_progress && rank == 0, "step {pos}/{len} [{bar:30}] {msg} eta {eta}");
        bar.set_position(self.state.global_step);
        for cb in &mut self.callbacks {
            cb.on_train_begin(&self.state);
        }
        Ok(Run {
            total,
            schedule,
            optimizer,
            output_dir,
            sinks,
            loader,
            params,
            epoch_samples,
            bar,
            plain_progress: (self.show_progress && rank == 0 && !std::io::stderr().is_terminal()).then(Instant::now),
            start: Instant::now(),
            losses: Vec::new(),
            logged: (0.0, 0),
            tokens: 0,
            interrupted: false,
            unmasked_over_capacity: 0,
        })
    }

    /// The micro-batches of the next optimizer step (`None`: the data ran out).
    fn next_window(&self, run: &mut Run) -> Result<Option<Vec<DeviceBatch>>> {
        let accumulation = self.args.gradient_accumulation_steps;
        let mut window = Vec::with_capacity(accumulation);
        for _ in 0..accumulation {
            match run.loader.next() {
                Some(batch) => window.push(batch?),
                None => return Ok(None),
            }
        }
        Ok(Some(window))
    }

    /// Trace and run one optimizer step over `window`; a loss that is not
    /// finite stops training with an error naming the last good checkpoint.
    fn run_step(&mut self, run: &mut Run, window: &[DeviceBatch]) -> Result<StepResult> {
        let step = self.state.global_step;
        // The step's collectives carry it: replicas a step apart fail by name.
        self.device.set_step_tag(step);
        let (rank, world) = self.replica_position();
        let labelled: usize = window.iter().map(|b| b.label_count).sum();
        let unmasked: usize = window.iter().map(|b| b.unmasked_over_capacity).sum();
        if unmasked > 0 {
            run.unmasked_over_capacity += unmasked as u64;
            eprintln!(
                "note: step {}: {unmasked} masked tokens over the batch's label capacity were left unmasked \
                 (expected about once in 10^15 batches; see mlm_unmasked_over_capacity in the log)",
                step + 1
            );
        }
        let scale = Tensor::scalar(1.0f32 / labelled.max(1) as f32, &self.device);
        // Each replica draws its own dropout masks.
        let dropout_seed = (self.args.seed as i64).wrapping_add((rank as i64).wrapping_mul(REPLICA_SEED_STRIDE));
        let ctx = Context::train(&self.device, dropout_seed, step as i64)?;
        let lr = run.schedule.lr_at(step);
        let config = StepConfig {
            autocast: self.args.bf16.then_some(DType::BF16),
            saved_activations: self.args.bf16_saved_activations.then_some(DType::BF16),
            clip: (self.args.max_grad_norm > 0.0).then_some((run.params.as_slice(), self.args.max_grad_norm)),
            learning_rate: Some(lr),
        };
        // Ctrl-C on any replica stops every replica after the same step.
        let stop_flag: Vec<f32> = match world > 1 {
            true => vec![if INTERRUPTED.load(Ordering::SeqCst) { 1.0 } else { 0.0 }],
            false => Vec::new(),
        };
        if step == 2 && rank == 1 && std::env::var("LAZYTRAIN_FAULT_INJECT").is_ok_and(|v| v == "stall-replica-1") {
            // Fault injection for the collective-timeout test: a replica
            // that never reaches its next collective (a hung host).
            loop {
                std::thread::park();
            }
        }
        let model = &self.model;
        let output = train_step(&self.device, &mut run.optimizer, window, &config, &stop_flag, |batch| -> Result<_> {
            let (ids, mask, types) = (&batch.input_ids, Some(&batch.attention_mask), batch.token_type_ids.as_ref());
            // The head at the labelled positions only, when the batch gathered them.
            if let Some((positions, labels)) = &batch.selected {
                if let Some(logits) = model.forward_at(ids, mask, types, positions, &ctx)? {
                    return Ok(logits.cross_entropy_sum(labels, -100)?.mul(&scale)?);
                }
            }
            let logits = model.forward(ids, mask, types, &ctx)?;
            Ok(logits.cross_entropy_sum(&model.targets(&batch.labels)?, -100)?.mul(&scale)?)
        })?;
        let (loss, shared) = output.values()?;
        if !loss.is_finite() {
            run.bar.abandon();
            let kept = latest_checkpoint(&run.output_dir).map_or("no checkpoint was saved".to_string(), |p| {
                format!("the last good checkpoint is {}", p.display())
            });
            // Before this run's first update the learning rate played no part.
            let fix = match run.losses.is_empty() {
                true => {
                    "the weights it started from hold non-finite values or its config.json a broken setting \
                         (such as layer_norm_eps), or the data is broken; check the model folder"
                }
                false => "lower the learning rate or check the data",
            };
            return Err(Error::Input(format!(
                "the loss became {loss} at step {}; training stopped ({kept}); {fix}",
                step + 1
            )));
        }
        Ok(StepResult { loss, lr, interrupt_seen: shared.first().is_some_and(|&flag| flag > 0.0) })
    }

    /// Move the data position, step counter and epoch past `window`.
    fn advance(&mut self, run: &mut Run, window: &[DeviceBatch], step: &StepResult) {
        let batch_size = self.args.per_device_train_batch_size;
        let epoch_samples = run.epoch_samples;
        let last = window.last().expect("a full window");
        let next_sample = last.first_sample + batch_size;
        (self.state.data_epoch, self.state.data_sample) =
            if next_sample + batch_size > epoch_samples { (last.epoch + 1, 0) } else { (last.epoch, next_sample) };
        self.state.global_step += 1;
        self.state.epoch = self.state.data_epoch as f64 + self.state.data_sample as f64 / epoch_samples as f64;
        run.losses.push(step.loss);
        run.logged.0 += step.loss as f64;
        run.logged.1 += 1;
        let world = self.replica_position().1;
        run.tokens +=
            (world * window.iter().map(|b| b.input_ids.dims().iter().product::<usize>()).sum::<usize>()) as u64;
    }

    /// Update the progress bar and write a log entry when one is due.
    fn report_progress(&mut self, run: &mut Run, step: &StepResult) -> Result<()> {
        let gs = self.state.global_step;
        let elapsed = run.start.elapsed().as_secs_f64().max(1e-9);
        let tokens_per_second = run.tokens as f64 / elapsed;
        run.bar.set_position(gs);
        run.bar.set_message(format!("loss {:.4} lr {:.2e} {tokens_per_second:.0} tok/s", step.loss, step.lr));
        let due =
            gs.is_multiple_of(self.args.logging_steps) || (self.args.logging_first_step && gs == 1) || gs == run.total;
        if run.plain_progress.is_some_and(|last| due || last.elapsed() >= PROGRESS_EVERY) {
            eprintln!(
                "step {gs}/{}: loss {:.4}, learning rate {:.2e}, {tokens_per_second:.0} tokens/s, {:.0} s",
                run.total,
                step.loss,
                step.lr,
                run.start.elapsed().as_secs_f64()
            );
            run.plain_progress = Some(Instant::now());
        }
        if due {
            let mut entry = json!({
                "loss": run.logged.0 / run.logged.1 as f64, "learning_rate": step.lr, "epoch": self.state.epoch,
                "step": gs, "tokens_per_second": tokens_per_second,
            });
            if run.unmasked_over_capacity > 0 {
                entry["mlm_unmasked_over_capacity"] = json!(run.unmasked_over_capacity);
            }
            run.logged = (0.0, 0);
            self.log(entry, &mut run.sinks)?;
        }
        Ok(())
    }

    /// True when `strategy` with interval `every` calls for an action now.
    fn due(&self, strategy: IntervalStrategy, every: u64) -> bool {
        match strategy {
            IntervalStrategy::No => false,
            IntervalStrategy::Steps => self.state.global_step.is_multiple_of(every.max(1)),
            IntervalStrategy::Epoch => self.state.data_sample == 0,
        }
    }

    /// Evaluate when due; returns whether a callback asked to stop.
    fn evaluate_if_due(&mut self, run: &mut Run) -> Result<bool> {
        if !self.due(self.args.eval_strategy, self.state.eval_steps) {
            return Ok(false);
        }
        let metrics = self.evaluate_and_log(&mut run.sinks)?;
        let mut stop = false;
        for cb in &mut self.callbacks {
            stop |= cb.on_evaluate(&self.state, &metrics).should_stop;
        }
        Ok(stop)
    }

    /// Save a checkpoint when due or when Ctrl-C was pressed (then the run stops).
    fn save_if_due(&mut self, run: &mut Run, step: &StepResult) -> Result<()> {
        run.interrupted = match self.replica_position().1 > 1 {
            true => step.interrupt_seen,
            false => INTERRUPTED.swap(false, Ordering::SeqCst),
        };
        if run.interrupted || self.due(self.args.save_strategy, self.args.save_steps) {
            self.checkpoint(&run.optimizer, &run.schedule, &run.output_dir)?;
        }
        Ok(())
    }

    /// Close the run: meet the other replicas, load the best model when
    /// asked, write the final folder (master only) and sum up.
    fn finish_run(&mut self, run: Run) -> Result<TrainOutput> {
        run.bar.finish_and_clear();
        drop(run.loader);
        for cb in &mut self.callbacks {
            cb.on_train_end(&self.state);
        }
        let seconds = run.start.elapsed().as_secs_f64();
        if self.replica_position().1 > 1 {
            INTERRUPTED.store(false, Ordering::SeqCst);
            // The master may still be writing the last checkpoint.
            self.device.rendezvous()?;
        }
        if !run.interrupted && self.args.load_best_model_at_end {
            // The master loads the best checkpoint and hands its weights to
            // every replica: with a folder per host, the others have none.
            if self.is_master() {
                self.load_best_model()?;
            }
            lazytrain_dist::broadcast_from_master(&self.device, &run.params)?;
        }
        if !run.interrupted && self.is_master() {
            crate::folder::save_folder(&run.output_dir, &self.model, self.model.config(), &self.tokenizer)?;
            let text = serde_json::to_string_pretty(&self.state).map_err(|e| Error::Input(e.to_string()))?;
            lazytrain_nn::state::write_atomically(&run.output_dir.join("trainer_state.json"), text.as_bytes())?;
        }
        if let Some(sync) = self.sync.take() {
            sync.finish(&run.output_dir, !run.interrupted)?;
        }
        // The master waited for its uploads (any size, over any link); the
        // others wait for it without a collective timeout, so that none
        // enters the next collective (the final evaluation's) and times out.
        // A master that failed is out of the group, which releases them.
        if self.replica_position().1 > 1 {
            self.device.patient_rendezvous()?;
        }
        let training_loss = run.losses.iter().map(|&l| l as f64).sum::<f64>() / run.losses.len().max(1) as f64;
        Ok(TrainOutput {
            global_step: self.state.global_step,
            training_loss,
            losses: run.losses,
            interrupted: run.interrupted,
            seconds,
            tokens_per_second: run.tokens as f64 / seconds.max(1e-9),
        })
    }
}
