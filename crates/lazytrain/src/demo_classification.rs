//! `lazytrain demo --task sequence-classification`: fine-tune the demo's
//! pre-trained masked LM as a review classifier — generated reviews written
//! as JSON Lines, `prepare-classification`, the Trainer with
//! `load_best_model_at_end`, evaluation, and the text-classification
//! pipeline on reviews the model never saw.

use crate::cli_train::{build_classifier, open_split};
use crate::demo::{print_report, DemoArgs};
use lazytrain::pipelines::TextClassification;
use lazytrain::trainer::{install_interrupt_handler, IntervalStrategy, Trainer, TrainingArguments};
use lazytrain::{Error, Result};
use lazytrain_core::Device;
use lazytrain_data::classification::demo_task::sentiment_reviews;
use lazytrain_data::classification::{prepare_classification, ClassificationOptions, Columns, LabelOrder};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::TextTokenizer;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Reviews generated for training and validation.
const REVIEWS: usize = 6000;
/// Fresh reviews (another seed) the saved model classifies at the end.
const FRESH: usize = 200;

/// Write reviews as JSON Lines with `text` and `label` columns.
fn write_reviews(path: &Path, seed: u64, countries: usize, count: usize) -> Result<()> {
    let lexicon = demo_corpus(seed, countries, 0).countries;
    let mut out = Vec::new();
    for review in sentiment_reviews(seed, &lexicon, count) {
        let line = serde_json::json!({ "text": review.text, "label": review.label });
        writeln!(out, "{line}").map_err(|e| Error::Input(e.to_string()))?;
    }
    std::fs::write(path, out).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// Fine-tune `pretrained` (a masked-LM folder with its tokenizer) and report.
pub fn run(args: &DemoArgs, pretrained: &Path) -> Result<()> {
    let start = Instant::now();
    let out = args.output_dir.join("classification");
    std::fs::create_dir_all(&out).map_err(|e| Error::Input(format!("{}: {e}", out.display())))?;
    let reviews = out.join("reviews.jsonl");
    write_reviews(&reviews, args.seed, args.countries, REVIEWS)?;
    println!("1/4 data: {REVIEWS} generated reviews labelled positive/negative -> {}", reviews.display());

    let tokenizer = TextTokenizer::from_path(pretrained)?;
    let options = ClassificationOptions {
        columns: Columns { text: "text".into(), text_pair: None, label: "label".into() },
        max_length: 64,
        buckets: vec![32],
        label_order: LabelOrder::Sorted,
        num_shards: 2,
        validation_fraction: 0.1,
        seed: args.seed,
        skip_bad_rows: false,
        progress: false,
    };
    let manifest = prepare_classification(&tokenizer, &[reviews], &[], &out.join("data"), &options)?;
    let count = |s: &[lazytrain_data::prepare::ShardInfo]| s.iter().map(|s| s.records).sum::<u64>();
    println!(
        "2/4 prepare-classification: {} train / {} validation rows, labels {:?}, buckets {:?}, {} truncated",
        count(&manifest.train),
        count(&manifest.validation),
        manifest.labels,
        manifest.buckets,
        manifest.truncated
    );

    let device = Device::cpu();
    let steps = args.fine_tune_steps.max(1);
    let every = (steps as u64).div_ceil(3);
    let training = TrainingArguments {
        output_dir: out.join("model").display().to_string(),
        overwrite_output_dir: true,
        max_steps: steps,
        per_device_train_batch_size: 32,
        per_device_eval_batch_size: 64,
        learning_rate: 1e-3,
        weight_decay: 0.01,
        warmup_steps: 0.1,
        logging_steps: 50,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(every),
        save_steps: every,
        save_total_limit: Some(1),
        load_best_model_at_end: true,
        metric_for_best_model: "accuracy".into(),
        seed: args.seed,
        report_to: vec!["jsonl".into()],
        ..TrainingArguments::default()
    };
    let model = build_classifier(&pretrained.display().to_string(), &tokenizer, &manifest.labels, args.seed, &device)?;
    let train = open_split(&lazytrain_storage::StorageUrl::Local(out.join("data")), "train", false)?;
    let eval = open_split(&lazytrain_storage::StorageUrl::Local(out.join("data")), "validation", false)?;
    install_interrupt_handler();
    let mut trainer = Trainer::for_classification(training, model, tokenizer, train, Some(eval), &manifest, &device)?
        .with_progress_bar(true);
    let result = trainer.train()?;
    let m = trainer.evaluate()?;
    println!(
        "3/4 fine-tuning {} from {}: {} steps, loss {:.3} -> {:.3}; best checkpoint {}; eval {m}",
        trainer.model.config().model_type.name(),
        pretrained.display(),
        result.global_step,
        result.losses.first().copied().unwrap_or(f32::NAN),
        result.losses.last().copied().unwrap_or(f32::NAN),
        trainer.state.best_model_checkpoint.as_deref().unwrap_or("none"),
    );
    println!("  eval accuracy      {:.4}", m.accuracy);

    let pipe = TextClassification::from_dir(&out.join("model"), &device)?;
    let lexicon = demo_corpus(args.seed, args.countries, 0).countries;
    let fresh = sentiment_reviews(args.seed.wrapping_add(1), &lexicon, FRESH);
    let texts: Vec<&str> = fresh.iter().map(|r| r.text.as_str()).collect();
    let predictions = pipe.predict(&texts, 1)?;
    let right = fresh.iter().zip(&predictions).filter(|(r, p)| p[0].label == r.label).count();
    println!("4/4 text-classification with the saved model ({}):", out.join("model").display());
    for (review, p) in fresh.iter().zip(&predictions).take(6) {
        let mark = if p[0].label == review.label { "correct" } else { "WRONG" };
        println!("  {:<48} -> {:<8} {:.2} {mark}", review.text, p[0].label, p[0].score);
    }
    let config = trainer.model.config();
    let flops = crate::cli_bench::flops_per_token(config.num_hidden_layers, config.hidden_size, 2, 32);
    print_report(args, start, &result, flops, &device)?;
    println!("  fresh reviews      {right}/{FRESH} classified correctly");
    Ok(())
}
