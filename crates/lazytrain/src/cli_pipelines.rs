//! `lazytrain fill-mask` and `lazytrain feature-extraction`.

use clap::Args;
use lazytrain::pipelines::{FeatureExtraction, FillMask};
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
