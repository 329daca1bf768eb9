//! `BertForSequenceClassification` / `RobertaForSequenceClassification`.

use crate::encoder::rescale_init;
use crate::{EncoderModel, ModelConfig, ModelError, ModelType, Result};
use lazytrain_core::Tensor;
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, Dropout, Linear, Module};

/// The encoder with a classification head. BERT: pooler (first token →
/// dense → tanh) → dropout → `classifier`. RoBERTa: first token → dropout →
/// `classifier.dense` → tanh → dropout → `classifier.out_proj`.
pub struct ForSequenceClassification {
    /// The encoder (BERT with its pooler).
    pub model: EncoderModel,
    /// RoBERTa's `classifier.dense` (absent for BERT).
    pub dense: Option<Linear>,
    /// BERT's `classifier` / RoBERTa's `classifier.out_proj`.
    pub classifier: Linear,
    dropout: Dropout,
}

impl ForSequenceClassification {
    /// A freshly initialised model with `num_labels` outputs.
    pub fn new(init: &mut Initializer, config: &ModelConfig, num_labels: usize) -> Result<ForSequenceClassification> {
        if num_labels == 0 {
            return Err(ModelError::Config { path: "num_labels".into(), detail: "needs at least one label".into() });
        }
        let roberta = config.model_type == ModelType::Roberta;
        let model = EncoderModel::new(init, config, !roberta)?;
        let dense = if roberta {
            let mut d = Linear::new(init, config.hidden_size, config.hidden_size, true)?;
            rescale_init(&mut d, config)?;
            Some(d)
        } else {
            None
        };
        let mut classifier = Linear::new(init, config.hidden_size, num_labels, true)?;
        rescale_init(&mut classifier, config)?;
        Ok(ForSequenceClassification { model, dense, classifier, dropout: Dropout::new(config.hidden_dropout_prob)? })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// Outputs of the classifier.
    pub fn num_labels(&self) -> usize {
        self.classifier.weight.dims()[0]
    }

    /// Label names by id: the config's `id2label`, else `LABEL_{i}` as
    /// Hugging Face names labels it was not told about.
    pub fn label_names(&self) -> Vec<String> {
        (0..self.num_labels())
            .map(|i| {
                self.config()
                    .id2label
                    .as_ref()
                    .and_then(|m| m.get(&i.to_string()).cloned())
                    .unwrap_or(format!("LABEL_{i}"))
            })
            .collect()
    }

    /// Logits `[batch, num_labels]`.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor> {
        let hidden = self.model.forward(input_ids, attention_mask, token_type_ids, ctx)?;
        let (b, h) = (hidden.dims()[0], hidden.dims()[2]);
        let features = match (&self.dense, self.model.pool(&hidden)?) {
            (Some(dense), _) => {
                let first = self.dropout.forward(&hidden.narrow(1, 0, 1)?.reshape([b, h])?, ctx)?;
                dense.forward(&first)?.tanh()?
            }
            (None, Some(pooled)) => pooled,
            (None, None) => hidden.narrow(1, 0, 1)?.reshape([b, h])?,
        };
        Ok(self.classifier.forward(&self.dropout.forward(&features, ctx)?)?)
    }

    /// Mean cross-entropy against integer labels `[batch]`.
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        Ok(logits.cross_entropy(labels, -100)?)
    }
}

impl Module for ForSequenceClassification {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        let base = self.config().model_type.name();
        self.model.visit_parameters(&format!("{prefix}{base}."), visit);
        match &self.dense {
            None => self.classifier.visit_parameters(&format!("{prefix}classifier."), visit),
            Some(dense) => {
                dense.visit_parameters(&format!("{prefix}classifier.dense."), visit);
                self.classifier.visit_parameters(&format!("{prefix}classifier.out_proj."), visit);
            }
        }
    }
}
