//! The interface the Trainer trains through: a model with a task head.

use crate::{ForMaskedLM, ForSequenceClassification, ModelConfig, Result};
use lazytrain_core::Tensor;
use lazytrain_nn::{Context, Module};

/// A model with a task head: logits for a batch of token ids. The training
/// loss is the cross-entropy of those logits against the batch's labels
/// (`[batch, seq]` for a masked LM, `[batch]` for a classifier).
pub trait TaskModel: Module {
    /// The configuration (saved as `config.json`).
    fn config(&self) -> &ModelConfig;

    /// Logits `[batch, seq, vocab]` (masked LM) or `[batch, num_labels]`.
    fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor>;
}

impl TaskModel for ForMaskedLM {
    fn config(&self) -> &ModelConfig {
        ForMaskedLM::config(self)
    }

    fn forward(&self, ids: &Tensor, mask: Option<&Tensor>, types: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        ForMaskedLM::forward(self, ids, mask, types, ctx)
    }
}

impl TaskModel for ForSequenceClassification {
    fn config(&self) -> &ModelConfig {
        ForSequenceClassification::config(self)
    }

    fn forward(&self, ids: &Tensor, mask: Option<&Tensor>, types: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        ForSequenceClassification::forward(self, ids, mask, types, ctx)
    }
}
