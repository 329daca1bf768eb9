//! GPT-2 (`GPT2Model` / `GPT2LMHeadModel`): a pre-LayerNorm causal decoder
//! with Hugging Face's names and Conv1D `[in, out]` weight layout.

use crate::encoder::expansion_activation;
use crate::kv_cache::{KvCache, LayerCache};
use crate::{ModelConfig, ModelError, ModelType, Result};
use lazytrain_core::{DType, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, Conv1D, Dropout, Embedding, LayerNorm, Module};

/// The GPT-2 settings of `config`, or an error when it is not GPT-2's.
fn gpt2_options(config: &ModelConfig) -> Result<crate::Gpt2Options> {
    match (config.model_type, &config.gpt2) {
        (ModelType::Gpt2, Some(options)) => Ok(options.clone()),
        (other, _) => Err(ModelError::Config {
            path: "model".into(),
            detail: format!(
                "a GPT-2 model needs a gpt2 config, got model_type `{}`; BERT and RoBERTa are masked LMs",
                other.name()
            ),
        }),
    }
}

/// Causal self-attention: `c_attn` projects to queries, keys and values at
/// once, `c_proj` back to the hidden size.
pub struct Gpt2Attention {
    /// `[hidden, 3 × hidden]` query/key/value projection.
    pub c_attn: Conv1D,
    /// `[hidden, hidden]` output projection.
    pub c_proj: Conv1D,
    num_heads: usize,
    scale: f64,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
}

impl Gpt2Attention {
    /// `[batch, seq, hidden]` → `[batch, heads, seq, head_dim]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let [b, s, h] = crate::error::dims_of(x, "the attention input", "[batch, seq, hidden]")?;
        Ok(x.reshape([b, s, self.num_heads, h / self.num_heads])?.permute(&[0, 2, 1, 3])?)
    }

    /// Attend from `x: [batch, seq, hidden]` to its own keys (or, with a
    /// cache, to every cached key), adding `bias` (`[batch, 1, seq, keys]`,
    /// 0 where a query may look and a large negative value elsewhere).
    fn forward(&self, x: &Tensor, bias: &Tensor, cache: Option<&LayerCache>, ctx: &Context) -> Result<Tensor> {
        let [b, s, h] = crate::error::dims_of(x, "the attention input", "[batch, seq, hidden]")?;
        let qkv = self.c_attn.forward(x)?;
        let q = self.split_heads(&qkv.narrow(2, 0, h)?)?;
        let mut k = self.split_heads(&qkv.narrow(2, h, h)?)?;
        let mut v = self.split_heads(&qkv.narrow(2, 2 * h, h)?)?;
        if let Some(cache) = cache {
            (k, v) = cache.write(&k, &v)?;
        }
        let scores = q.matmul_transposed(&k, false, true)?.mul_scalar(self.scale)?.add(bias)?;
        let probs = self.attn_dropout.forward(&scores.softmax(-1)?, ctx)?;
        let context = probs.matmul(&v)?.permute(&[0, 2, 1, 3])?.reshape([b, s, h])?;
        Ok(self.resid_dropout.forward(&self.c_proj.forward(&context)?, ctx)?)
    }
}

/// The feed-forward block: `c_fc` → activation → `c_proj` → dropout.
pub struct Gpt2Mlp {
    /// `[hidden, inner]`.
    pub c_fc: Conv1D,
    /// `[inner, hidden]`.
    pub c_proj: Conv1D,
    activation: String,
    dropout: Dropout,
}

/// One decoder block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
pub struct Gpt2Block {
    /// Normalisation before attention.
    pub ln_1: LayerNorm,
    /// `attn`.
    pub attn: Gpt2Attention,
    /// Normalisation before the feed-forward block.
    pub ln_2: LayerNorm,
    /// `mlp`.
    pub mlp: Gpt2Mlp,
}

impl Gpt2Block {
    fn new(init: &mut Initializer, config: &ModelConfig, options: &crate::Gpt2Options, index: usize) -> Result<Self> {
        let (h, std) = (config.hidden_size, config.initializer_range as f32);
        // HF rescales every `c_proj.weight` by 1/√(2·n_layer) (GPT-2 paper, §2.3).
        let proj_std = std / (2.0 * config.num_hidden_layers as f32).sqrt();
        let head_dim = (h / config.num_attention_heads) as f64;
        let mut scale = if options.scale_attn_weights { 1.0 / head_dim.sqrt() } else { 1.0 };
        if options.scale_attn_by_inverse_layer_idx {
            scale /= (index + 1) as f64;
        }
        let ln_1 = LayerNorm::new(init, h, config.layer_norm_eps)?;
        let attn = Gpt2Attention {
            c_attn: Conv1D::new(init, h, 3 * h, std)?,
            c_proj: Conv1D::new(init, h, h, proj_std)?,
            num_heads: config.num_attention_heads,
            scale,
            attn_dropout: Dropout::new(config.attention_probs_dropout_prob)?,
            resid_dropout: Dropout::new(config.hidden_dropout_prob)?,
        };
        let ln_2 = LayerNorm::new(init, h, config.layer_norm_eps)?;
        let mlp = Gpt2Mlp {
            c_fc: Conv1D::new(init, h, config.intermediate_size, std)?,
            c_proj: Conv1D::new(init, config.intermediate_size, h, proj_std)?,
            activation: config.hidden_act.clone(),
            dropout: Dropout::new(config.hidden_dropout_prob)?,
        };
        Ok(Gpt2Block { ln_1, attn, ln_2, mlp })
    }

    fn forward(&self, x: &Tensor, bias: &Tensor, cache: Option<&LayerCache>, ctx: &Context) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?, bias, cache, ctx)?)?;
        let inner = expansion_activation(&self.mlp.c_fc.forward(&self.ln_2.forward(&x)?)?, &self.mlp.activation)?;
        let out = self.mlp.dropout.forward(&self.mlp.c_proj.forward(&inner)?, ctx)?;
        Ok(x.add(&out)?)
    }
}

impl Module for Gpt2Block {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.ln_1.visit_parameters(&format!("{prefix}ln_1."), visit);
        self.attn.c_attn.visit_parameters(&format!("{prefix}attn.c_attn."), visit);
        self.attn.c_proj.visit_parameters(&format!("{prefix}attn.c_proj."), visit);
        self.ln_2.visit_parameters(&format!("{prefix}ln_2."), visit);
        self.mlp.c_fc.visit_parameters(&format!("{prefix}mlp.c_fc."), visit);
        self.mlp.c_proj.visit_parameters(&format!("{prefix}mlp.c_proj."), visit);
    }
}

/// The bare decoder (`GPT2Model`): token + position embeddings, the blocks
/// and the final LayerNorm.
pub struct Gpt2Model {
    /// The configuration it was built from.
    pub config: ModelConfig,
    /// Token embeddings `[vocab, hidden]` (tied to the LM head).
    pub wte: Embedding,
    /// Learned positions `[n_positions, hidden]`.
    pub wpe: Embedding,
    /// `h.N`.
    pub h: Vec<Gpt2Block>,
    /// Final normalisation.
    pub ln_f: LayerNorm,
    drop: Dropout,
}

impl Gpt2Model {
    /// A freshly initialised decoder (HF's `_init_weights`).
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<Gpt2Model> {
        let options = gpt2_options(config)?;
        let (h, std) = (config.hidden_size, config.initializer_range as f32);
        let wte = Embedding { weight: init.normal(&[config.vocab_size, h], std)? };
        let wpe = Embedding { weight: init.normal(&[config.max_position_embeddings, h], std)? };
        let blocks =
            (0..config.num_hidden_layers).map(|i| Gpt2Block::new(init, config, &options, i)).collect::<Result<_>>()?;
        Ok(Gpt2Model {
            config: config.clone(),
            wte,
            wpe,
            h: blocks,
            ln_f: LayerNorm::new(init, h, config.layer_norm_eps)?,
            drop: Dropout::new(options.embd_pdrop)?,
        })
    }

    /// Check `[batch, seq]` integer ids (and a mask of the same shape)
    /// against the model's positions.
    fn check_inputs(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<()> {
        let integer = |t: &Tensor| matches!(t.dtype(), DType::I64 | DType::I32);
        if input_ids.rank() != 2 || !integer(input_ids) || attention_mask.is_some_and(|m| !integer(m)) {
            return Err(ModelError::Config {
                path: "model inputs".into(),
                detail: format!(
                    "input_ids must be integer [batch, seq] (got {}{}), with an integer attention_mask",
                    input_ids.dtype(),
                    input_ids.shape()
                ),
            });
        }
        let end = input_ids.dims()[1];
        if end > self.config.max_position_embeddings {
            return Err(ModelError::Config {
                path: "model inputs".into(),
                detail: format!(
                    "{end} positions exceed the model's n_positions {}; shorten the text or the generation",
                    self.config.max_position_embeddings
                ),
            });
        }
        Ok(())
    }

    /// The last hidden state `[batch, seq, hidden]` of `[batch, seq]` ids at
    /// positions `0..seq`; `attention_mask` is 1 for tokens and 0 for padding.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        self.check_inputs(input_ids, attention_mask)?;
        let [b, s] = crate::error::dims_of(input_ids, "input_ids", "[batch, seq]")?;
        let dev = input_ids.device();
        let positions = Tensor::iota([b, s], 1, DType::I64, dev)?;
        let rows = Tensor::iota([s, s], 0, DType::I32, dev)?;
        let cols = Tensor::iota([s, s], 1, DType::I32, dev)?;
        let bias = attention_bias(&cols.le(&rows)?.reshape([1, 1, s, s])?, attention_mask)?;
        self.run_blocks(input_ids, &positions, &bias, None, ctx)
    }

    /// The hidden state of `[batch, seq]` ids written into `cache` at each
    /// row's length (positions continue from there): a prefill of an empty
    /// cache, or one token per row. The queries see every earlier cached key
    /// and each other causally; the rows' lengths grow by `seq`.
    pub fn forward_cached(&self, input_ids: &Tensor, cache: &mut KvCache, ctx: &Context) -> Result<Tensor> {
        let [_, s] = crate::error::dims_of(input_ids, "input_ids", "[batch, seq]")?;
        self.check_inputs(input_ids, None)?;
        if cache.layers().len() != self.h.len() || cache.lengths().len() != input_ids.dims()[0] {
            return Err(ModelError::Config {
                path: "kv cache".into(),
                detail: format!(
                    "the cache holds {} layers × {} rows, the model has {} layers and the batch {} rows",
                    cache.layers().len(),
                    cache.lengths().len(),
                    self.h.len(),
                    input_ids.dims()[0]
                ),
            });
        }
        cache.step(s, |cache, positions, bias| self.run_blocks(input_ids, positions, bias, Some(cache), ctx))
    }

    fn run_blocks(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        bias: &Tensor,
        cache: Option<&KvCache>,
        ctx: &Context,
    ) -> Result<Tensor> {
        let x = self.wte.forward(input_ids)?.add(&self.wpe.forward(positions)?)?;
        let mut x = self.drop.forward(&x, ctx)?;
        for (i, block) in self.h.iter().enumerate() {
            x = block.forward(&x, bias, cache.map(|c| &c.layers()[i]), ctx)?;
        }
        Ok(self.ln_f.forward(&x)?)
    }
}

/// The additive attention bias: 0 where `allowed` (a boolean
/// `[.., queries, keys]` pattern) holds and the key is not padding, the
/// most negative f32 elsewhere (clamped, so a row that sees nothing stays
/// finite and uniform instead of NaN).
pub(crate) fn attention_bias(allowed: &Tensor, key_mask: Option<&Tensor>) -> Result<Tensor> {
    let dev = allowed.device();
    let zero = Tensor::zeros([], DType::F32, dev)?;
    let blocked = Tensor::full([], f32::MIN as f64, DType::F32, dev)?;
    let mut bias = Tensor::select(allowed, &zero, &blocked)?;
    if let Some(mask) = key_mask {
        let [b, k] = crate::error::dims_of(mask, "attention_mask", "[batch, seq]")?;
        let padding = Tensor::select(&mask.ne_scalar(0.0)?, &zero, &blocked)?.reshape([b, 1, 1, k])?;
        bias = bias.add(&padding)?.maximum_scalar(f32::MIN as f64)?;
    }
    Ok(bias)
}

impl Module for Gpt2Model {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.wte.visit_parameters(&format!("{prefix}wte."), visit);
        self.wpe.visit_parameters(&format!("{prefix}wpe."), visit);
        for (i, block) in self.h.iter().enumerate() {
            block.visit_parameters(&format!("{prefix}h.{i}."), visit);
        }
        self.ln_f.visit_parameters(&format!("{prefix}ln_f."), visit);
    }
}

/// `GPT2LMHeadModel`: the decoder with `lm_head` tied to `wte` (no bias,
/// no separate parameter). Parameters are named `transformer.*`.
pub struct Gpt2LMHeadModel {
    /// The decoder.
    pub transformer: Gpt2Model,
}

impl Gpt2LMHeadModel {
    /// A freshly initialised model.
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<Gpt2LMHeadModel> {
        Ok(Gpt2LMHeadModel { transformer: Gpt2Model::new(init, config)? })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.transformer.config
    }

    /// Vocabulary logits `[batch, seq, vocab]` of a hidden state.
    pub fn head(&self, hidden: &Tensor) -> Result<Tensor> {
        let [b, s, d] = crate::error::dims_of(hidden, "the hidden state", "[batch, seq, hidden]")?;
        let wte = &self.transformer.wte.weight;
        let logits = hidden.reshape([b * s, d])?.matmul_transposed(wte, false, true)?;
        Ok(logits.reshape([b, s, wte.dims()[0]])?)
    }

    /// Logits `[batch, seq, vocab]` for `[batch, seq]` ids.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        self.head(&self.transformer.forward(input_ids, attention_mask, ctx)?)
    }

    /// The labels each position is scored against: position `t` predicts
    /// label `t + 1` (HF shifts inside the model); the last position and
    /// `-100` labels predict nothing.
    pub fn shifted_labels(labels: &Tensor) -> Result<Tensor> {
        let [b, s] = crate::error::dims_of(labels, "labels", "[batch, seq]")?;
        let ignored = Tensor::full([b, 1], -100.0, labels.dtype(), labels.device())?;
        if s < 2 {
            return Ok(ignored);
        }
        Ok(Tensor::cat(&[&labels.narrow(1, 1, s - 1)?, &ignored], 1)?)
    }

    /// Mean next-token cross-entropy: `labels` are the input ids (padding
    /// and other ignored positions `-100`), shifted as Hugging Face does.
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        Ok(logits.cross_entropy(&Self::shifted_labels(labels)?, -100)?)
    }
}

impl Module for Gpt2LMHeadModel {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.transformer.visit_parameters(&format!("{prefix}transformer."), visit);
    }
}
