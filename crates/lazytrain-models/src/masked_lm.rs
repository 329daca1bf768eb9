//! `BertForMaskedLM` / `RobertaForMaskedLM`.

use crate::encoder::{activation, rescale_init};
use crate::{EncoderModel, ModelConfig, ModelType, Result};
use lazytrain_core::Tensor;
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, LayerNorm, Linear, Module};

/// The encoder with a masked-LM head: dense → activation → LayerNorm →
/// decoder tied to the word embeddings, plus an output bias.
///
/// Names: BERT `bert.*` and `cls.predictions.{transform.dense,
/// transform.LayerNorm, bias}`; RoBERTa `roberta.*` and `lm_head.{dense,
/// layer_norm, bias}`. The tied decoder weight is not a separate parameter.
pub struct ForMaskedLM {
    /// The encoder (no pooler).
    pub model: EncoderModel,
    /// Head transform.
    pub transform: Linear,
    /// Head normalisation.
    pub layer_norm: LayerNorm,
    /// Per-token output bias `[vocab]`.
    pub bias: Tensor,
}

impl ForMaskedLM {
    /// A freshly initialised model.
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<ForMaskedLM> {
        let model = EncoderModel::new(init, config, false)?;
        let mut transform = Linear::new(init, config.hidden_size, config.hidden_size, true)?;
        rescale_init(&mut transform, config)?;
        Ok(ForMaskedLM {
            model,
            transform,
            layer_norm: LayerNorm::new(init, config.hidden_size, config.layer_norm_eps)?,
            bias: init.constant(&[config.vocab_size], 0.0)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// Vocabulary logits `[batch, seq, vocab]` from the last hidden state.
    pub fn head(&self, hidden: &Tensor) -> Result<Tensor> {
        let [b, s, d] = crate::error::dims_of(hidden, "the hidden state", "[batch, seq, hidden]")?;
        // BERT's head follows `hidden_act`; RoBERTa's is always exact GELU (as in HF).
        let act = match self.config().model_type {
            ModelType::Bert | ModelType::Gpt2 => self.config().hidden_act.as_str(),
            ModelType::Roberta => "gelu",
        };
        let h = activation(&self.transform.forward(hidden)?, act)?;
        let h = self.layer_norm.forward(&h)?;
        let word = &self.model.embeddings.word_embeddings.weight;
        let logits = h.reshape([b * s, d])?.matmul_transposed(word, false, true)?.add(&self.bias)?;
        Ok(logits.reshape([b, s, word.dims()[0]])?)
    }

    /// Logits `[batch, seq, vocab]` for `[batch, seq]` ids.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor> {
        self.head(&self.model.forward(input_ids, attention_mask, token_type_ids, ctx)?)
    }

    /// Mean cross-entropy over the labelled positions (`-100` elsewhere).
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        Ok(logits.cross_entropy(labels, -100)?)
    }
}

impl Module for ForMaskedLM {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        let base = self.config().model_type.name();
        self.model.visit_parameters(&format!("{prefix}{base}."), visit);
        match self.config().model_type {
            // (An encoder is never built from a GPT-2 config: `EncoderModel::new` refuses it.)
            ModelType::Bert | ModelType::Gpt2 => {
                self.transform.visit_parameters(&format!("{prefix}cls.predictions.transform.dense."), visit);
                self.layer_norm.visit_parameters(&format!("{prefix}cls.predictions.transform.LayerNorm."), visit);
                visit(format!("{prefix}cls.predictions.bias"), &self.bias);
            }
            ModelType::Roberta => {
                self.transform.visit_parameters(&format!("{prefix}lm_head.dense."), visit);
                self.layer_norm.visit_parameters(&format!("{prefix}lm_head.layer_norm."), visit);
                visit(format!("{prefix}lm_head.bias"), &self.bias);
            }
        }
    }
}
