//! The fill-mask pipeline.

use super::{encode_batch, in_batches};
use crate::folder::check_tokenizer_fits;
use crate::{Error, Result};
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ForMaskedLM};
use lazytrain_nn::Context;
use serde::Serialize;
use std::path::Path;

/// One candidate for one mask, as HF's pipeline reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MaskPrediction {
    /// Softmax probability.
    pub score: f32,
    /// Token id.
    pub token: u32,
    /// The token as text.
    pub token_str: String,
    /// The input with this token in place of the mask.
    pub sequence: String,
}

/// The predictions for one text: top-k per mask, in mask order.
pub type TextPredictions = Vec<Vec<MaskPrediction>>;

/// Predict masked tokens with a masked-LM model.
pub struct FillMask {
    model: ForMaskedLM,
    tokenizer: TextTokenizer,
    device: Device,
    mask_id: u32,
    mask_token: &'static str,
    batch_size: Option<usize>,
    warnings: Vec<String>,
}

/// The tokenizer's mask token (id and text), or an error for a tokenizer
/// without one.
fn mask_of(tokenizer: &TextTokenizer) -> Result<(u32, &'static str)> {
    match (tokenizer.special().mask, tokenizer.mask_token()) {
        (Some(id), Some(text)) => Ok((id, text)),
        _ => Err(Error::Input(
            "the tokenizer has no mask token (a GPT-2 tokenizer); fill-mask needs a BERT or RoBERTa model, \
             text-generation suits GPT-2"
                .into(),
        )),
    }
}

impl FillMask {
    /// Load a model folder (config, weights, tokenizer).
    pub fn from_dir(dir: &Path, device: &Device) -> Result<FillMask> {
        let tokenizer = TextTokenizer::from_path(dir)?;
        let (model, warnings) = hub::load_masked_lm(dir, device)?;
        let mut pipe = FillMask::new(model, tokenizer, device)?;
        pipe.warnings = warnings;
        Ok(pipe)
    }

    /// Use an in-memory model and tokenizer.
    pub fn new(model: ForMaskedLM, tokenizer: TextTokenizer, device: &Device) -> Result<FillMask> {
        check_tokenizer_fits(model.config(), &tokenizer)?;
        let (mask_id, mask_token) = mask_of(&tokenizer)?;
        Ok(FillMask {
            model,
            tokenizer,
            device: device.clone(),
            mask_id,
            mask_token,
            batch_size: None,
            warnings: Vec::new(),
        })
    }

    /// What loading the weights reported (an unused pooler or head, ...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Run texts in batches of `size` rows (HF's `batch_size`) instead of
    /// all at once: every batch has the same shape per length bucket.
    pub fn with_batch_size(mut self, size: usize) -> FillMask {
        self.batch_size = Some(size.max(1));
        self
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// For each text, the `top_k` predictions for each mask token. As in HF, a
    /// single mask's `sequence` drops special tokens; with several masks it
    /// keeps them (the other masks stay visible).
    pub fn predict(&self, texts: &[&str], top_k: usize) -> Result<Vec<TextPredictions>> {
        in_batches(texts, self.batch_size, |chunk, rows| self.predict_batch(chunk, top_k, rows))
    }

    /// [`FillMask::predict`] on one batch of `rows` rows.
    fn predict_batch(&self, texts: &[&str], top_k: usize, rows: usize) -> Result<Vec<TextPredictions>> {
        let (mask_id, mask_token) = (self.mask_id, self.mask_token);
        for (i, text) in texts.iter().enumerate() {
            if !self.tokenizer.encode(text, true)?.contains(&mask_id) {
                return Err(Error::Input(format!(
                    "text {} ({}) has no mask token {mask_token}; put {mask_token} where a word should be predicted",
                    i + 1,
                    super::excerpt(text)
                )));
            }
        }
        let max_len = self.model.config().max_sequence_length();
        let batch = encode_batch(&self.tokenizer, texts, rows, max_len, &self.device)?;
        let logits = self.model.forward(&batch.input_ids, Some(&batch.attention_mask), None, &Context::eval())?;
        self.device.sync()?;
        let values = logits.to_vec::<f32>()?;
        let vocab = logits.dims()[2];
        let mut out = Vec::with_capacity(texts.len());
        for (b, ids) in batch.ids.iter().enumerate() {
            let positions: Vec<usize> = ids.iter().enumerate().filter(|(_, &t)| t == mask_id).map(|(i, _)| i).collect();
            let single = positions.len() == 1;
            let mut per_mask = Vec::with_capacity(positions.len());
            for &pos in &positions {
                let row = &values[(b * batch.seq + pos) * vocab..(b * batch.seq + pos + 1) * vocab];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f64> = row.iter().map(|&v| ((v - max) as f64).exp()).collect();
                let total: f64 = exps.iter().sum();
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &c| exps[c].total_cmp(&exps[a]).then(a.cmp(&c)));
                // No more predictions than tokens (as Hugging Face's pipeline).
                let mut predictions = Vec::with_capacity(top_k.min(vocab));
                for &token in order.iter().take(top_k) {
                    let mut filled = ids.clone();
                    filled[pos] = token as u32;
                    predictions.push(MaskPrediction {
                        score: (exps[token] / total) as f32,
                        token: token as u32,
                        token_str: self.tokenizer.decode(&[token as u32], false)?,
                        sequence: self.tokenizer.decode(&filled, single)?,
                    });
                }
                per_mask.push(predictions);
            }
            out.push(per_mask);
        }
        Ok(out)
    }
}
