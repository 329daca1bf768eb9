//! Basic layers: Linear, Conv1D, Embedding, LayerNorm, Dropout.

use crate::init::{Initializer, BERT_INIT_STD};
use crate::module::{join, Module};
use crate::{Context, Result};
use lazytrain_core::{DType, Tensor};

/// `y = x Wᵀ + b` with PyTorch's layout: `weight` is `[out, in]`.
#[derive(Clone)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A BERT-initialised layer (normal(0.02) weight, zero bias).
    pub fn new(init: &mut Initializer, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = init.normal(&[out_features, in_features], BERT_INIT_STD)?;
        let bias = if bias { Some(init.constant(&[out_features], 0.0)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Apply to `x` of shape `[.., in_features]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_features = self.weight.dims()[1];
        let rows = x.numel() / in_features.max(1);
        let flat = x.reshape([rows, in_features])?;
        let mut dims = x.dims()[..x.rank().saturating_sub(1)].to_vec();
        dims.push(self.weight.dims()[0]);
        // The bias is added in the output's own shape, so that the add
        // fuses with the elementwise ops that read the output (GELU, a
        // residual add) into one kernel of that shape.
        let y = flat.matmul_transposed(&self.weight, false, true)?.reshape(dims)?;
        match &self.bias {
            Some(b) => Ok(y.add(b)?),
            None => Ok(y),
        }
    }
}

impl Module for Linear {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(join(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            visit(join(prefix, "bias"), b);
        }
    }
}

/// GPT-2's `Conv1D`: `y = x W + b` with `weight` stored as `[in, out]`
/// (the transpose of [`Linear`]'s), the layout Hugging Face checkpoints
/// hold, so weights load and save without a transposed copy.
#[derive(Clone)]
pub struct Conv1D {
    /// `[in_features, out_features]`.
    pub weight: Tensor,
    /// `[out_features]`.
    pub bias: Tensor,
}

impl Conv1D {
    /// A layer with normal(`std`) weights and a zero bias (GPT-2's init).
    pub fn new(init: &mut Initializer, in_features: usize, out_features: usize, std: f32) -> Result<Conv1D> {
        let weight = init.normal(&[in_features, out_features], std)?;
        Ok(Conv1D { weight, bias: init.constant(&[out_features], 0.0)? })
    }

    /// Apply to `x` of shape `[.., in_features]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [in_features, out_features] = [self.weight.dims()[0], self.weight.dims()[1]];
        let rows = x.numel() / in_features.max(1);
        let mut dims = x.dims()[..x.rank().saturating_sub(1)].to_vec();
        dims.push(out_features);
        // The bias is added in the output's shape (see `Linear::forward`).
        Ok(x.reshape([rows, in_features])?.matmul(&self.weight)?.reshape(dims)?.add(&self.bias)?)
    }
}

impl Module for Conv1D {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(join(prefix, "weight"), &self.weight);
        visit(join(prefix, "bias"), &self.bias);
    }
}

/// A lookup table of `[num_embeddings, dim]` rows.
#[derive(Clone)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
}

impl Embedding {
    /// A BERT-initialised table (normal(0.02)).
    pub fn new(init: &mut Initializer, num_embeddings: usize, dim: usize) -> Result<Embedding> {
        Ok(Embedding { weight: init.normal(&[num_embeddings, dim], BERT_INIT_STD)? })
    }

    /// Rows for integer `ids` of any shape: `ids.shape + [dim]`.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.weight.embedding(ids)?)
    }
}

impl Module for Embedding {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(join(prefix, "weight"), &self.weight);
    }
}

/// Layer normalisation over the last axis with learned scale and shift.
#[derive(Clone)]
pub struct LayerNorm {
    /// Scale, initialised to 1.
    pub weight: Tensor,
    /// Shift, initialised to 0.
    pub bias: Tensor,
    /// Added to the variance (BERT: 1e-12).
    pub eps: f64,
}

impl LayerNorm {
    /// A LayerNorm over `dim` features (weight 1, bias 0).
    pub fn new(init: &mut Initializer, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm { weight: init.constant(&[dim], 1.0)?, bias: init.constant(&[dim], 0.0)?, eps })
    }

    /// Normalise `x` of shape `[.., dim]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.layer_norm(Some(&self.weight), Some(&self.bias), self.eps)?)
    }
}

impl Module for LayerNorm {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(join(prefix, "weight"), &self.weight);
        visit(join(prefix, "bias"), &self.bias);
    }
}

/// Inverted dropout: in training, zero each element with probability `p`
/// and scale the rest by `1 / (1 - p)`; the identity in evaluation.
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    /// Drop probability in `[0, 1)`.
    pub p: f64,
}

impl Dropout {
    /// Dropout with probability `p`.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(crate::NnError::Invalid {
                what: "dropout probability",
                detail: format!("{p} is not in [0, 1)"),
            });
        }
        Ok(Dropout { p })
    }

    /// Apply to `x`; masks come from the context's in-graph generator.
    #[track_caller]
    pub fn forward(&self, x: &Tensor, ctx: &Context) -> Result<Tensor> {
        let (Some(key), true) = (ctx.key(), ctx.training() && self.p > 0.0) else {
            return Ok(x.clone());
        };
        let u = Tensor::rand_uniform(x.shape().clone(), DType::F32, key)?;
        let keep = u.ge_scalar(self.p)?;
        let zero = Tensor::zeros([], x.dtype(), x.device())?;
        Ok(Tensor::select(&keep, &x.mul_scalar(1.0 / (1.0 - self.p))?, &zero)?)
    }
}
