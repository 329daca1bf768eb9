//! GPT-2's `config.json` (`GPT2Config`'s field names and defaults) to and
//! from the common [`ModelConfig`].

use crate::{ModelConfig, ModelType};
use serde::{Deserialize, Serialize};

/// GPT-2 settings with no BERT counterpart, kept beside the common fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Options {
    /// Dropout after the token + position embeddings (`embd_pdrop`).
    pub embd_pdrop: f64,
    /// Scale attention scores by 1/√head_dim (`scale_attn_weights`).
    pub scale_attn_weights: bool,
    /// Also divide layer `i`'s scores by `i + 1`.
    pub scale_attn_by_inverse_layer_idx: bool,
    /// The feed-forward size as the file states it (`None`: 4 × n_embd);
    /// the size itself is the common `intermediate_size`.
    pub n_inner: Option<usize>,
    /// The padding id the file states (GPT-2 has none: padding is masked
    /// out and the common `pad_token_id` falls back to the eos id).
    pub pad_token_id: Option<i64>,
}

fn one() -> f64 {
    0.1
}
fn yes() -> bool {
    true
}
fn gelu_new() -> String {
    "gelu_new".into()
}
fn gpt2_vocab() -> usize {
    50257
}
fn positions() -> usize {
    1024
}
fn embd() -> usize {
    768
}
fn twelve() -> usize {
    12
}
fn eps() -> f64 {
    1e-5
}
fn init_range() -> f64 {
    0.02
}
fn end_of_text() -> Option<i64> {
    Some(50256)
}

/// `GPT2Config` as `config.json` holds it; absent fields take its defaults.
#[derive(Serialize, Deserialize)]
struct Gpt2Json {
    model_type: String,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default = "gpt2_vocab")]
    vocab_size: usize,
    #[serde(default = "positions")]
    n_positions: usize,
    #[serde(default = "embd")]
    n_embd: usize,
    #[serde(default = "twelve")]
    n_layer: usize,
    #[serde(default = "twelve")]
    n_head: usize,
    #[serde(default)]
    n_inner: Option<usize>,
    #[serde(default = "gelu_new")]
    activation_function: String,
    #[serde(default = "one")]
    resid_pdrop: f64,
    #[serde(default = "one")]
    embd_pdrop: f64,
    #[serde(default = "one")]
    attn_pdrop: f64,
    #[serde(default = "eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "init_range")]
    initializer_range: f64,
    #[serde(default = "yes")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    reorder_and_upcast_attn: bool,
    #[serde(default = "end_of_text")]
    bos_token_id: Option<i64>,
    #[serde(default = "end_of_text")]
    eos_token_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pad_token_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tie_word_embeddings: Option<bool>,
}

/// A `ModelConfig` from a parsed GPT-2 `config.json`.
pub(crate) fn from_json(value: serde_json::Value) -> serde_json::Result<ModelConfig> {
    let json: Gpt2Json = serde_json::from_value(value)?;
    if json.reorder_and_upcast_attn {
        return Err(serde::de::Error::custom(
            "reorder_and_upcast_attn = true is not supported (lazytrain computes attention scores in f32 under \
             autocast already); set it to false",
        ));
    }
    let options = Gpt2Options {
        embd_pdrop: json.embd_pdrop,
        scale_attn_weights: json.scale_attn_weights,
        scale_attn_by_inverse_layer_idx: json.scale_attn_by_inverse_layer_idx,
        n_inner: json.n_inner,
        pad_token_id: json.pad_token_id,
    };
    Ok(ModelConfig {
        model_type: ModelType::Gpt2,
        architectures: json.architectures,
        vocab_size: json.vocab_size,
        hidden_size: json.n_embd,
        num_hidden_layers: json.n_layer,
        num_attention_heads: json.n_head,
        // An absurd n_embd gets 0 here and is refused by `validate`.
        intermediate_size: json.n_inner.unwrap_or(json.n_embd.checked_mul(4).unwrap_or(0)),
        hidden_act: json.activation_function,
        hidden_dropout_prob: json.resid_pdrop,
        attention_probs_dropout_prob: json.attn_pdrop,
        max_position_embeddings: json.n_positions,
        type_vocab_size: 0,
        layer_norm_eps: json.layer_norm_epsilon,
        initializer_range: json.initializer_range,
        pad_token_id: json.pad_token_id.or(json.eos_token_id).unwrap_or(0),
        bos_token_id: json.bos_token_id,
        eos_token_id: json.eos_token_id,
        id2label: None,
        label2id: None,
        problem_type: None,
        tie_word_embeddings: json.tie_word_embeddings,
        position_embedding_type: None,
        gpt2: Some(options),
    })
}

/// `config.json` text for a GPT-2 `config` in `GPT2Config`'s field names.
pub(crate) fn to_json(config: &ModelConfig) -> String {
    let options = config.gpt2.clone().unwrap_or_else(|| default_options(config));
    let json = Gpt2Json {
        model_type: "gpt2".into(),
        architectures: if config.architectures.is_empty() {
            vec!["GPT2LMHeadModel".into()]
        } else {
            config.architectures.clone()
        },
        vocab_size: config.vocab_size,
        n_positions: config.max_position_embeddings,
        n_embd: config.hidden_size,
        n_layer: config.num_hidden_layers,
        n_head: config.num_attention_heads,
        // null (4 × n_embd) unless the file stated it or the size differs.
        n_inner: (options.n_inner.is_some() || config.intermediate_size != 4 * config.hidden_size)
            .then_some(config.intermediate_size),
        activation_function: config.hidden_act.clone(),
        resid_pdrop: config.hidden_dropout_prob,
        embd_pdrop: options.embd_pdrop,
        attn_pdrop: config.attention_probs_dropout_prob,
        layer_norm_epsilon: config.layer_norm_eps,
        initializer_range: config.initializer_range,
        scale_attn_weights: options.scale_attn_weights,
        scale_attn_by_inverse_layer_idx: options.scale_attn_by_inverse_layer_idx,
        reorder_and_upcast_attn: false,
        bos_token_id: config.bos_token_id,
        eos_token_id: config.eos_token_id,
        pad_token_id: options.pad_token_id,
        tie_word_embeddings: config.tie_word_embeddings,
    };
    serde_json::to_string_pretty(&json).unwrap_or_default()
}

fn default_options(config: &ModelConfig) -> Gpt2Options {
    Gpt2Options {
        embd_pdrop: config.hidden_dropout_prob,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
        n_inner: None,
        pad_token_id: None,
    }
}

/// A GPT-2 preset of `layers` × `hidden` over `vocab_size` tokens, with
/// `<|endoftext|>` (bos = eos) at id 0 and HF's other defaults.
pub(crate) fn preset(vocab_size: usize, layers: usize, hidden: usize) -> ModelConfig {
    let value = serde_json::json!({
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": vocab_size,
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": hidden / 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
    });
    from_json(value).expect("a preset is a valid GPT-2 config")
}

/// GPT-2-specific checks, as the detail of a config error.
pub(crate) fn validate(config: &ModelConfig, options: &Gpt2Options) -> Result<(), String> {
    if options.n_inner == Some(0) || config.intermediate_size == 0 {
        return Err("n_inner must be positive (or null for 4 × n_embd)".into());
    }
    if !(0.0..1.0).contains(&options.embd_pdrop) {
        return Err(format!("embd_pdrop {} is not in [0, 1)", options.embd_pdrop));
    }
    for (name, id) in [("bos_token_id", config.bos_token_id), ("eos_token_id", config.eos_token_id)] {
        if let Some(id) = id.filter(|&id| id < 0 || id as usize >= config.vocab_size) {
            return Err(format!("{name} {id} is outside the vocabulary of {}", config.vocab_size));
        }
    }
    Ok(())
}
