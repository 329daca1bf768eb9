//! `lazytrain export`: re-write a model folder through lazytrain's writer.

use clap::Args;
use lazytrain::folder::save_folder;
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::hub;
use std::path::PathBuf;

/// Options for `lazytrain export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The masked-LM folder to read (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Where to write the Hugging Face folder.
    #[arg(long)]
    output: PathBuf,
}

/// Load a masked-LM folder and save it as a folder `transformers` loads.
pub fn run(args: &ExportArgs) -> lazytrain::Result<()> {
    let device = Device::cpu();
    let tokenizer = TextTokenizer::from_path(&args.model)?;
    let (model, warnings) = hub::load_masked_lm(&args.model, &device)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    save_folder(&args.output, &model, model.config(), &tokenizer)?;
    println!("wrote {}", args.output.display());
    Ok(())
}
