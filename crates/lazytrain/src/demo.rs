//! `lazytrain demo`: the whole workflow on the embedded corpus — train a
//! tokenizer, prepare shards, train a small RoBERTa masked LM, evaluate,
//! save a Hugging Face folder, and answer fill-mask questions about facts
//! the model has learned. With `--task sequence-classification` it then
//! fine-tunes that model on generated reviews ([`crate::demo_classification`]);
//! with `--task causal-lm` it trains a tiny GPT-2 instead ([`crate::demo_causal`]).

use crate::cli_train::{open_split, preset_config};
use clap::Args;
use lazytrain::pipelines::FillMask;
use lazytrain::trainer::{install_interrupt_handler, IntervalStrategy, TrainOutput, Trainer, TrainingArguments};
use lazytrain_core::{metrics, Device};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::{TextTokenizer, TokenizerStyle};
use lazytrain_models::ForMaskedLM;
use lazytrain_nn::init::Initializer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which demo to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoTask {
    /// Pre-train a masked LM and answer fill-mask questions.
    MaskedLm,
    /// Fine-tune the pre-trained masked LM (trained first if missing) as a review classifier.
    SequenceClassification,
    /// Train a tiny GPT-2 and complete "the capital of X is" with text-generation.
    CausalLm,
}

/// Options for `lazytrain demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Which demo.
    #[arg(long, value_enum, default_value = "masked-lm")]
    pub task: DemoTask,
    /// Where the corpus, tokenizer, shards, checkpoints and model go.
    #[arg(long, default_value = "lazytrain-demo")]
    pub output_dir: PathBuf,
    /// Optimizer steps of the masked-LM pre-training.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_steps: i64,
    /// Sentences in the generated corpus.
    #[arg(long, default_value_t = 60_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000_000))]
    pub sentences: usize,
    /// Countries (facts) in the generated lexicon.
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub countries: usize,
    /// Seed of everything.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Price of this machine per hour, to report the run's cost.
    #[arg(long)]
    pub price_per_hour: Option<f64>,
    /// Fine-tuning steps of the classification demo.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
    pub fine_tune_steps: i64,
}

/// `roberta-tiny` (2 layers, 128 hidden) with 4 heads of 32: small heads
/// learn the country -> capital lookup sooner than 2 heads of 64.
fn demo_model(tokenizer: &TextTokenizer, seed: u64, device: &Device) -> lazytrain::Result<ForMaskedLM> {
    let mut config = preset_config("roberta-tiny", tokenizer)?;
    config.num_attention_heads = 4;
    Ok(ForMaskedLM::new(&mut Initializer::new(seed, device), &config)?)
}

/// Run the demo and print a report.
pub fn run(args: &DemoArgs) -> lazytrain::Result<()> {
    match args.task {
        DemoTask::MaskedLm => run_masked_lm(args),
        DemoTask::SequenceClassification => {
            let pretrained = args.output_dir.join("model");
            if !pretrained.join("config.json").is_file() {
                println!("no pre-trained demo model in {}: running the masked-LM demo first", pretrained.display());
                run_masked_lm(args)?;
            }
            crate::demo_classification::run(args, &pretrained)
        }
        DemoTask::CausalLm => crate::demo_causal::run(args),
    }
}

/// The masked-LM demo: pre-train, evaluate, save, answer fill-mask questions.
fn run_masked_lm(args: &DemoArgs) -> lazytrain::Result<()> {
    let start = Instant::now();
    let out = &args.output_dir;
    std::fs::create_dir_all(out).map_err(|e| lazytrain::Error::Input(format!("{}: {e}", out.display())))?;
    let corpus = demo_corpus(args.seed, args.countries, args.sentences);
    std::fs::write(out.join("corpus.txt"), corpus.sentences.join("\n"))
        .map_err(|e| lazytrain::Error::Input(format!("{}: {e}", out.display())))?;
    println!(
        "1/5 corpus: {} sentences about {} countries -> {}",
        corpus.sentences.len(),
        corpus.countries.len(),
        out.join("corpus.txt").display()
    );

    let tokenizer = train_tokenizer(&corpus.sentences, SubwordModel::Bpe, 600, TokenizerStyle::Roberta)?;
    tokenizer.save(&out.join("tokenizer"), 512)?;
    println!("2/5 tokenizer: byte-level BPE, {} tokens", tokenizer.vocab_size());

    let block_size = 32;
    let options = PrepareOptions {
        block_size,
        num_shards: 2,
        validation_fraction: 0.02,
        seed: args.seed,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tokenizer, &corpus.sentences, &out.join("data"), &options)?;
    println!("3/5 data: {} training blocks of {block_size} tokens", manifest.train_records());

    let device = Device::cpu();
    let training = TrainingArguments { mlm_probability: 0.4, ..pretraining_args(args, &out.join("model")) };
    let train = open_split(&lazytrain_storage::StorageUrl::Local(out.join("data")), "train", false)?;
    let eval = open_split(&lazytrain_storage::StorageUrl::Local(out.join("data")), "validation", false)?;
    let model = demo_model(&tokenizer, args.seed, &device)?;
    install_interrupt_handler();
    let mut trainer =
        Trainer::new(training, model, tokenizer, train, Some(eval), block_size, &device)?.with_progress_bar(true);
    let result = train_and_report(&mut trainer)?;

    let pipe = FillMask::from_dir(&out.join("model"), &device)?;
    let questions: Vec<_> = corpus.countries.iter().collect();
    let texts: Vec<String> = questions.iter().map(|c| format!("the capital of {} is <mask> .", c.name)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let answers = pipe.predict(&refs, 3)?;
    println!("5/5 fill-mask with the saved model ({}):", out.join("model").display());
    let mut correct = 0;
    for ((country, text), per_mask) in questions.iter().zip(&texts).zip(&answers) {
        let top = &per_mask[0];
        let guess = top[0].token_str.trim();
        let ok = guess == country.capital;
        correct += usize::from(ok);
        let others: Vec<String> = top[1..].iter().map(|p| format!("{} {:.2}", p.token_str.trim(), p.score)).collect();
        println!(
            "  {text:<44} -> {guess:<8} {:.2} {}  (also: {})",
            top[0].score,
            if ok { "correct" } else { "WRONG" },
            others.join(", ")
        );
    }
    let config = trainer.model.config();
    let flops_per_token =
        crate::cli_bench::flops_per_token(config.num_hidden_layers, config.hidden_size, config.vocab_size, block_size);
    print_report(args, start, &result, flops_per_token, &device)?;
    println!("  answers correct    {correct}/{}", questions.len());
    Ok(())
}

/// The pre-training arguments both language-model demos use: batch 32,
/// learning rate 2e-3 with 5 % warmup, evaluation halfway and at the end,
/// one checkpoint kept, JSONL and TensorBoard logs, into `output_dir`.
pub fn pretraining_args(args: &DemoArgs, output_dir: &Path) -> TrainingArguments {
    let steps = args.max_steps.max(1) as u64;
    TrainingArguments {
        output_dir: output_dir.display().to_string(),
        overwrite_output_dir: true,
        max_steps: args.max_steps,
        per_device_train_batch_size: 32,
        per_device_eval_batch_size: 32,
        learning_rate: 2e-3,
        weight_decay: 0.01,
        warmup_steps: 0.05,
        logging_steps: 100,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(steps.div_ceil(2)),
        save_steps: steps,
        save_total_limit: Some(1),
        seed: args.seed,
        report_to: vec!["jsonl".into(), "tensorboard".into()],
        ..TrainingArguments::default()
    }
}

/// Train, evaluate and print the demo's step 4 line.
pub fn train_and_report<M: lazytrain_models::TaskModel>(trainer: &mut Trainer<M>) -> lazytrain::Result<TrainOutput> {
    let result = trainer.train()?;
    let m = trainer.evaluate()?;
    println!(
        "4/5 training: {} steps, loss {:.3} -> {:.3}; eval {m}",
        result.global_step,
        result.losses.first().copied().unwrap_or(f32::NAN),
        result.losses.last().copied().unwrap_or(f32::NAN),
    );
    Ok(result)
}

/// The run report: throughput, share of the GEMM peak, compiles, wall time
/// and cost. `flops_per_token` is the model's training FLOPs per token.
pub fn print_report(
    args: &DemoArgs,
    start: Instant,
    result: &TrainOutput,
    flops_per_token: f64,
    device: &Device,
) -> lazytrain::Result<()> {
    let wall = start.elapsed().as_secs_f64();
    let report = metrics::snapshot();
    println!("run report:");
    let achieved = flops_per_token * result.tokens_per_second / 1e9;
    let peak = crate::cli_bench::gemm_peak_gflops(device, lazytrain_core::DType::F32)?;
    println!("  steps              {}", result.global_step);
    println!("  tokens/s           {:.0}", result.tokens_per_second);
    println!(
        "  model FLOPs        {achieved:.2} GFLOP/s = {:.1} % of the {peak:.0} GFLOP/s GEMM peak measured now",
        100.0 * achieved / peak
    );
    println!(
        "  compiles           {} ({:.1} ms), cache hits {}",
        report.compiles, report.compile_ms, report.cache_hits
    );
    println!("  forced syncs       {}", report.forced_sync_count());
    println!("  wall time          {wall:.1} s");
    if let Some(price) = args.price_per_hour {
        println!("  cost               {:.4} at {price}/hour", price * wall / 3600.0);
    }
    Ok(())
}
