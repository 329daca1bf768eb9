//! Inference pipelines with Hugging Face's output shapes.
//!
//! Texts are tokenized, padded to a common length with an attention mask
//! and run as one batch; padding never changes a text's result.

mod feature_extraction;
mod fill_mask;
mod text_classification;
mod text_generation;

pub use feature_extraction::FeatureExtraction;
pub use fill_mask::{FillMask, MaskPrediction, TextPredictions};
pub use text_classification::{LabelScore, TextClassification};
pub use text_generation::{GeneratedText, GenerationStats, TextGeneration};

use crate::Result;
use lazytrain_core::{Device, Tensor};
use lazytrain_data::TextTokenizer;

/// A tokenized, padded batch.
pub(crate) struct Batch {
    /// Token ids per text, unpadded.
    pub ids: Vec<Vec<u32>>,
    /// `[batch, seq]` ids padded with the pad id.
    pub input_ids: Tensor,
    /// `[batch, seq]`, 1 for tokens and 0 for padding.
    pub attention_mask: Tensor,
    /// The padded length.
    pub seq: usize,
}

/// Tokenize `texts` (with special tokens) into one padded batch, refusing
/// texts longer than `max_len` tokens.
pub(crate) fn encode_batch(
    tokenizer: &TextTokenizer,
    texts: &[&str],
    max_len: usize,
    device: &Device,
) -> Result<Batch> {
    if texts.is_empty() {
        return Err(crate::Error::Input("no input text was given".into()));
    }
    let ids = texts.iter().map(|t| tokenizer.encode(t, true)).collect::<lazytrain_data::Result<Vec<_>>>()?;
    let seq = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
    if seq > max_len {
        return Err(crate::Error::Input(format!("a text has {seq} tokens but the model accepts at most {max_len}")));
    }
    let pad = tokenizer.special().pad as i64;
    let mut flat = Vec::with_capacity(ids.len() * seq);
    let mut mask = Vec::with_capacity(ids.len() * seq);
    for row in &ids {
        flat.extend(row.iter().map(|&t| t as i64));
        flat.extend(std::iter::repeat_n(pad, seq - row.len()));
        mask.extend(std::iter::repeat_n(1i64, row.len()));
        mask.extend(std::iter::repeat_n(0i64, seq - row.len()));
    }
    let b = ids.len();
    Ok(Batch {
        input_ids: Tensor::from_vec(flat, [b, seq], device)?,
        attention_mask: Tensor::from_vec(mask, [b, seq], device)?,
        ids,
        seq,
    })
}
