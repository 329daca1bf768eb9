//! The text-classification pipeline.

use super::{encode_batch, in_batches};
use crate::folder::check_tokenizer_fits;
use crate::Result;
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, ForSequenceClassification};
use lazytrain_nn::Context;
use serde::Serialize;
use std::path::Path;

/// One label and its probability, as HF's pipeline reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabelScore {
    /// The label name (`id2label`).
    pub label: String,
    /// Softmax probability (a sigmoid for a single-output or multi-label
    /// model, the raw score for a regression model).
    pub score: f32,
}

/// Classify texts with a sequence-classification model folder.
pub struct TextClassification {
    model: ForSequenceClassification,
    tokenizer: TextTokenizer,
    device: Device,
    batch_size: Option<usize>,
}

impl TextClassification {
    /// Load a model folder (config with `id2label`, weights, tokenizer). A
    /// config without `id2label` gets HF's default of two labels.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<TextClassification> {
        let tokenizer = TextTokenizer::from_path(dir)?;
        let config = hub::load_config(dir)?;
        let num_labels = config.id2label.as_ref().map_or(2, |m| m.len());
        let (model, warnings) = hub::load_sequence_classifier(dir, num_labels, 0, device)?;
        if let Some(w) = warnings.iter().find(|w| w.contains("newly initialised")) {
            return Err(crate::Error::Input(format!(
                "{} is not a fine-tuned classifier ({w}); fine-tune it with `lazytrain train --task sequence-classification` first",
                dir.display()
            )));
        }
        TextClassification::new(model, tokenizer, device)
    }

    /// Use an in-memory model and tokenizer.
    pub fn new(
        model: ForSequenceClassification,
        tokenizer: TextTokenizer,
        device: &Device,
    ) -> Result<TextClassification> {
        check_tokenizer_fits(model.config(), &tokenizer)?;
        Ok(TextClassification { model, tokenizer, device: device.clone(), batch_size: None })
    }

    /// Run texts in batches of `size` rows (HF's `batch_size`) instead of
    /// all at once: every batch has the same shape per length bucket.
    pub fn with_batch_size(mut self, size: usize) -> TextClassification {
        self.batch_size = Some(size.max(1));
        self
    }

    /// For each text, the `top_k` most likely labels (all labels when
    /// `top_k` is at least their number), most likely first.
    pub fn predict(&self, texts: &[&str], top_k: usize) -> Result<Vec<Vec<LabelScore>>> {
        in_batches(texts, self.batch_size, |chunk, rows| self.predict_batch(chunk, top_k, rows))
    }

    /// [`TextClassification::predict`] on one batch of `rows` rows.
    fn predict_batch(&self, texts: &[&str], top_k: usize, rows: usize) -> Result<Vec<Vec<LabelScore>>> {
        let max = self.model.config().max_sequence_length();
        let batch = encode_batch(&self.tokenizer, texts, rows, max, &self.device)?;
        let logits = self.model.forward(&batch.input_ids, Some(&batch.attention_mask), None, &Context::eval())?;
        let classes = self.model.num_labels();
        // As HF's pipeline: raw scores for regression, a sigmoid per label
        // for multi-label models and single outputs, else a softmax.
        let probabilities = match self.model.config().problem_type.as_deref() {
            Some("regression") => logits,
            Some("multi_label_classification") => logits.sigmoid()?,
            _ if classes == 1 => logits.sigmoid()?,
            _ => logits.softmax(-1)?,
        };
        let values = probabilities.to_vec::<f32>()?;
        let names = self.model.label_names();
        Ok(values
            .chunks(classes)
            .take(texts.len())
            .map(|row| {
                let mut scores: Vec<LabelScore> =
                    row.iter().zip(&names).map(|(&score, label)| LabelScore { label: label.clone(), score }).collect();
                scores.sort_by(|a, b| b.score.total_cmp(&a.score));
                scores.truncate(top_k.max(1));
                scores
            })
            .collect())
    }
}
