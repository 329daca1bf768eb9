//! The interface the Trainer trains through: a model with a task head.

use crate::{ForMaskedLM, ForSequenceClassification, Gpt2LMHeadModel, ModelConfig, Result};
use lazytrain_core::Tensor;
use lazytrain_nn::{Context, Module};

/// A model with a task head: logits for a batch of token ids. The training
/// loss is the cross-entropy of those logits against [`TaskModel::targets`]
/// of the batch's labels (`[batch, seq]` for a masked or causal LM,
/// `[batch]` for a classifier).
pub trait TaskModel: Module {
    /// The configuration (saved as `config.json`).
    fn config(&self) -> &ModelConfig;

    /// Logits `[batch, seq, vocab]` (masked or causal LM) or `[batch, num_labels]`.
    fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor>;

    /// The label each logit row is scored against (`-100`: none): the
    /// labels themselves, or for a causal LM the next position's label.
    fn targets(&self, labels: &Tensor) -> Result<Tensor> {
        Ok(labels.clone())
    }

    /// Logits `[capacity, vocab]` at the flat token `positions` only, for
    /// models whose head can run there alone (the masked LM); `None` for
    /// the others.
    fn forward_at(
        &self,
        _input_ids: &Tensor,
        _attention_mask: Option<&Tensor>,
        _token_type_ids: Option<&Tensor>,
        _positions: &Tensor,
        _ctx: &Context,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

impl TaskModel for Gpt2LMHeadModel {
    fn config(&self) -> &ModelConfig {
        Gpt2LMHeadModel::config(self)
    }

    /// Token type ids are refused: GPT-2 has no segment embeddings.
    fn forward(&self, ids: &Tensor, mask: Option<&Tensor>, types: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        if types.is_some() {
            return Err(crate::ModelError::Config {
                path: "model inputs".into(),
                detail: "GPT-2 has no token type embeddings; pass no token_type_ids".into(),
            });
        }
        Gpt2LMHeadModel::forward(self, ids, mask, ctx)
    }

    fn targets(&self, labels: &Tensor) -> Result<Tensor> {
        Gpt2LMHeadModel::shifted_labels(labels)
    }
}

impl TaskModel for ForMaskedLM {
    fn config(&self) -> &ModelConfig {
        ForMaskedLM::config(self)
    }

    fn forward(&self, ids: &Tensor, mask: Option<&Tensor>, types: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        ForMaskedLM::forward(self, ids, mask, types, ctx)
    }

    fn forward_at(
        &self,
        ids: &Tensor,
        mask: Option<&Tensor>,
        types: Option<&Tensor>,
        positions: &Tensor,
        ctx: &Context,
    ) -> Result<Option<Tensor>> {
        ForMaskedLM::forward_at(self, ids, mask, types, positions, ctx).map(Some)
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
