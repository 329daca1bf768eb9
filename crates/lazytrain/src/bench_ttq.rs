//! `lazytrain bench-ttq`: the time-to-quality protocol of
//! `../shared/anchors/ttq_torch.py` run with lazytrain's own Trainer — a
//! tiny RoBERTa masked LM on the State of the Union corpus, Unigram 8k
//! (NFKC + lowercase, Metaspace), RoBERTa's wrapped 128-token blocks, batch
//! 32, AdamW lr 1e-3 with 60 warmup steps over 600, clipping at 1.0, the
//! eval loss of the first 256 validation blocks every 50 steps. The
//! training clock pauses during evaluations, as the anchor's does; the
//! output is the anchor's JSON lines, and `--reference` compares the two.

use crate::cli_train::{open_split, preset_config};
use clap::Args;
use lazytrain::trainer::{IntervalStrategy, Trainer, TrainerCallback, TrainerState, TrainingArguments};
use lazytrain_core::Device;
use lazytrain_data::prepare::{prepare_with_validation, Packing, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer_with, Normalization, SubwordModel};
use lazytrain_data::TokenizerStyle;
use lazytrain_models::ForMaskedLM;
use lazytrain_nn::init::Initializer;
use lazytrain_storage::StorageUrl;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Protocol constants shared with the anchor.
const BLOCK: usize = 128;
const BATCH: usize = 32;
const EVAL_BLOCKS: usize = 256;
const THRESHOLDS: [f64; 6] = [7.0, 6.5, 6.0, 5.5, 5.0, 4.5];
/// How close to PyTorch's final eval loss counts as reaching it.
const LOSS_TOLERANCE: f64 = 0.05;

/// Options for `lazytrain bench-ttq`.
#[derive(Args)]
pub struct TtqArgs {
    /// The corpus: UTF-8, one paragraph per line (../shared/data/sotu.txt).
    #[arg(long, default_value = "../shared/data/sotu.txt")]
    corpus: PathBuf,
    /// Training prefix in bytes (cut back to a line end).
    #[arg(long, default_value_t = 4_000_000)]
    train_bytes: usize,
    /// Validation bytes after the training prefix (cut back to a line end).
    #[arg(long, default_value_t = 300_000)]
    validation_bytes: usize,
    /// Optimizer updates.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    max_steps: u64,
    /// Linear warmup updates.
    #[arg(long, default_value_t = 60)]
    warmup_steps: u64,
    /// Evaluate every this many updates.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: u64,
    /// Unigram vocabulary size.
    #[arg(long, default_value_t = 8000)]
    vocab_size: usize,
    /// The vocabulary head at every token (Hugging Face's computation).
    #[arg(long)]
    mlm_dense_head: bool,
    /// bf16 mixed precision.
    #[arg(long)]
    bf16: bool,
    /// Seed of initialisation, data order, masking and dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the tokenizer, shards and model go.
    #[arg(long, default_value = "lazytrain-ttq")]
    output_dir: PathBuf,
    /// JSON-lines output file (also printed to stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// ttq_torch.py's JSON lines: report when lazytrain reached PyTorch's final eval loss.
    #[arg(long)]
    reference: Option<PathBuf>,
}

/// The cleaned training and validation documents (protocol step 1).
struct Texts {
    train: Vec<String>,
    validation: Vec<String>,
    train_bytes: usize,
    validation_bytes: usize,
}

/// The longest prefix of `bytes` that ends with a line break.
fn through_last_newline(bytes: &[u8]) -> &[u8] {
    bytes.iter().rposition(|&b| b == b'\n').map_or(&bytes[..0], |end| &bytes[..=end])
}

/// `text` without its bracketed annotations (`[Laughter]`): every `[`
/// that a later `]` closes is removed up to and including that `]`, as the
/// regex `\[[^\]]*\]` does.
fn strip_annotations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// Every line of `text` without annotations and surrounding whitespace; empty lines dropped.
fn documents(text: &str) -> Vec<String> {
    text.split('\n').map(|line| strip_annotations(line).trim().to_string()).filter(|line| !line.is_empty()).collect()
}

fn read_texts(args: &TtqArgs) -> lazytrain::Result<Texts> {
    let raw = std::fs::read(&args.corpus).map_err(|e| {
        lazytrain::Error::Input(format!(
            "{}: {e}; pass the State of the Union text with --corpus",
            args.corpus.display()
        ))
    })?;
    let train = through_last_newline(&raw[..args.train_bytes.min(raw.len())]);
    let after = &raw[train.len()..];
    let validation = through_last_newline(&after[..args.validation_bytes.min(after.len())]);
    let utf8 = |bytes: &[u8], what: &str| {
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| {
            lazytrain::Error::Input(format!("{}: the {what} text is not UTF-8 ({e})", args.corpus.display()))
        })
    };
    let texts = Texts {
        train: documents(&utf8(train, "training")?),
        validation: documents(&utf8(validation, "validation")?),
        train_bytes: train.len(),
        validation_bytes: validation.len(),
    };
    if texts.train.is_empty() || texts.validation.is_empty() {
        return Err(lazytrain::Error::Input(format!(
            "{}: {} training and {} validation documents; the corpus is too short for --train-bytes {} and \
             --validation-bytes {}",
            args.corpus.display(),
            texts.train.len(),
            texts.validation.len(),
            args.train_bytes,
            args.validation_bytes
        )));
    }
    Ok(texts)
}

/// One evaluation as the anchor writes it.
#[derive(Clone, Debug)]
struct EvalRecord {
    step: u64,
    wall_s: f64,
    train_loss: Option<f64>,
    eval_loss: f64,
    eval_acc: f64,
    wall_incl_eval_s: f64,
}

impl EvalRecord {
    fn to_json(&self) -> Value {
        json!({
            "kind": "eval", "step": self.step, "wall_s": round(self.wall_s, 3),
            "train_loss": self.train_loss.map(|l| round(l, 5)), "eval_loss": round(self.eval_loss, 5),
            "eval_acc": round(self.eval_acc, 5), "wall_incl_eval_s": round(self.wall_incl_eval_s, 3),
        })
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// Records the training clock (evaluations excluded) at every evaluation.
#[derive(Default)]
struct Clock {
    start: Option<Instant>,
    eval_s: f64,
    last_train_loss: Option<f64>,
    records: Vec<EvalRecord>,
}

/// The [`TrainerCallback`] side of a shared [`Clock`].
struct ClockCallback(Arc<Mutex<Clock>>);

impl TrainerCallback for ClockCallback {
    fn on_train_begin(&mut self, _state: &TrainerState) {
        self.0.lock().expect("clock").start = Some(Instant::now());
    }

    fn on_log(&mut self, _state: &TrainerState, logs: &Value) {
        if let Some(loss) = logs.get("loss").and_then(Value::as_f64) {
            self.0.lock().expect("clock").last_train_loss = Some(loss);
        }
    }

    fn on_evaluate(&mut self, state: &TrainerState, metrics: &Value) -> lazytrain::trainer::Control {
        let mut clock = self.0.lock().expect("clock");
        let elapsed = clock.start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        clock.eval_s += metrics.get("eval_runtime").and_then(Value::as_f64).unwrap_or(0.0);
        let record = EvalRecord {
            step: state.global_step,
            wall_s: elapsed - clock.eval_s,
            train_loss: clock.last_train_loss.take(),
            eval_loss: metrics.get("eval_loss").and_then(Value::as_f64).unwrap_or(f64::NAN),
            eval_acc: metrics.get("eval_accuracy").and_then(Value::as_f64).unwrap_or(f64::NAN),
            wall_incl_eval_s: elapsed,
        };
        clock.records.push(record);
        lazytrain::trainer::Control::default()
    }
}

/// Prints each JSON line and appends it to `--out`.
struct Emitter {
    file: Option<std::fs::File>,
}

impl Emitter {
    fn emit(&mut self, record: &Value) -> lazytrain::Result<()> {
        println!("{record}");
        if let Some(f) = &mut self.file {
            writeln!(f, "{record}").map_err(|e| lazytrain::Error::Input(format!("writing the --out file: {e}")))?;
        }
        Ok(())
    }
}

/// The anchor's final eval loss and training seconds, from its JSON lines.
fn reference_summary(path: &Path) -> lazytrain::Result<(f64, f64)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| lazytrain::Error::Input(format!("{}: {e}; pass ttq_torch.py's --out file", path.display())))?;
    let summary = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("kind").and_then(Value::as_str) == Some("summary"))
        .ok_or_else(|| {
            lazytrain::Error::Input(format!(
                "{}: no {{\"kind\": \"summary\"}} line; was ttq_torch.py run to the end?",
                path.display()
            ))
        })?;
    let number = |key: &str| {
        summary
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| lazytrain::Error::Input(format!("{}: the summary has no numeric `{key}`", path.display())))
    };
    Ok((number("final_eval_loss")?, number("train_s")?))
}

/// Run the protocol, print its JSON lines and, with `--reference`, the comparison.
pub fn run(args: &TtqArgs) -> lazytrain::Result<()> {
    let io = |p: &Path, e: std::io::Error| lazytrain::Error::Input(format!("{}: {e}", p.display()));
    let reference = args.reference.as_deref().map(reference_summary).transpose()?;
    std::fs::create_dir_all(&args.output_dir).map_err(|e| io(&args.output_dir, e))?;
    let mut emitter =
        Emitter { file: args.out.as_deref().map(|p| std::fs::File::create(p).map_err(|e| io(p, e))).transpose()? };

    let t = Instant::now();
    let texts = read_texts(args)?;
    let data_s = t.elapsed().as_secs_f64();
    eprintln!(
        "data: train {} B / {} docs, val {} B / {} docs",
        texts.train_bytes,
        texts.train.len(),
        texts.validation_bytes,
        texts.validation.len()
    );

    let t = Instant::now();
    let tokenizer = train_tokenizer_with(
        &texts.train,
        SubwordModel::Unigram,
        args.vocab_size,
        TokenizerStyle::Roberta,
        Normalization::NfkcLowercase,
    )?;
    let tokenizer_s = t.elapsed().as_secs_f64();
    tokenizer.save(&args.output_dir.join("tokenizer"), BLOCK)?;
    eprintln!("tokenizer: vocab {} in {tokenizer_s:.1}s", tokenizer.vocab_size());

    let t = Instant::now();
    let data_dir = args.output_dir.join("data");
    let options = PrepareOptions {
        block_size: BLOCK,
        num_shards: 1,
        validation_fraction: 0.0,
        seed: args.seed,
        progress: false,
        packing: Packing::Wrapped,
    };
    let manifest = prepare_with_validation(&tokenizer, &texts.train, &texts.validation, &data_dir, &options)?;
    let pack_s = t.elapsed().as_secs_f64();
    let train_blocks = manifest.train_records();
    let validation_blocks: u64 = manifest.validation.iter().map(|s| s.records).sum();
    eprintln!("pack: {train_blocks} train blocks, {validation_blocks} val blocks in {pack_s:.1}s");

    let device = Device::cpu();
    let mut config = preset_config("roberta-tiny", &tokenizer)?;
    config.num_attention_heads = 2;
    config.intermediate_size = 512;
    config.max_position_embeddings = BLOCK + 2;
    config.layer_norm_eps = 1e-12;
    let model = ForMaskedLM::new(&mut Initializer::new(args.seed, &device), &config)?;
    let params = config.parameter_count();
    let trainer_vocab = config.vocab_size;
    let training = TrainingArguments {
        output_dir: args.output_dir.join("model").display().to_string(),
        overwrite_output_dir: true,
        max_steps: args.max_steps as i64,
        per_device_train_batch_size: BATCH,
        per_device_eval_batch_size: BATCH,
        max_eval_samples: Some(EVAL_BLOCKS),
        learning_rate: 1e-3,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        lr_scheduler_type: "linear".into(),
        warmup_steps: args.warmup_steps as f64,
        logging_steps: args.eval_every,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(args.eval_every),
        save_strategy: IntervalStrategy::No,
        seed: args.seed,
        bf16: args.bf16,
        mlm_dense_head: args.mlm_dense_head,
        report_to: vec!["jsonl".into()],
        ..TrainingArguments::default()
    };
    let url = StorageUrl::Local(data_dir);
    let (train, eval) = (open_split(&url, "train", false)?, open_split(&url, "validation", false)?);
    let mut trainer =
        Trainer::new(training, model, tokenizer, train, Some(eval), BLOCK, &device)?.with_progress_bar(true);
    let clock = Arc::new(Mutex::new(Clock::default()));
    trainer.add_callback(Box::new(ClockCallback(clock.clone())));

    let first = trainer.evaluate()?;
    let step0 = EvalRecord {
        step: 0,
        wall_s: 0.0,
        train_loss: None,
        eval_loss: first.loss,
        eval_acc: first.accuracy,
        wall_incl_eval_s: 0.0,
    };
    emitter.emit(&step0.to_json())?;
    let eval_masked_tokens = first.count;
    let output = trainer.train()?;
    let (records, eval_s) = {
        let clock = clock.lock().expect("clock");
        (std::iter::once(step0).chain(clock.records.iter().cloned()).collect::<Vec<_>>(), clock.eval_s)
    };
    for record in &records[1..] {
        emitter.emit(&record.to_json())?;
    }
    let last = records.last().expect("the step-0 evaluation");
    let train_s = output.seconds - eval_s;
    let first_below = |loss: f64| records.iter().find(|r| r.eval_loss < loss);
    let ttq: serde_json::Map<String, Value> = THRESHOLDS
        .iter()
        .map(|&thr| {
            let hit = first_below(thr).map(|r| json!({"step": r.step, "wall_s": round(r.wall_s, 3)}));
            (format!("{thr:.1}"), hit.unwrap_or(Value::Null))
        })
        .collect();
    emitter.emit(&json!({
        "kind": "summary",
        "data_s": round(data_s, 3),
        "tokenizer_s": round(tokenizer_s, 3),
        "pack_s": round(pack_s, 3),
        "train_s": round(train_s, 3),
        "eval_s": round(eval_s, 3),
        "s_per_step": round(train_s / args.max_steps as f64, 4),
        "tokens_per_s": round((args.max_steps as usize * BATCH * BLOCK) as f64 / train_s, 1),
        "final_step": last.step,
        "final_eval_loss": round(last.eval_loss, 5),
        "final_eval_acc": round(last.eval_acc, 5),
        "ttq_first_below": ttq,
        "max_steps": args.max_steps,
        "warmup_steps": args.warmup_steps,
        "train_bytes": texts.train_bytes,
        "val_bytes": texts.validation_bytes,
        "train_docs": texts.train.len(),
        "val_docs": texts.validation.len(),
        "train_blocks": train_blocks,
        "val_blocks": validation_blocks,
        "eval_blocks": (validation_blocks as usize).min(EVAL_BLOCKS),
        "eval_masked_tokens": eval_masked_tokens,
        "vocab_size": trainer_vocab,
        "params": params,
        "mlm_head": if args.mlm_dense_head { "dense" } else { "masked-positions" },
        "bf16": args.bf16,
    }))?;
    if let Some((torch_loss, torch_s)) = reference {
        let target = torch_loss + LOSS_TOLERANCE;
        match first_below(target + f64::EPSILON) {
            Some(hit) => eprintln!(
                "time to quality: PyTorch's final eval loss {torch_loss:.4} (+{LOSS_TOLERANCE}) after {torch_s:.1} s; \
                 lazytrain reached {:.4} at step {} after {:.1} s = {:.2}x PyTorch's wall time; lazytrain's final \
                 eval loss {:.4} ({:+.4})",
                hit.eval_loss,
                hit.step,
                hit.wall_s,
                hit.wall_s / torch_s,
                last.eval_loss,
                last.eval_loss - torch_loss
            ),
            None => eprintln!(
                "time to quality: lazytrain never reached PyTorch's final eval loss {torch_loss:.4} (+{LOSS_TOLERANCE}); \
                 its best was {:.4}",
                records.iter().map(|r| r.eval_loss).fold(f64::INFINITY, f64::min)
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_are_stripped_as_the_anchor_regex_does() {
        assert_eq!(strip_annotations("Thank you. [Applause] And [Laughter]now."), "Thank you.  And now.");
        assert_eq!(strip_annotations("a [b [c] d] e"), "a  d] e");
        assert_eq!(strip_annotations("an [open bracket"), "an [open bracket");
        assert_eq!(documents("  [Applause]  \n\nFirst line [x].\n second \n"), vec!["First line .", "second"]);
    }

    #[test]
    fn texts_end_at_line_breaks() {
        assert_eq!(through_last_newline(b"ab\ncd\nef"), b"ab\ncd\n");
        assert_eq!(through_last_newline(b"abc"), b"");
    }
}
