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
    /// The masked-LM or GPT-2 folder to read (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Where to write the Hugging Face folder.
    #[arg(long)]
    output: PathBuf,
}

/// Load a masked-LM or GPT-2 folder and save it as a folder `transformers`
/// loads (`AutoModelForMaskedLM` / `AutoModelForCausalLM`).
pub fn run(args: &ExportArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let tokenizer = TextTokenizer::from_path(&args.model)?;
    let warnings = match hub::load_config(&args.model)?.model_type {
        ModelType::Gpt2 => {
            let (model, warnings) = hub::load_causal_lm(&args.model, &device)?;
            save_folder(&args.output, &model, model.config(), &tokenizer)?;
            warnings
        }
        ModelType::Bert | ModelType::Roberta => {
            let (model, warnings) = hub::load_masked_lm(&args.model, &device)?;
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
