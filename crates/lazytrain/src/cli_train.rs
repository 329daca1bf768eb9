//! `lazytrain train`: the Trainer from the command line.

use crate::cli_inputs::{check_data_tokenizer, tokenizer_for, ModelSource};
use crate::cli_manifests::{EvalData, PreparedManifest};
use clap::Args;
use lazytrain::trainer::args::FIELDS;
use lazytrain::trainer::{
    install_interrupt_handler, run_replicas_for, EvalMetrics, TrainOutput, Trainer, TrainingArguments,
};
use lazytrain::{Error, Result};
use lazytrain_core::Device;
use lazytrain_data::dataset::{find_split, ShardedDataset, SplitShards};
use lazytrain_data::tfrecord::CorruptPolicy;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ForMaskedLM, ForSequenceClassification, Gpt2LMHeadModel, ModelConfig, TaskModel};
use lazytrain_nn::init::Initializer;
use lazytrain_storage::StorageUrl;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every `TrainingArguments` field as an optional kebab-case flag
/// (`--per-device-train-batch-size 16`), whose help is the field's doc
/// comment and default ([`FIELDS`]); given flags override the config file.
#[derive(Clone, Debug, Default)]
pub struct TrainingFlags {
    /// `(snake_case key, value as written)` for every flag given.
    overrides: Vec<(String, String)>,
}

impl TrainingFlags {
    /// `(snake_case key, value)` for every flag that was given.
    fn overrides(&self) -> Vec<(String, String)> {
        self.overrides.clone()
    }
}

/// A flag's help: the doc comment on one line, then the default.
fn flag_help(doc: &str, default: &serde_json::Value) -> String {
    let text = doc.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
    let shown = match default {
        serde_json::Value::Null => "none".to_string(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => {
            items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    };
    format!("{text} [default: {shown}]")
}

impl clap::FromArgMatches for TrainingFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut flags = TrainingFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> std::result::Result<(), clap::Error> {
        for (name, _) in FIELDS {
            if let Some(value) = matches.get_one::<String>(name) {
                self.overrides.retain(|(key, _)| key != name);
                self.overrides.push((name.to_string(), value.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for TrainingFlags {
    fn augment_args(command: clap::Command) -> clap::Command {
        let defaults = serde_json::to_value(TrainingArguments::default()).unwrap_or_default();
        FIELDS.iter().fold(command, |command, (name, doc)| {
            command.arg(
                clap::Arg::new(*name)
                    .long(name.replace('_', "-"))
                    .value_name("VALUE")
                    .help(flag_help(doc, &defaults[*name]))
                    .help_heading("TrainingArguments"),
            )
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

/// What `lazytrain train` trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Task {
    /// A masked LM on `prepare` blocks.
    MaskedLm,
    /// A causal LM (GPT-2) on `prepare` blocks: every token predicts the next.
    CausalLm,
    /// A sequence classifier on `prepare-classification` data.
    SequenceClassification,
}

/// Options for `lazytrain train`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// TrainingArguments as TOML or JSON (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// What to train.
    #[arg(long, value_enum, default_value = "masked-lm")]
    task: Task,
    /// A preset to train from scratch (bert-tiny ... roberta-base, gpt2-tiny ... gpt2-small), a model folder
    /// to fine-tune, or a Hub id (org/name) in the local Hugging Face cache.
    #[arg(long)]
    model: String,
    /// The Hub revision (branch, tag or commit) of a cached --model or --tokenizer.
    #[arg(long)]
    revision: Option<String>,
    /// Labels of a sequence classifier (checked against the data's labels.json).
    #[arg(long)]
    num_labels: Option<usize>,
    /// The tokenizer folder or cached Hub id (defaults to the model folder's; a preset needs one).
    #[arg(long)]
    tokenizer: Option<String>,
    /// Prepared training data (a `prepare` or `prepare-classification` output
    /// folder); not needed with `--do-train false --do-eval true`, which only evaluates.
    #[arg(long)]
    train_data: Option<StorageUrl>,
    /// Prepared data whose validation shards are used for evaluation (its training shards when it
    /// has none, e.g. a folder prepared from a held-out file alone).
    #[arg(long)]
    eval_data: Option<StorageUrl>,
    /// Compile the first training step and print its memory plan (parameters, optimizer state,
    /// activations, the largest buffers, the batch size that fits) without training.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    flags: TrainingFlags,
}

/// Build a model: a preset sized to the tokenizer, or a folder's weights.
pub fn build_model(spec: &str, tokenizer: &TextTokenizer, seed: u64, device: &Device) -> Result<ForMaskedLM> {
    let dir = Path::new(spec);
    if dir.join("config.json").is_file() {
        let (model, warnings) = hub::load_masked_lm(dir, device)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        return Ok(model);
    }
    Ok(ForMaskedLM::new(&mut Initializer::new(seed, device), &preset_config(spec, tokenizer)?)?)
}

/// A GPT-2 LM: a `gpt2-*` preset sized to the tokenizer, or a folder's weights.
pub fn build_causal_lm(spec: &str, tokenizer: &TextTokenizer, seed: u64, device: &Device) -> Result<Gpt2LMHeadModel> {
    let dir = Path::new(spec);
    if dir.join("config.json").is_file() {
        let (model, warnings) = hub::load_causal_lm(dir, device)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        return Ok(model);
    }
    Ok(Gpt2LMHeadModel::new(&mut Initializer::new(seed, device), &preset_config(spec, tokenizer)?)?)
}

/// A preset sized to `tokenizer`: its vocabulary and special token ids.
pub fn preset_config(preset: &str, tokenizer: &TextTokenizer) -> Result<ModelConfig> {
    let mut config = ModelConfig::preset(preset, tokenizer.vocab_size())?;
    let s = tokenizer.special();
    config.pad_token_id = s.pad as i64;
    if config.bos_token_id.is_some() {
        config.bos_token_id = Some(s.start as i64);
        config.eos_token_id = Some(s.end as i64);
    }
    config.validate(&format!("preset {preset} with the tokenizer's special tokens"))?;
    Ok(config)
}

/// Open prepared shards of `split` in `dir` (refusing what `prepare` did
/// not write).
pub fn open_split(dir: &StorageUrl, split: &str, skip_corrupt: bool) -> Result<Arc<ShardedDataset>> {
    crate::cli_inputs::check_prepared(dir)?;
    open_shards(dir, split, find_split(dir, split)?, skip_corrupt)
}

/// Open the `shards` of `split` found in `dir`, checking their records
/// against the manifest's count.
fn open_shards(dir: &StorageUrl, split: &str, shards: SplitShards, skip_corrupt: bool) -> Result<Arc<ShardedDataset>> {
    let policy = if skip_corrupt { CorruptPolicy::Skip } else { CorruptPolicy::Fail };
    let data = ShardedDataset::open_urls(&shards.urls, policy)?;
    if data.is_empty() {
        return Err(Error::Input(format!("{dir} holds no {split} records (are its shards empty?)")));
    }
    // A shard cut short at a record's end (a copy or upload that stopped)
    // reads without a checksum error: only the manifest's count tells.
    if let Some(listed) = shards.listed_records.filter(|&n| !skip_corrupt && n != data.len() as u64) {
        return Err(Error::Input(format!(
            "{dir}: the manifest lists {listed} {split} records but the shards hold {}: a shard is missing or cut \
             short (copied before it was complete?); copy the folder again or prepare it anew",
            data.len()
        )));
    }
    if data.skipped() > 0 {
        let lost = match data.unframed_bytes() {
            0 => String::new(),
            bytes => format!(", and {bytes} bytes after corrupt record headers (the records in them cannot be read)"),
        };
        eprintln!("warning: skipped {} corrupt records in {dir}{lost}", data.skipped());
    }
    Ok(Arc::new(data))
}

/// Resolve arguments from the config file and flags.
pub fn resolve_args(config: Option<&Path>, flags: &TrainingFlags) -> Result<TrainingArguments> {
    let base = match config {
        Some(path) => TrainingArguments::from_file(path)?,
        None => TrainingArguments::default(),
    };
    base.with_overrides(&flags.overrides())
}

/// Run `lazytrain train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    let mut training = resolve_args(args.config.as_deref(), &args.flags)?;
    training.validate(args.eval_data.is_some())?;
    // A checkpoint in a bucket (named, or the newest under --push-to when
    // this machine has none) is downloaded into the output folder first.
    training.resume_from_checkpoint = lazytrain::trainer::push::fetch_resume_checkpoint(&training)?;
    if args.dry_run {
        // Nothing is trained: no logs either.
        training.report_to = Vec::new();
    }
    let revision = args.revision.as_deref();
    let source = ModelSource::resolve(&args.model, revision)?;
    let (tokenizer_dir, tokenizer) = tokenizer_for(&source, args.tokenizer.as_deref(), revision)?;
    let model_spec = source.spec();
    let (data_dir, train) = training_data(args, &training)?;
    let eval = match &args.eval_data {
        Some(dir) => Some(open_eval(dir, training.skip_corrupt)?),
        None => None,
    };
    let train_manifest = PreparedManifest::read(&data_dir, args.task)?;
    let eval_manifest = match &args.eval_data {
        Some(dir) => Some((dir, PreparedManifest::read(dir, args.task)?)),
        None => None,
    };
    for (dir, manifest) in
        std::iter::once((&data_dir, &train_manifest)).chain(eval_manifest.iter().map(|(d, m)| (*d, m)))
    {
        check_data_tokenizer(dir, manifest.tokenizer(), &tokenizer, &tokenizer_dir)?;
    }
    let eval_data = match &eval_manifest {
        Some((dir, manifest)) => Some(EvalData::of(dir, manifest, &data_dir, &train_manifest)?),
        None => None,
    };
    install_interrupt_handler();
    let output_dir = training.output_dir.clone();
    // Each replica builds its model and trainer on its own device.
    let out = match (args.task, &train_manifest) {
        (Task::MaskedLm, PreparedManifest::Blocks(manifest)) => {
            if args.num_labels.is_some() {
                return Err(Error::Input("--num-labels is for --task sequence-classification".into()));
            }
            run_replicas_for(&training, |device| {
                let model = build_model(&model_spec, &tokenizer, training.seed, device)?;
                EvalData::check(eval_data.as_ref(), model.config())?;
                let (train, eval) = (train.clone(), eval.clone());
                let trainer =
                    Trainer::new(training.clone(), model, tokenizer.clone(), train, eval, manifest.block_size, device)?;
                train_and_evaluate(trainer, args.dry_run)
            })?
        }
        (Task::CausalLm, PreparedManifest::Blocks(manifest)) => {
            if args.num_labels.is_some() {
                return Err(Error::Input("--num-labels is for --task sequence-classification".into()));
            }
            run_replicas_for(&training, |device| {
                let model = build_causal_lm(&model_spec, &tokenizer, training.seed, device)?;
                EvalData::check(eval_data.as_ref(), model.config())?;
                let (train, eval) = (train.clone(), eval.clone());
                let trainer = Trainer::for_causal_lm(
                    training.clone(),
                    model,
                    tokenizer.clone(),
                    train,
                    eval,
                    manifest.block_size,
                    device,
                )?;
                train_and_evaluate(trainer, args.dry_run)
            })?
        }
        (Task::SequenceClassification, PreparedManifest::Rows(manifest)) => {
            if let Some(n) = args.num_labels.filter(|&n| n != manifest.labels.len()) {
                return Err(Error::Input(format!(
                    "--num-labels {n} but {} has {} labels ({}); pass --num-labels {} or re-prepare the data",
                    data_dir,
                    manifest.labels.len(),
                    manifest.labels.join(", "),
                    manifest.labels.len()
                )));
            }
            run_replicas_for(&training, |device| {
                let model = build_classifier(&model_spec, &tokenizer, &manifest.labels, training.seed, device)?;
                EvalData::check(eval_data.as_ref(), model.config())?;
                let (train, eval) = (train.clone(), eval.clone());
                let trainer = Trainer::for_classification(
                    training.clone(),
                    model,
                    tokenizer.clone(),
                    train,
                    eval,
                    manifest,
                    device,
                )?;
                train_and_evaluate(trainer, args.dry_run)
            })?
        }
        (Task::MaskedLm | Task::CausalLm, PreparedManifest::Rows(_))
        | (Task::SequenceClassification, PreparedManifest::Blocks(_)) => {
            // `PreparedManifest::read` reads the kind the task names.
            return Err(Error::Input(format!(
                "{data_dir}: its manifest was read for another task than --task (a bug in lazytrain; please report it)"
            )));
        }
    };
    if lazytrain_dist::is_master_process() {
        if let Some(eval) = &out.1 {
            save_eval_results(eval, Path::new(&output_dir))?;
        }
        report(&out, &output_dir);
    }
    Ok(())
}

/// Write `eval_results.json` into `output_dir`, as HF's `run_*.py`
/// scripts save their final metrics (full precision, unlike the summary line).
fn save_eval_results(eval: &EvalMetrics, output_dir: &Path) -> Result<()> {
    let mut entry = eval.log_entry();
    entry.insert("eval_predictions".into(), serde_json::json!(eval.count));
    std::fs::create_dir_all(output_dir).map_err(|e| Error::Input(format!("{}: {e}", output_dir.display())))?;
    let text = serde_json::to_string_pretty(&entry).unwrap_or_default();
    lazytrain_nn::state::write_atomically(&output_dir.join("eval_results.json"), text.as_bytes())?;
    Ok(())
}

/// A sequence classifier over `labels`: a preset sized to the tokenizer, or
/// a folder's encoder (a fresh head when the folder has none, e.g. a
/// masked-LM export).
pub fn build_classifier(
    spec: &str,
    tokenizer: &TextTokenizer,
    labels: &[String],
    seed: u64,
    device: &Device,
) -> Result<ForSequenceClassification> {
    let dir = Path::new(spec);
    if dir.join("config.json").is_file() {
        let (model, warnings) = hub::load_sequence_classifier_for_labels(dir, labels, seed, device)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        return Ok(model);
    }
    let config = preset_config(spec, tokenizer)?.with_labels(labels);
    Ok(ForSequenceClassification::new(&mut Initializer::new(seed, device), &config, labels.len())?)
}

/// The validation shards of `dir`, or, when it has none (a folder prepared
/// from a held-out file alone), its training shards, with a notice.
fn open_eval(dir: &StorageUrl, skip_corrupt: bool) -> Result<Arc<ShardedDataset>> {
    crate::cli_inputs::check_prepared(dir)?;
    let validation = find_split(dir, "validation");
    if validation.is_err() {
        if let Ok(train) = find_split(dir, "train") {
            eprintln!("note: {dir} has no validation shards; evaluating on its training shards");
            return open_shards(dir, "train", train, skip_corrupt);
        }
    }
    open_shards(dir, "validation", validation?, skip_corrupt)
}

/// The folder whose manifest describes the data, and the training split:
/// `--train-data`'s, or with `--do-train false` (evaluation only) the eval
/// data's validation split, which is then never trained on.
fn training_data(args: &TrainArgs, training: &TrainingArguments) -> Result<(StorageUrl, Arc<ShardedDataset>)> {
    if !training.do_train && !training.do_eval {
        return Err(Error::Input(
            "--do-train false and --do-eval false leave nothing to do; pass --do-eval true".into(),
        ));
    }
    match (&args.train_data, &args.eval_data) {
        (Some(dir), _) => Ok((dir.clone(), open_split(dir, "train", training.skip_corrupt)?)),
        (None, Some(dir)) if !training.do_train => {
            Ok((dir.clone(), open_split(dir, "validation", training.skip_corrupt)?))
        }
        (None, _) => Err(Error::Input(
            "pass --train-data DIR (a `prepare` output), or --do-train false --do-eval true --eval-data DIR to only \
             evaluate the model"
                .into(),
        )),
    }
}

/// Train, then evaluate when `do_eval` is set (every replica takes part);
/// with `do_train` off, only evaluate; with `dry_run`, only plan the step.
fn train_and_evaluate<M: TaskModel>(
    trainer: Trainer<M>,
    dry_run: bool,
) -> Result<(Option<TrainOutput>, Option<EvalMetrics>)> {
    let mut trainer = trainer.with_progress_bar(!dry_run);
    if dry_run {
        let plan = trainer.plan_step()?;
        if trainer.is_master() {
            println!("{plan}");
        }
        return Ok((None, None));
    }
    if !trainer.args.do_train {
        return Ok((None, Some(trainer.evaluate()?)));
    }
    let out = trainer.train()?;
    let eval = match trainer.args.do_eval && !out.interrupted {
        true => Some(trainer.evaluate()?),
        false => None,
    };
    Ok((Some(out), eval))
}

fn report((out, eval): &(Option<TrainOutput>, Option<EvalMetrics>), output_dir: &str) {
    let Some(out) = out else {
        if let Some(eval) = eval {
            println!("eval (no training, --do-train false): {eval}");
        }
        return;
    };
    if out.interrupted {
        println!("interrupted: saved a checkpoint at step {} in {output_dir}", out.global_step);
        return;
    }
    let ran = out.losses.len() as u64;
    if ran == 0 {
        println!(
            "trained 0 steps: the run resumed at step {}, where its training already ends (raise --max-steps or \
             --num-train-epochs to train further); model saved to {output_dir}",
            out.global_step
        );
        if let Some(eval) = eval {
            println!("eval: {eval}");
        }
        return;
    }
    let steps = match out.global_step - ran.min(out.global_step) {
        0 => format!("{ran} steps"),
        resumed => format!("{ran} steps (resumed at step {resumed}, now at step {})", out.global_step),
    };
    println!(
        "trained {steps} in {:.1} s ({:.0} tokens/s), mean loss {:.4}; model saved to {output_dir}",
        out.seconds, out.tokens_per_second, out.training_loss
    );
    if let Some(eval) = eval {
        println!("eval: {eval}");
    }
    let io = lazytrain_storage::storage_metrics();
    if io.requests > 0 {
        println!("buckets: {io}");
    }
}
