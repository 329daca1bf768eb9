//! `lazytrain export`: re-write a model folder through lazytrain's writer.

use clap::Args;
use lazytrain::folder::save_folder;
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ModelType};
use std::path::PathBuf;

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
    /// Where to write the Hugging Face folder.
    #[arg(long)]
    output: PathBuf,
}

/// Load a masked-LM or GPT-2 folder and save it as a folder `transformers`
/// loads (`AutoModelForMaskedLM` / `AutoModelForCausalLM`).
pub fn run(args: &ExportArgs) -> lazytrain::Result<()> {
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
