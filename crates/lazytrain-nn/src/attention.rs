//! Multi-head self-attention with an additive mask (BERT's `attention.self`).

use crate::init::Initializer;
use crate::layers::{Dropout, Linear};
use crate::module::{join, Module};
use crate::{Context, NnError, Result};
use lazytrain_core::Tensor;

/// Scaled dot-product self-attention over `num_heads` heads. Parameter names
/// follow Hugging Face: `query`, `key`, `value`.
#[derive(Clone)]
pub struct SelfAttention {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    /// Heads.
    pub num_heads: usize,
    /// Dropout on the attention probabilities.
    pub dropout: Dropout,
}

impl SelfAttention {
    /// Attention over `hidden` features split into `num_heads` heads.
    pub fn new(init: &mut Initializer, hidden: usize, num_heads: usize, dropout: f64) -> Result<SelfAttention> {
        if num_heads == 0 || !hidden.is_multiple_of(num_heads) {
            return Err(NnError::Invalid {
                what: "num_attention_heads",
                detail: format!("hidden size {hidden} is not a multiple of {num_heads} heads"),
            });
        }
        Ok(SelfAttention {
            query: Linear::new(init, hidden, hidden, true)?,
            key: Linear::new(init, hidden, hidden, true)?,
            value: Linear::new(init, hidden, hidden, true)?,
            num_heads,
            dropout: Dropout::new(dropout)?,
        })
    }

    /// `[batch, seq, hidden]` → `[batch, heads, seq, head_dim]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        Ok(x.reshape([b, s, self.num_heads, h / self.num_heads])?.permute(&[0, 2, 1, 3])?)
    }

    /// Attend over `x: [batch, seq, hidden]`. `mask` is added to the scores
    /// and must broadcast to `[batch, heads, seq, seq]` (e.g. `[batch, 1, 1, seq]`
    /// with 0 for tokens to keep and a large negative value for padding).
    #[track_caller]
    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(NnError::Invalid {
                what: "attention input",
                detail: format!("expected [batch, seq, hidden], got {}", x.shape()),
            });
        }
        let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let head_dim = h / self.num_heads;
        let q = self.split_heads(&self.query.forward(x)?)?;
        let k = self.split_heads(&self.key.forward(x)?)?;
        let v = self.split_heads(&self.value.forward(x)?)?;
        let mut scores = q.matmul_transposed(&k, false, true)?.mul_scalar(1.0 / (head_dim as f64).sqrt())?;
        if let Some(m) = mask {
            scores = scores.add(m)?;
        }
        let probs = self.dropout.forward(&scores.softmax(-1)?, ctx)?;
        let context = probs.matmul_transposed(&v, false, false)?;
        Ok(context.permute(&[0, 2, 1, 3])?.reshape([b, s, h])?)
    }
}

impl Module for SelfAttention {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.query.visit_parameters(&join(prefix, "query."), visit);
        self.key.visit_parameters(&join(prefix, "key."), visit);
        self.value.visit_parameters(&join(prefix, "value."), visit);
    }
}
