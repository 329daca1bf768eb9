//! The feature-extraction pipeline: the last hidden state of every token.

use super::{encode_batch, in_batches};
use crate::folder::check_tokenizer_fits;
use crate::Result;
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::{hub, EncoderModel};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::Context;
use std::path::Path;

/// Token features from an encoder.
pub struct FeatureExtraction {
    model: EncoderModel,
    tokenizer: TextTokenizer,
    device: Device,
    batch_size: Option<usize>,
}

impl FeatureExtraction {
    /// Load the encoder of a model folder (any head in the checkpoint is unused).
    pub fn from_dir(dir: &Path, device: &Device) -> Result<FeatureExtraction> {
        let tokenizer = TextTokenizer::from_path(dir)?;
        let config = hub::load_config(dir)?;
        check_tokenizer_fits(&config, &tokenizer)?;
        let model = EncoderModel::new(&mut Initializer::new(0, device), &config, false)?;
        hub::load_weights(&model, config.model_type, &dir.join("model.safetensors"), device, &|_| false)?;
        Ok(FeatureExtraction { model, tokenizer, device: device.clone(), batch_size: None })
    }

    /// Run texts in batches of `size` rows (HF's `batch_size`) instead of
    /// all at once: every batch has the same shape per length bucket.
    pub fn with_batch_size(mut self, size: usize) -> FeatureExtraction {
        self.batch_size = Some(size.max(1));
        self
    }

    /// For each text, `[tokens][hidden]` features (special tokens included),
    /// as HF's pipeline returns them inside a batch-of-one list.
    pub fn extract(&self, texts: &[&str]) -> Result<Vec<Vec<Vec<f32>>>> {
        in_batches(texts, self.batch_size, |chunk, rows| self.extract_batch(chunk, rows))
    }

    /// [`FeatureExtraction::extract`] on one batch of `rows` rows.
    fn extract_batch(&self, texts: &[&str], rows: usize) -> Result<Vec<Vec<Vec<f32>>>> {
        let max_len = self.model.config.max_sequence_length();
        let batch = encode_batch(&self.tokenizer, texts, rows, max_len, &self.device)?;
        let hidden = self.model.forward(&batch.input_ids, Some(&batch.attention_mask), None, &Context::eval())?;
        self.device.sync()?;
        let h = hidden.dims()[2];
        let values = hidden.to_vec::<f32>()?;
        Ok(batch
            .ids
            .iter()
            .enumerate()
            .map(|(b, ids)| {
                (0..ids.len()).map(|t| values[(b * batch.seq + t) * h..(b * batch.seq + t + 1) * h].to_vec()).collect()
            })
            .collect())
    }
}
