//! The bare encoder (`BertModel` / `RobertaModel`).

use crate::embeddings::Embeddings;
use crate::encoder::{rescale_init, Encoder};
use crate::{ModelConfig, ModelType, Result};
use lazytrain_core::{DType, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, Linear, Module};

/// Embeddings, encoder and an optional pooler (first token → dense → tanh).
pub struct EncoderModel {
    /// The configuration it was built from.
    pub config: ModelConfig,
    /// `embeddings`.
    pub embeddings: Embeddings,
    /// `encoder`.
    pub encoder: Encoder,
    /// `pooler.dense`, when the model has a pooler.
    pub pooler: Option<Linear>,
}

impl EncoderModel {
    /// A freshly initialised model (HF's `_init_weights`).
    pub fn new(init: &mut Initializer, config: &ModelConfig, with_pooler: bool) -> Result<EncoderModel> {
        if config.model_type == ModelType::Gpt2 {
            return Err(crate::ModelError::Config {
                path: "model".into(),
                detail: "GPT-2 is a causal decoder, not an encoder: load it as a GPT2LMHeadModel (`--task causal-lm`, \
                         `text-generation`), not for masked-LM or classification"
                    .into(),
            });
        }
        let pooler = if with_pooler {
            let mut dense = Linear::new(init, config.hidden_size, config.hidden_size, true)?;
            rescale_init(&mut dense, config)?;
            Some(dense)
        } else {
            None
        };
        Ok(EncoderModel {
            config: config.clone(),
            embeddings: Embeddings::new(init, config)?,
            encoder: Encoder::new(init, config)?,
            pooler,
        })
    }

    /// HF's extended attention mask: `(1 - mask) * f32::MIN` as `[batch, 1, 1, seq]`.
    fn additive_mask(attention_mask: &Tensor) -> Result<Tensor> {
        let (b, s) = (attention_mask.dims()[0], attention_mask.dims()[1]);
        let keep = attention_mask.cast(DType::F32)?;
        Ok(keep.neg()?.add_scalar(1.0)?.mul_scalar(f32::MIN as f64)?.reshape([b, 1, 1, s])?)
    }

    /// The last hidden state `[batch, seq, hidden]` for `[batch, seq]` ids;
    /// `attention_mask` is 1 for tokens and 0 for padding.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor> {
        let (x, mask) = self.embed(input_ids, attention_mask, token_type_ids, ctx)?;
        self.encoder.forward(&x, mask.as_ref(), ctx)
    }

    /// The last hidden state `[rows, hidden]` at the flat `positions`
    /// (`[rows]` i64 indices `row * seq + column`) only, the rows of
    /// [`EncoderModel::forward`]'s output: the last layer computes past its
    /// attention only there ([`Encoder::forward_rows`]).
    pub fn forward_rows(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        positions: &Tensor,
        ctx: &Context,
    ) -> Result<Tensor> {
        let (x, mask) = self.embed(input_ids, attention_mask, token_type_ids, ctx)?;
        self.encoder.forward_rows(&x, mask.as_ref(), positions, ctx)
    }

    /// The checked inputs' embeddings and additive attention mask.
    fn embed(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let integer = |t: &Tensor| matches!(t.dtype(), DType::I64 | DType::I32);
        let fits = |t: &Tensor| t.dims() == input_ids.dims() && integer(t);
        if input_ids.rank() != 2
            || !integer(input_ids)
            || !attention_mask.is_none_or(fits)
            || !token_type_ids.is_none_or(fits)
        {
            return Err(crate::ModelError::Config {
                path: "model inputs".into(),
                detail: format!(
                    "input_ids must be integer [batch, seq] (got {}{}), with attention_mask and token_type_ids of the same shape",
                    input_ids.dtype(),
                    input_ids.shape()
                ),
            });
        }
        if input_ids.dims()[1] > self.config.max_sequence_length() {
            return Err(crate::ModelError::Config {
                path: "model inputs".into(),
                detail: format!(
                    "sequences of {} tokens exceed the model's {} positions",
                    input_ids.dims()[1],
                    self.config.max_sequence_length()
                ),
            });
        }
        let x = self.embeddings.forward(input_ids, token_type_ids, ctx)?;
        let mask = attention_mask.map(Self::additive_mask).transpose()?;
        Ok((x, mask))
    }

    /// The pooled first-token representation `[batch, hidden]`.
    pub fn pool(&self, hidden: &Tensor) -> Result<Option<Tensor>> {
        let [b, _, h] = crate::error::dims_of(hidden, "the hidden state", "[batch, seq, hidden]")?;
        let Some(dense) = &self.pooler else { return Ok(None) };
        let first = hidden.narrow(1, 0, 1)?.reshape([b, h])?;
        Ok(Some(dense.forward(&first)?.tanh()?))
    }
}

impl Module for EncoderModel {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.embeddings.visit_parameters(&format!("{prefix}embeddings."), visit);
        self.encoder.visit_parameters(&format!("{prefix}encoder."), visit);
        if let Some(p) = &self.pooler {
            p.visit_parameters(&format!("{prefix}pooler.dense."), visit);
        }
    }
}
