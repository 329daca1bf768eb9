//! Inference pipelines with Hugging Face's output shapes.
//!
//! Texts are tokenized, padded with an attention mask to a common length
//! (rounded up to a multiple of [`SEQ_BUCKET`] tokens, so similar lengths
//! share one compiled graph) and run as one batch — or, with a batch size
//! (HF's `batch_size`), in batches of exactly that many rows, the last one
//! filled with empty rows, so a stream of texts compiles once per length
//! bucket. Padding never changes a text's result.

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

/// Batches are padded to a multiple of this many tokens.
pub const SEQ_BUCKET: usize = 16;

/// Run `run` on all of `texts` at once (`batch_size` `None`), or on
/// chunks of `batch_size` texts, telling it how many rows to pad to.
pub(crate) fn in_batches<T>(
    texts: &[&str],
    batch_size: Option<usize>,
    mut run: impl FnMut(&[&str], usize) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    match batch_size {
        None => run(texts, texts.len()),
        Some(size) => {
            let mut out = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(size.max(1)) {
                out.extend(run(chunk, size.max(1))?);
            }
            Ok(out)
        }
    }
}

/// A tokenized, padded batch.
pub(crate) struct Batch {
    /// Token ids per text, unpadded (padding rows have none).
    pub ids: Vec<Vec<u32>>,
    /// `[rows, seq]` ids padded with the pad id.
    pub input_ids: Tensor,
    /// `[rows, seq]`, 1 for tokens and 0 for padding.
    pub attention_mask: Tensor,
    /// The padded length.
    pub seq: usize,
}

/// Longest part of a text an error quotes, in characters.
const QUOTED_CHARS: usize = 60;

/// A text as an error quotes it: its first [`QUOTED_CHARS`] characters,
/// quoted, and `...` when the text is longer (a 50 MB line is not echoed).
pub(crate) fn excerpt(text: &str) -> String {
    let head: String = text.chars().take(QUOTED_CHARS).collect();
    let more = if head.len() < text.len() { "..." } else { "" };
    format!("{head:?}{more}")
}

/// Tokenize `texts` (with special tokens) into one batch of at least
/// `rows` rows (extra rows are all padding), padded to a multiple of
/// [`SEQ_BUCKET`] tokens; texts longer than `max_len` tokens are refused.
/// Errors count texts from 1.
pub(crate) fn encode_batch(
    tokenizer: &TextTokenizer,
    texts: &[&str],
    rows: usize,
    max_len: usize,
    device: &Device,
) -> Result<Batch> {
    if texts.is_empty() {
        return Err(crate::Error::Input("no input text was given".into()));
    }
    let ids = texts.iter().map(|t| tokenizer.encode(t, true)).collect::<lazytrain_data::Result<Vec<_>>>()?;
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
    if longest > max_len {
        let (i, _) = ids.iter().enumerate().max_by_key(|(_, row)| row.len()).unwrap_or((0, &ids[0]));
        return Err(crate::Error::Input(format!(
            "text {} ({}) has {longest} tokens but the model accepts at most {max_len}",
            i + 1,
            excerpt(texts[i])
        )));
    }
    let seq = (longest.div_ceil(SEQ_BUCKET) * SEQ_BUCKET).min(max_len);
    let padding_rows = rows.saturating_sub(ids.len()) * seq;
    let pad = tokenizer.special().pad as i64;
    let mut flat = Vec::with_capacity(ids.len() * seq);
    let mut mask = Vec::with_capacity(ids.len() * seq);
    for row in &ids {
        flat.extend(row.iter().map(|&t| t as i64));
        flat.extend(std::iter::repeat_n(pad, seq - row.len()));
        mask.extend(std::iter::repeat_n(1i64, row.len()));
        mask.extend(std::iter::repeat_n(0i64, seq - row.len()));
    }
    flat.extend(std::iter::repeat_n(pad, padding_rows));
    mask.extend(std::iter::repeat_n(0i64, padding_rows));
    let b = ids.len().max(rows);
    Ok(Batch {
        input_ids: Tensor::from_vec(flat, [b, seq], device)?,
        attention_mask: Tensor::from_vec(mask, [b, seq], device)?,
        ids,
        seq,
    })
}
