//! `lazytrain export`: re-write a model folder through lazytrain's writer.

use clap::Args;
use lazytrain::folder::save_folder;
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ModelType};
use std::path::{Path, PathBuf};

/// Options for `lazytrain export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The masked-LM or GPT-2 folder to read (config.json, model.safetensors, tokenizer.json), or
    /// a Hub id (org/name) in the local Hugging Face cache.
    #[arg(long)]
    model: String,
    /// The Hub revision (branch, tag or commit) of a cached --model.
    #[arg(long)]
    revision: Option<String>,
    /// Where to write the Hugging Face folder: a new or empty folder.
    #[arg(long)]
    output: PathBuf,
    /// Write into an --output folder that already holds files, replacing its
    /// config.json, model.safetensors and tokenizer files.
    #[arg(long)]
    overwrite: bool,
}

/// Refuse an --output that is a file, or a folder holding files (another
/// model, a training run's checkpoints) unless `--overwrite` says to replace
/// them.
fn check_output(output: &Path, overwrite: bool) -> lazytrain::Result<()> {
    let refuse = |detail: String| Err(lazytrain::Error::Input(format!("--output {}: {detail}", output.display())));
    lazytrain_core::check_output_folder("--output", output, "the exported model")
        .map_err(|e| lazytrain::Error::Input(e.to_string()))?;
    let Ok(entries) = std::fs::read_dir(output) else { return Ok(()) };
    let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if names.is_empty() || overwrite {
        return Ok(());
    }
    names.sort();
    refuse(format!(
        "already holds {} entries ({}{}); exporting would replace its config.json, model.safetensors and \
         tokenizer files. Name a new or empty folder, or pass --overwrite to replace them",
        names.len(),
        names.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
        if names.len() > 3 { ", ..." } else { "" }
    ))
}

/// Load a masked-LM or GPT-2 folder and save it as a folder `transformers`
/// loads (`AutoModelForMaskedLM` / `AutoModelForCausalLM`).
pub fn run(args: &ExportArgs) -> lazytrain::Result<()> {
    check_output(&args.output, args.overwrite)?;
    let device = Device::cpu();
    let dir = lazytrain::hub_cache::model_folder(&args.model, args.revision.as_deref())?;
    let tokenizer = TextTokenizer::from_path(&dir)?;
    let warnings = match hub::load_config(&dir)?.model_type {
        ModelType::Gpt2 => {
            let (model, warnings) = hub::load_causal_lm(&dir, &device)?;
            save_folder(&args.output, &model, model.config(), &tokenizer)?;
            warnings
        }
        ModelType::Bert | ModelType::Roberta => {
            let (model, warnings) = hub::load_masked_lm(&dir, &device)?;
            save_folder(&args.output, &model, model.config(), &tokenizer)?;
            warnings
        }
    };
    for w in warnings {
        eprintln!("warning: {w}");
    }
    println!("wrote {}", args.output.display());
    Ok(())
}
