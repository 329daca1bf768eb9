//! The text-generation pipeline (Hugging Face's `pipeline("text-generation")`).

use crate::folder::check_tokenizer_fits;
use crate::{Error, Result};
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::generation::{generate, GenerationConfig};
use lazytrain_models::{hub, Gpt2LMHeadModel};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// One continuation, as HF's pipeline reports it: the prompt followed by
/// the generated text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GeneratedText {
    /// Prompt + continuation.
    pub generated_text: String,
}

/// What a call cost: tokens made, time and graphs compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationStats {
    /// New tokens over all texts.
    pub new_tokens: usize,
    /// Wall time of the call.
    pub seconds: f64,
    /// Graphs compiled during the call (one prefill per prompt bucket and
    /// one decode graph at most; none once they are cached).
    pub compiles: u64,
}

/// Continue texts with a GPT-2 model.
pub struct TextGeneration {
    model: Gpt2LMHeadModel,
    tokenizer: TextTokenizer,
    device: Device,
    warnings: Vec<String>,
    batch_size: Option<usize>,
}

impl TextGeneration {
    /// Load a model folder (config, weights, tokenizer).
    pub fn from_dir(dir: &Path, device: &Device) -> Result<TextGeneration> {
        let tokenizer = TextTokenizer::from_path(dir)?;
        let (model, warnings) = hub::load_causal_lm(dir, device)?;
        let mut pipe = TextGeneration::new(model, tokenizer, device)?;
        pipe.warnings = warnings;
        Ok(pipe)
    }

    /// Use an in-memory model and tokenizer.
    pub fn new(model: Gpt2LMHeadModel, tokenizer: TextTokenizer, device: &Device) -> Result<TextGeneration> {
        check_tokenizer_fits(model.config(), &tokenizer)?;
        Ok(TextGeneration { model, tokenizer, device: device.clone(), warnings: Vec::new(), batch_size: None })
    }

    /// Generate for at most `size` texts at a time (HF's `batch_size`).
    pub fn with_batch_size(mut self, size: usize) -> TextGeneration {
        self.batch_size = Some(size.max(1));
        self
    }

    /// What loading the weights reported (unused tensors and the like).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The settings a call with `max_new_tokens` (or none) starts from: the
    /// model's eos stops a row; without an eos token a limit must be given.
    pub fn config_for(&self, max_new_tokens: Option<usize>) -> Result<GenerationConfig> {
        let eos_token_id = self.model.config().eos_token_id.map(|id| id as u32);
        let max_new_tokens = match (max_new_tokens, eos_token_id) {
            (Some(n), _) => n,
            (None, Some(_)) => 50,
            (None, None) => {
                return Err(Error::Input(
                    "the model's config.json has no eos_token_id, so generation could only stop at its length \
                     limit; pass --max-new-tokens N"
                        .into(),
                ))
            }
        };
        Ok(GenerationConfig { max_new_tokens, eos_token_id, ..GenerationConfig::default() })
    }

    /// Continue each text (one batch, or batches of the batch size; each
    /// row stops at its eos). The
    /// generated text is decoded without special tokens and follows the
    /// prompt as written, as HF's `return_full_text=True` does.
    pub fn generate(
        &self,
        texts: &[&str],
        config: &GenerationConfig,
    ) -> Result<(Vec<Vec<GeneratedText>>, GenerationStats)> {
        if texts.is_empty() {
            return Err(Error::Input("no input text was given".into()));
        }
        let prompts =
            texts.iter().map(|t| self.tokenizer.encode(t, true)).collect::<lazytrain_data::Result<Vec<_>>>()?;
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(Error::Input(format!(
                "text {} ({}) has no tokens to continue",
                i + 1,
                super::excerpt(texts[i])
            )));
        }
        let start = Instant::now();
        let compiles = self.device.metrics().compiles;
        let batch = self.batch_size.unwrap_or(prompts.len()).max(1);
        let mut generated = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(batch) {
            generated.extend(generate(&self.model, chunk, config, &self.device)?.tokens);
        }
        let mut results = Vec::with_capacity(texts.len());
        for ((text, prompt), new) in texts.iter().zip(&prompts).zip(&generated) {
            let full: Vec<u32> = prompt.iter().chain(new).copied().collect();
            let all = self.tokenizer.decode(&full, true)?;
            let prompt_chars = self.tokenizer.decode(prompt, true)?.chars().count();
            let continuation: String = all.chars().skip(prompt_chars).collect();
            results.push(vec![GeneratedText { generated_text: format!("{text}{continuation}") }]);
        }
        let stats = GenerationStats {
            new_tokens: generated.iter().map(Vec::len).sum(),
            seconds: start.elapsed().as_secs_f64(),
            compiles: self.device.metrics().compiles - compiles,
        };
        Ok((results, stats))
    }
}
