//! `lazytrain prepare-classification` and `lazytrain text-classification`.

use crate::cli_storage::{input_files, staging, tokenizer_path, OutputFolder};
use crate::cli_texts::TextInputs;
use clap::Args;
use lazytrain::pipelines::{LabelScore, TextClassification};
use lazytrain_core::Device;
use lazytrain_data::classification::{prepare_classification, ClassificationOptions, Columns, LabelOrder};
use lazytrain_data::TextTokenizer;
use lazytrain_storage::StorageUrl;
use std::time::Instant;

/// Options for `lazytrain prepare-classification`.
#[derive(Args)]
pub struct PrepareClassificationArgs {
    /// A tokenizer folder (or tokenizer.json), or a gs://, s3:// folder.
    #[arg(long)]
    tokenizer: StorageUrl,
    /// Labelled training files: .jsonl (JSON Lines), .csv or .tsv with a header (each also .gz or .zst),
    /// .parquet, a `datasets` .arrow file or .feather; paths and quoted patterns, or gs://, s3:// objects and patterns.
    #[arg(long, required = true, num_args = 1..)]
    files: Vec<StorageUrl>,
    /// Labelled validation files (labels must occur in the training files);
    /// without them --validation-fraction of the training rows are held out.
    #[arg(long, num_args = 1..)]
    validation_files: Vec<StorageUrl>,
    /// The text column.
    #[arg(long, default_value = "text")]
    text_column: String,
    /// The second text of pair tasks (e.g. a hypothesis), if any.
    #[arg(long)]
    text_pair_column: Option<String>,
    /// The label column (strings, integers or booleans).
    #[arg(long, default_value = "label")]
    label_column: String,
    /// Longest sequence in tokens (special tokens included); longer rows are truncated and counted.
    #[arg(long, default_value_t = 128)]
    max_length: usize,
    /// Pad each row to the smallest of these lengths that fits (e.g. 32,64,128) instead of to --max-length.
    #[arg(long, value_delimiter = ',')]
    buckets: Vec<usize>,
    /// How label ids are assigned: sorted (numerically if all labels are integers) or first-seen.
    #[arg(long, default_value = "sorted")]
    label_order: String,
    /// Training shards.
    #[arg(long, default_value_t = 4)]
    num_shards: usize,
    /// Fraction of training rows held out when no --validation-files are given.
    #[arg(long, default_value_t = 0.1)]
    validation_fraction: f64,
    /// Seed of the split.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Skip and count bad rows instead of stopping at the first.
    #[arg(long)]
    skip_bad_rows: bool,
    /// Output folder, or a gs://, s3:// prefix.
    #[arg(long)]
    output: StorageUrl,
}

/// Tokenize, pad and shard labelled rows.
pub fn prepare(args: &PrepareClassificationArgs) -> lazytrain::Result<()> {
    let start = Instant::now();
    let tokenizer = TextTokenizer::from_path(&tokenizer_path(&args.tokenizer)?)?;
    let staging = staging("inputs")?;
    let files = input_files(&args.files, &staging)?;
    let validation_files = input_files(&args.validation_files, &staging)?;
    let options = ClassificationOptions {
        columns: Columns {
            text: args.text_column.clone(),
            text_pair: args.text_pair_column.clone(),
            label: args.label_column.clone(),
        },
        max_length: args.max_length,
        buckets: args.buckets.clone(),
        label_order: LabelOrder::parse(&args.label_order)?,
        num_shards: args.num_shards,
        validation_fraction: args.validation_fraction,
        seed: args.seed,
        skip_bad_rows: args.skip_bad_rows,
        progress: true,
    };
    let output = OutputFolder::new(&args.output)?;
    let m = prepare_classification(&tokenizer, &files, &validation_files, &output.path(), &options)?;
    output.publish(&["manifest.json"])?;
    let records = |shards: &[lazytrain_data::prepare::ShardInfo]| shards.iter().map(|s| s.records).sum::<u64>();
    println!(
        "{} rows -> {} train and {} validation, {} labels ({}), {} truncated to {} tokens, buckets {:?} in {:.1} s -> {}",
        m.rows,
        records(&m.train),
        records(&m.validation),
        m.labels.len(),
        m.labels.join(", "),
        m.truncated,
        m.max_length,
        m.buckets,
        start.elapsed().as_secs_f64(),
        args.output
    );
    for (kind, count) in &m.skipped_rows {
        println!("skipped {count} bad rows: {kind:?}");
    }
    if !args.buckets.is_empty() && !args.buckets.contains(&m.max_length) {
        eprintln!(
            "note: added a bucket of --max-length {} tokens for the rows longer than {:?} (every row needs a bucket)",
            m.max_length, args.buckets
        );
    }
    let validation = records(&m.validation);
    if validation > 0 && validation < SMALL_VALIDATION {
        eprintln!(
            "warning: the validation split has only {validation} rows; its accuracy moves in steps of {:.0} %, too \
             coarse to compare runs or pick the best checkpoint; give --validation-fraction or --validation-files more rows",
            100.0 / validation as f64
        );
    }
    Ok(())
}

/// Fewer validation rows than this get a warning.
const SMALL_VALIDATION: u64 = 50;

/// Options for `lazytrain text-classification`.
#[derive(Args)]
pub struct TextClassificationArgs {
    #[command(flatten)]
    inputs: TextInputs,
    /// Labels per text, most likely first (at most the model's labels are shown).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    top_k: usize,
}

/// Classify texts and print their labels.
pub fn classify(args: &TextClassificationArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let mut pipe = TextClassification::from_dir(&args.inputs.model_dir()?, &device)?;
    if args.inputs.streaming() {
        pipe = pipe.with_batch_size(args.inputs.batch_size);
    }
    // HF: top-1 is a one-element list per text, top-k the k labels.
    let per_text = |labels: &Vec<LabelScore>| match args.top_k {
        1 => serde_json::json!([labels[0]]),
        _ => serde_json::json!(labels),
    };
    let (start, compiles) = (Instant::now(), device.metrics().compiles);
    let count = args.inputs.for_each_batch(|texts| {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let results = pipe.predict(&refs, args.top_k)?;
        if args.inputs.json && args.inputs.streaming() {
            return TextInputs::print_lines(results.iter().map(per_text));
        }
        if args.inputs.json {
            // HF: a list of {label, score} per text; one text's top-1 is a one-element list.
            let value = if args.top_k == 1 {
                serde_json::json!(results.iter().map(|r| &r[0]).collect::<Vec<_>>())
            } else if results.len() == 1 {
                serde_json::json!(results[0])
            } else {
                serde_json::json!(results)
            };
            println!("{value}");
            return Ok(());
        }
        for (text, labels) in refs.iter().zip(&results) {
            let shown: Vec<String> = labels.iter().map(|l| format!("{} {:.4}", l.label, l.score)).collect();
            println!("{text}\n  {}", shown.join(", "));
        }
        Ok(())
    })?;
    args.inputs.report(count, start, compiles, &device);
    Ok(())
}
