//! `lazytrain fill-mask`, `lazytrain feature-extraction` and `lazytrain text-generation`.

use clap::Args;
use lazytrain::pipelines::{FeatureExtraction, FillMask, TextGeneration};
use lazytrain_core::Device;
use std::path::PathBuf;

/// Options for `lazytrain fill-mask`.
#[derive(Args)]
pub struct FillMaskArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Predictions per mask.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// Print JSON shaped like Hugging Face's pipeline output.
    #[arg(long)]
    json: bool,
    /// Texts containing the mask token ([MASK] or <mask>).
    #[arg(required = true)]
    texts: Vec<String>,
}

/// Run fill-mask and print the predictions.
pub fn fill_mask(args: &FillMaskArgs) -> lazytrain::Result<()> {
    let pipe = FillMask::from_dir(&args.model, &Device::cpu())?;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let results = pipe.predict(&texts, args.top_k)?;
    if args.json {
        // HF: a flat list for one mask, a list per mask for several; a list per text for several texts.
        let per_text: Vec<serde_json::Value> = results
            .iter()
            .map(|masks| if masks.len() == 1 { serde_json::json!(masks[0]) } else { serde_json::json!(masks) })
            .collect();
        let value = if per_text.len() == 1 { per_text[0].clone() } else { serde_json::json!(per_text) };
        println!("{value}");
        return Ok(());
    }
    for (text, masks) in texts.iter().zip(&results) {
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
}

/// Options for `lazytrain feature-extraction`.
#[derive(Args)]
pub struct FeatureArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Print JSON shaped like Hugging Face's pipeline output.
    #[arg(long)]
    json: bool,
    /// Texts to encode.
    #[arg(required = true)]
    texts: Vec<String>,
}

/// Run feature extraction and print the features.
pub fn feature_extraction(args: &FeatureArgs) -> lazytrain::Result<()> {
    let pipe = FeatureExtraction::from_dir(&args.model, &Device::cpu())?;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let features = pipe.extract(&texts)?;
    if args.json {
        // HF wraps each text's [tokens][hidden] in a batch-of-one list.
        let per_text: Vec<serde_json::Value> = features.iter().map(|f| serde_json::json!([f])).collect();
        let value = if per_text.len() == 1 { per_text[0].clone() } else { serde_json::json!(per_text) };
        println!("{value}");
        return Ok(());
    }
    for (text, f) in texts.iter().zip(&features) {
        let hidden = f.first().map_or(0, Vec::len);
        println!("{text}: {} tokens x {hidden} features", f.len());
        for (t, row) in f.iter().enumerate() {
            let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:.4}")).collect();
            println!("  token {t}: [{}, ...]", head.join(", "));
        }
    }
    Ok(())
}

/// Options for `lazytrain text-generation`.
#[derive(Args)]
pub struct TextGenerationArgs {
    /// A GPT-2 model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
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
    /// Print JSON shaped like Hugging Face's pipeline output.
    #[arg(long)]
    json: bool,
    /// Report tokens/s and graphs compiled on stderr.
    #[arg(long)]
    verbose: bool,
    /// Texts to continue (put `--` before texts that begin with `-`).
    #[arg(required = true)]
    texts: Vec<String>,
}

/// Run text generation and print the continuations.
pub fn text_generation(args: &TextGenerationArgs) -> lazytrain::Result<()> {
    let pipe = TextGeneration::from_dir(&args.model, &Device::cpu())?;
    for warning in pipe.warnings() {
        eprintln!("warning: {warning}");
    }
    let mut config = pipe.config_for(args.max_new_tokens)?;
    config.do_sample = args.do_sample;
    config.temperature = args.temperature;
    config.top_k = Some(args.top_k).filter(|&k| k > 0);
    config.top_p = Some(args.top_p);
    config.seed = args.seed;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let (results, stats) = pipe.generate(&texts, &config)?;
    if args.verbose {
        eprintln!(
            "generated {} tokens in {:.2} s ({:.1} tokens/s), {} graphs compiled",
            stats.new_tokens,
            stats.seconds,
            stats.new_tokens as f64 / stats.seconds.max(1e-9),
            stats.compiles
        );
    }
    if args.json {
        let value = if results.len() == 1 { serde_json::json!(results[0]) } else { serde_json::json!(results) };
        println!("{value}");
        return Ok(());
    }
    for result in &results {
        println!("{}", result[0].generated_text);
    }
    Ok(())
}
