//! `lazytrain fill-mask`, `lazytrain feature-extraction` and `lazytrain text-generation`.

use crate::cli_texts::TextInputs;
use clap::Args;
use lazytrain::pipelines::{FeatureExtraction, FillMask, TextGeneration};
use lazytrain_core::Device;
use std::time::Instant;

/// Options for `lazytrain fill-mask`.
#[derive(Args)]
pub struct FillMaskArgs {
    #[command(flatten)]
    inputs: TextInputs,
    /// Predictions per mask (at most the vocabulary).
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    top_k: usize,
}

/// HF's shape for one text: a flat list for one mask, a list per mask for several.
fn masks_value(masks: &lazytrain::pipelines::TextPredictions) -> serde_json::Value {
    if masks.len() == 1 {
        serde_json::json!(masks[0])
    } else {
        serde_json::json!(masks)
    }
}

/// Run fill-mask and print the predictions.
pub fn fill_mask(args: &FillMaskArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let mut pipe = FillMask::from_dir(&args.inputs.model_dir()?, &device)?;
    for warning in pipe.warnings() {
        eprintln!("warning: {warning}");
    }
    if args.inputs.streaming() {
        pipe = pipe.with_batch_size(args.inputs.batch_size);
    }
    let (start, compiles) = (Instant::now(), device.metrics().compiles);
    let count = args.inputs.for_each_batch(|texts| {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let results = pipe.predict(&refs, args.top_k)?;
        if args.inputs.json && args.inputs.streaming() {
            return TextInputs::print_lines(results.iter().map(masks_value));
        }
        if args.inputs.json {
            // HF: a list per text for several texts.
            let per_text: Vec<serde_json::Value> = results.iter().map(masks_value).collect();
            let value = if per_text.len() == 1 { per_text[0].clone() } else { serde_json::json!(per_text) };
            println!("{value}");
            return Ok(());
        }
        for (text, masks) in refs.iter().zip(&results) {
            println!("{text}");
            for (m, predictions) in masks.iter().enumerate() {
                if masks.len() > 1 {
                    println!("  mask {}:", m + 1);
                }
                for p in predictions {
                    println!("  {:>7.4}  {:<15} {}", p.score, p.token_str, p.sequence);
                }
            }
        }
        Ok(())
    })?;
    args.inputs.report(count, start, compiles, &device);
    Ok(())
}

/// Options for `lazytrain feature-extraction`.
#[derive(Args)]
pub struct FeatureArgs {
    #[command(flatten)]
    inputs: TextInputs,
}

/// Run feature extraction and print the features.
pub fn feature_extraction(args: &FeatureArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let mut pipe = FeatureExtraction::from_dir(&args.inputs.model_dir()?, &device)?;
    if args.inputs.streaming() {
        pipe = pipe.with_batch_size(args.inputs.batch_size);
    }
    let (start, compiles) = (Instant::now(), device.metrics().compiles);
    let count = args.inputs.for_each_batch(|texts| {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let features = pipe.extract(&refs)?;
        // HF wraps each text's [tokens][hidden] in a batch-of-one list.
        let per_text = features.iter().map(|f| serde_json::json!([f]));
        if args.inputs.json && args.inputs.streaming() {
            return TextInputs::print_lines(per_text);
        }
        if args.inputs.json {
            let per_text: Vec<serde_json::Value> = per_text.collect();
            let value = if per_text.len() == 1 { per_text[0].clone() } else { serde_json::json!(per_text) };
            println!("{value}");
            return Ok(());
        }
        for (text, f) in refs.iter().zip(&features) {
            let hidden = f.first().map_or(0, Vec::len);
            println!("{text}: {} tokens x {hidden} features", f.len());
            for (t, row) in f.iter().enumerate() {
                let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:.4}")).collect();
                println!("  token {t}: [{}, ...]", head.join(", "));
            }
        }
        Ok(())
    })?;
    args.inputs.report(count, start, compiles, &device);
    Ok(())
}

/// Options for `lazytrain text-generation`.
#[derive(Args)]
pub struct TextGenerationArgs {
    #[command(flatten)]
    inputs: TextInputs,
    /// Tokens to add to each text (default: 50, stopping early at the model's eos token).
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Sample the next token instead of taking the most likely one.
    #[arg(long)]
    do_sample: bool,
    /// Divide the logits by this before sampling.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Sample among the k most likely tokens (0: all of them).
    #[arg(long, default_value_t = 50)]
    top_k: usize,
    /// Sample among the most likely tokens holding this much probability, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Sampling seed (the same seed gives the same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Run text generation and print the continuations.
pub fn text_generation(args: &TextGenerationArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let mut pipe = TextGeneration::from_dir(&args.inputs.model_dir()?, &device)?;
    for warning in pipe.warnings() {
        eprintln!("warning: {warning}");
    }
    if args.inputs.streaming() {
        pipe = pipe.with_batch_size(args.inputs.batch_size);
    }
    let mut config = pipe.config_for(args.max_new_tokens)?;
    config.do_sample = args.do_sample;
    config.temperature = args.temperature;
    config.top_k = Some(args.top_k).filter(|&k| k > 0);
    config.top_p = Some(args.top_p);
    config.seed = args.seed;
    let (start, compiles) = (Instant::now(), device.metrics().compiles);
    let mut new_tokens = 0;
    let count = args.inputs.for_each_batch(|texts| {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (results, stats) = pipe.generate(&refs, &config)?;
        new_tokens += stats.new_tokens;
        if args.inputs.json && args.inputs.streaming() {
            return TextInputs::print_lines(&results);
        }
        if args.inputs.json {
            let value = if results.len() == 1 { serde_json::json!(results[0]) } else { serde_json::json!(results) };
            println!("{value}");
            return Ok(());
        }
        for result in &results {
            println!("{}", result[0].generated_text);
        }
        Ok(())
    })?;
    if args.inputs.verbose {
        let seconds = start.elapsed().as_secs_f64();
        eprintln!(
            "generated {new_tokens} tokens for {count} texts in {seconds:.2} s ({:.1} tokens/s), {} graphs compiled",
            new_tokens as f64 / seconds.max(1e-9),
            device.metrics().compiles - compiles
        );
    }
    Ok(())
}
