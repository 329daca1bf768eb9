//! Word + position + token-type embeddings, LayerNorm and dropout.

use crate::{ModelConfig, ModelType, Result};
use lazytrain_core::{DType, Shape, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, Dropout, Embedding, LayerNorm, Module};

/// BERT/RoBERTa input embeddings.
pub struct Embeddings {
    /// Token embeddings (tied to the MLM decoder).
    pub word_embeddings: Embedding,
    /// Learned absolute positions.
    pub position_embeddings: Embedding,
    /// Segment embeddings.
    pub token_type_embeddings: Embedding,
    /// Normalisation after the sum.
    pub layer_norm: LayerNorm,
    dropout: Dropout,
    model_type: ModelType,
    pad_token_id: i64,
}

impl Embeddings {
    /// Fresh embeddings for `config`.
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<Embeddings> {
        let h = config.hidden_size;
        let std = config.initializer_range as f32;
        let zero_pad_row = |e: Embedding| -> Result<Embedding> {
            // HF zeroes the padding row of the word embeddings at init.
            let pad = config.pad_token_id as usize;
            let mut values = e.weight.to_vec::<f32>()?;
            values[pad * h..(pad + 1) * h].fill(0.0);
            e.weight.assign(&Tensor::from_vec(values, e.weight.shape().clone(), e.weight.device())?)?;
            Ok(e)
        };
        Ok(Embeddings {
            word_embeddings: zero_pad_row(Embedding { weight: init.normal(&[config.vocab_size, h], std)? })?,
            position_embeddings: Embedding { weight: init.normal(&[config.max_position_embeddings, h], std)? },
            token_type_embeddings: Embedding { weight: init.normal(&[config.type_vocab_size, h], std)? },
            layer_norm: LayerNorm::new(init, h, config.layer_norm_eps)?,
            dropout: Dropout::new(config.hidden_dropout_prob)?,
            model_type: config.model_type,
            pad_token_id: config.pad_token_id,
        })
    }

    /// Position ids for `[batch, seq]` inputs: `0..seq` for BERT; for RoBERTa,
    /// HF's `create_position_ids_from_input_ids` (padding keeps `pad`,
    /// other tokens count from `pad + 1`), computed in the graph.
    fn position_ids(&self, input_ids: &Tensor) -> Result<Tensor> {
        let [b, s] = crate::error::dims_of(input_ids, "input_ids", "[batch, seq]")?;
        let dev = input_ids.device();
        match self.model_type {
            ModelType::Bert | ModelType::Gpt2 => Ok(Tensor::iota([b, s], 1, DType::I64, dev)?),
            ModelType::Roberta => {
                let mask = input_ids.ne_scalar(self.pad_token_id as f64)?.cast(DType::F32)?;
                let rows = Tensor::iota([s, s], 0, DType::I32, dev)?;
                let cols = Tensor::iota([s, s], 1, DType::I32, dev)?;
                let upper = rows.le(&cols)?.cast(DType::F32)?;
                let cumsum = mask.matmul(&upper)?;
                Ok(cumsum.mul(&mask)?.cast(DType::I64)?.add_scalar(self.pad_token_id as f64)?)
            }
        }
    }

    /// Embed `[batch, seq]` ids (token types default to 0).
    pub fn forward(&self, input_ids: &Tensor, token_type_ids: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        let words = self.word_embeddings.forward(input_ids)?;
        let positions = self.position_embeddings.forward(&self.position_ids(input_ids)?)?;
        let types = match token_type_ids {
            Some(t) => self.token_type_embeddings.forward(t)?,
            None => {
                let zeros = Tensor::zeros(Shape::new(input_ids.dims()), DType::I64, input_ids.device())?;
                self.token_type_embeddings.forward(&zeros)?
            }
        };
        let sum = words.add(&positions)?.add(&types)?;
        Ok(self.dropout.forward(&self.layer_norm.forward(&sum)?, ctx)?)
    }
}

impl Module for Embeddings {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.word_embeddings.visit_parameters(&format!("{prefix}word_embeddings."), visit);
        self.position_embeddings.visit_parameters(&format!("{prefix}position_embeddings."), visit);
        self.token_type_embeddings.visit_parameters(&format!("{prefix}token_type_embeddings."), visit);
        self.layer_norm.visit_parameters(&format!("{prefix}LayerNorm."), visit);
    }
}
