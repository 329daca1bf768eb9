//! A Hugging Face model folder: model weights, config and tokenizer together.

use crate::{Error, Result};
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ModelConfig, ModelType};
use lazytrain_nn::Module;
use std::path::Path;

/// Refuse a tokenizer the model cannot read: one with more tokens than the
/// model's `vocab_size` (an id past the embeddings), or whose pad id is not
/// the config's `pad_token_id` (RoBERTa's position ids are computed from it,
/// so a mismatch silently corrupts every prediction; BERT's must match too).
pub fn check_tokenizer_fits(config: &ModelConfig, tokenizer: &TextTokenizer) -> Result<()> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(Error::Input(format!(
            "the tokenizer has {} tokens but the model's vocab_size is {}; use the model's own tokenizer (or \
             resize the model's embeddings and train it)",
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    let pad = tokenizer.special().pad as i64;
    if config.pad_token_id != pad {
        let kind = match config.model_type {
            ModelType::Bert => "BERT",
            ModelType::Roberta => "RoBERTa",
            // GPT-2 pads with whatever id it likes: padding is masked, never embedded by position.
            ModelType::Gpt2 => return Ok(()),
        };
        return Err(Error::Input(format!(
            "the {kind} config has pad_token_id {} but the tokenizer pads with id {pad}; set pad_token_id to {pad} in config.json",
            config.pad_token_id
        )));
    }
    Ok(())
}

/// Write a folder `transformers` loads with `AutoModelForMaskedLM` /
/// `AutoTokenizer`: `config.json`, `model.safetensors`, `tokenizer.json`,
/// `tokenizer_config.json` and `special_tokens_map.json`.
pub fn save_folder(dir: &Path, module: &dyn Module, config: &ModelConfig, tokenizer: &TextTokenizer) -> Result<()> {
    check_tokenizer_fits(config, tokenizer)?;
    hub::save_pretrained(dir, module, config)?;
    tokenizer.save(dir, config.max_sequence_length())?;
    Ok(())
}
