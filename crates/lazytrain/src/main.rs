//! The `lazytrain` command line.

mod bench_trace;
mod bench_ttq;
mod cli_bench;
mod cli_classification;
mod cli_data;
mod cli_export;
mod cli_inputs;
mod cli_manifests;
mod cli_pipelines;
mod cli_storage;
mod cli_texts;
mod cli_train;
mod demo;
mod demo_causal;
mod demo_classification;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Tensors start on cache lines (see [`lazytrain_core::LineAligned`]).
#[global_allocator]
static ALLOCATOR: lazytrain_core::LineAligned = lazytrain_core::LineAligned;

/// Train transformer language models with lazy tensors.
#[derive(Parser)]
#[command(name = "lazytrain", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The end-to-end demo on the embedded corpus: tokenizer, shards, a small
    /// RoBERTa MLM trained and evaluated, fill-mask answers from the saved model
    /// (`--task causal-lm`: a tiny GPT-2 and text-generation answers).
    Demo(demo::DemoArgs),
    /// Train a masked or causal LM, or fine-tune a sequence classifier, with the Trainer
    /// (HF TrainingArguments as flags or a config file).
    Train(Box<cli_train::TrainArgs>),
    /// Measure tracing cost per node and the cut+hash+lookup time of a large graph.
    BenchTrace(bench_trace::BenchTraceArgs),
    /// Time to quality: the protocol of ../shared/anchors/ttq_torch.py (tiny RoBERTa MLM on sotu.txt).
    BenchTtq(bench_ttq::TtqArgs),
    /// Predict masked tokens with a masked-LM model folder.
    FillMask(cli_pipelines::FillMaskArgs),
    /// Classify texts with a fine-tuned sequence-classification folder.
    TextClassification(cli_classification::TextClassificationArgs),
    /// Print the last hidden state of every token.
    FeatureExtraction(cli_pipelines::FeatureArgs),
    /// Continue texts with a GPT-2 model folder (greedy or sampled).
    TextGeneration(cli_pipelines::TextGenerationArgs),
    /// Re-write a model folder in the Hugging Face layout `transformers` loads.
    Export(cli_export::ExportArgs),
    /// Train a tokenizer (unigram, wordpiece or bpe) on text files.
    TrainTokenizer(cli_data::TrainTokenizerArgs),
    /// Tokenize text into fixed blocks and write TFRecord shards.
    Prepare(cli_data::PrepareArgs),
    /// Tokenize labelled rows (JSON Lines, CSV, TSV) into padded TFRecord shards with labels.json.
    PrepareClassification(cli_classification::PrepareClassificationArgs),
    /// Measure how many sequences per second the DeviceLoader delivers.
    BenchLoader(cli_data::BenchLoaderArgs),
    /// Time the BERT masked-LM training step of the PyTorch anchor benchmark.
    Bench(cli_bench::BenchArgs),
    /// Draw a run's loss and eval curves as a PNG.
    Plot(PlotArgs),
}

/// Options for `lazytrain plot`.
#[derive(clap::Args)]
struct PlotArgs {
    /// The run folder (an `--output-dir` of `lazytrain train`).
    #[arg(long)]
    run: std::path::PathBuf,
    /// The PNG to write.
    #[arg(long, default_value = "loss.png")]
    output: std::path::PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Demo(args) => demo::run(&args).map_err(Into::into),
        Command::Train(args) => cli_train::run(&args).map_err(Into::into),
        Command::BenchTrace(args) => bench_trace::run(&args).map_err(Into::into),
        Command::BenchTtq(args) => bench_ttq::run(&args).map_err(Into::into),
        Command::FillMask(args) => cli_pipelines::fill_mask(&args).map_err(Into::into),
        Command::TextClassification(args) => cli_classification::classify(&args).map_err(Into::into),
        Command::PrepareClassification(args) => cli_classification::prepare(&args).map_err(Into::into),
        Command::FeatureExtraction(args) => cli_pipelines::feature_extraction(&args).map_err(Into::into),
        Command::TextGeneration(args) => cli_pipelines::text_generation(&args).map_err(Into::into),
        Command::Export(args) => cli_export::run(&args).map_err(Into::into),
        Command::TrainTokenizer(args) => cli_data::train(&args).map_err(Into::into),
        Command::Prepare(args) => cli_data::run_prepare(&args).map_err(Into::into),
        Command::BenchLoader(args) => cli_data::bench_loader(&args).map_err(Into::into),
        Command::Bench(args) => cli_bench::run(&args).map_err(Into::into),
        Command::Plot(args) => lazytrain::plot::plot_run(&args.run, &args.output)
            .map(|()| println!("wrote {}", args.output.display()))
            .map_err(Into::into),
    };
    lazytrain_dist::finish_process();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
