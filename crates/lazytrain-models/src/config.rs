//! Model configuration in Hugging Face's `config.json` field names.

pub use crate::gpt2_config::Gpt2Options;
use crate::{ModelError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The architectures lazytrain implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    /// BERT (`model_type: "bert"`).
    Bert,
    /// RoBERTa (`model_type: "roberta"`): positions start after the padding index.
    Roberta,
    /// GPT-2 (`model_type: "gpt2"`), a causal decoder; its `config.json`
    /// uses GPT-2's own field names (`n_embd`, `n_layer`, ...).
    Gpt2,
}

impl ModelType {
    /// The HF `model_type` string, also the base model's weight-name prefix.
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Bert => "bert",
            ModelType::Roberta => "roberta",
            ModelType::Gpt2 => "gpt2",
        }
    }

    /// The prefix of the base model's weights in a checkpoint of a model
    /// with a head (`bert.`, `roberta.`, GPT-2's `transformer.`).
    pub fn weights_prefix(self) -> &'static str {
        match self {
            ModelType::Bert => "bert",
            ModelType::Roberta => "roberta",
            ModelType::Gpt2 => "transformer",
        }
    }
}

fn default_hidden_act() -> String {
    "gelu".into()
}
fn default_max_positions() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_dropout() -> f64 {
    0.1
}
fn default_init_range() -> f64 {
    0.02
}

/// A BERT/RoBERTa configuration. Required: the sizes and `model_type`;
/// everything else has Hugging Face's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `bert` or `roberta`.
    pub model_type: ModelType,
    /// HF class names (`BertForMaskedLM`, ...).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Feed-forward size.
    pub intermediate_size: usize,
    /// `gelu` (exact), `gelu_new` (tanh approximation) or `relu`.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// Dropout after embeddings, attention output and feed-forward.
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities.
    #[serde(default = "default_dropout")]
    pub attention_probs_dropout_prob: f64,
    /// Position embedding rows.
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    /// Token-type embedding rows.
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Std of the normal initialiser.
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Padding token id.
    #[serde(default)]
    pub pad_token_id: i64,
    /// Beginning-of-sequence id (RoBERTa).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<i64>,
    /// End-of-sequence id (RoBERTa).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<i64>,
    /// Label names by id, for classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
    /// Label ids by name, for classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label2id: Option<std::collections::BTreeMap<String, i64>>,
    /// What a classifier's outputs mean: `single_label_classification`
    /// (softmax), `multi_label_classification` (a sigmoid per label) or
    /// `regression` (raw scores); unset: inferred from the label count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem_type: Option<String>,
    /// Whether the masked-LM decoder shares the word embeddings (it must:
    /// lazytrain's decoder is always tied, as HF's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    /// `absolute` (the only kind lazytrain implements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_embedding_type: Option<String>,
    /// GPT-2's settings that have no BERT counterpart (`None` for encoders).
    #[serde(skip)]
    pub gpt2: Option<Gpt2Options>,
}

/// Configs describing more parameters than this are refused as a likely
/// typo (100 billion, far beyond what lazytrain trains).
pub const MAX_PARAMETERS: usize = 100_000_000_000;

/// The `problem_type` values Hugging Face defines.
pub const PROBLEM_TYPES: [&str; 3] = ["single_label_classification", "multi_label_classification", "regression"];

/// The preset names, `bert-*`, `roberta-*` and `gpt2-*`.
pub const PRESETS: [&str; 11] = [
    "bert-tiny",
    "bert-mini",
    "bert-small",
    "bert-base",
    "roberta-tiny",
    "roberta-mini",
    "roberta-small",
    "roberta-base",
    "gpt2-tiny",
    "gpt2-mini",
    "gpt2-small",
];

impl ModelConfig {
    /// A preset for from-scratch training: `bert-tiny` (2 layers, 128
    /// hidden), `bert-mini` (4/256), `bert-small` (4/512), `bert-base`
    /// (12/768), and the same sizes as `roberta-*`; heads = hidden / 64 and
    /// the intermediate size is 4 × hidden. `gpt2-tiny` (2/128), `gpt2-mini`
    /// (4/256) and `gpt2-small` (12/768, Hugging Face's `gpt2`) are GPT-2
    /// decoders with 1024 positions; `<|endoftext|>` is assumed at id 0 (as
    /// `train-tokenizer --style gpt2` places it) until the tokenizer says otherwise.
    pub fn preset(name: &str, vocab_size: usize) -> Result<ModelConfig> {
        let (kind, size) = name.split_once('-').ok_or_else(|| unknown_preset(name))?;
        let model_type = match kind {
            "bert" => ModelType::Bert,
            "roberta" => ModelType::Roberta,
            "gpt2" => {
                let (layers, hidden) = match size {
                    "tiny" => (2, 128),
                    "mini" => (4, 256),
                    "small" => (12, 768),
                    _ => return Err(unknown_preset(name)),
                };
                let config = crate::gpt2_config::preset(vocab_size, layers, hidden);
                config.validate(&format!("preset {name}"))?;
                return Ok(config);
            }
            _ => return Err(unknown_preset(name)),
        };
        let (layers, hidden) = match size {
            "tiny" => (2, 128),
            "mini" => (4, 256),
            "small" => (4, 512),
            "base" => (12, 768),
            _ => return Err(unknown_preset(name)),
        };
        let roberta = model_type == ModelType::Roberta;
        let config = ModelConfig {
            model_type,
            architectures: vec![if roberta { "RobertaForMaskedLM" } else { "BertForMaskedLM" }.into()],
            vocab_size,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: hidden / 64,
            intermediate_size: 4 * hidden,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: if roberta { 514 } else { 512 },
            type_vocab_size: if roberta { 1 } else { 2 },
            layer_norm_eps: if roberta { 1e-5 } else { 1e-12 },
            initializer_range: 0.02,
            pad_token_id: if roberta { 1 } else { 0 },
            bos_token_id: roberta.then_some(0),
            eos_token_id: roberta.then_some(2),
            id2label: None,
            label2id: None,
            problem_type: None,
            tie_word_embeddings: None,
            position_embedding_type: None,
            gpt2: None,
        };
        config.validate(&format!("preset {name}"))?;
        Ok(config)
    }

    /// Read and check a Hugging Face `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let where_ = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError::Io { path: where_.clone(), detail: format!("cannot read the config: {e}") })?;
        ModelConfig::from_json(&text, &where_)
    }

    /// Parse and check `config.json` text read from `path` (named in errors).
    pub fn from_json(text: &str, path: &str) -> Result<ModelConfig> {
        let bad = |e: serde_json::Error| {
            ModelError::Config {
            path: path.to_string(),
            detail: format!("{e} (model_type must be \"bert\", \"roberta\" or \"gpt2\"; BERT and RoBERTa need the sizes vocab_size, hidden_size, num_hidden_layers, num_attention_heads and intermediate_size)"),
        }
        };
        let value: serde_json::Value = serde_json::from_str(text).map_err(bad)?;
        let Some(fields) = value.as_object() else {
            return Err(ModelError::Config {
                path: path.to_string(),
                detail: format!(
                    "a config must be a JSON object of settings ({{\"model_type\": ...}}), not {value:.40}"
                ),
            });
        };
        // serde names the type a null should have been, not the field: name them.
        let nulls: Vec<&str> = fields.iter().filter(|(_, v)| v.is_null()).map(|(k, _)| k.as_str()).collect();
        let bad_value = |e: serde_json::Error| match e.to_string().contains("invalid type: null") && !nulls.is_empty() {
            true => ModelError::Config {
                path: path.to_string(),
                detail: format!(
                    "{e}: a setting that must be a number or text is null (null here: {})",
                    nulls.join(", ")
                ),
            },
            false => bad(e),
        };
        let config = match value.get("model_type").and_then(|t| t.as_str()) {
            Some("gpt2") => crate::gpt2_config::from_json(value.clone()).map_err(bad_value)?,
            _ => serde_json::from_value(value.clone()).map_err(bad_value)?,
        };
        config.validate(path)?;
        Ok(config)
    }

    /// The config as HF's `config.json` text (GPT-2's in its own field names).
    pub fn to_json(&self) -> String {
        match self.model_type {
            ModelType::Gpt2 => crate::gpt2_config::to_json(self),
            ModelType::Bert | ModelType::Roberta => serde_json::to_string_pretty(self).unwrap_or_default(),
        }
    }

    /// Check that the settings describe a model lazytrain can build (sizes,
    /// token ids inside the vocabulary, supported kinds); errors name
    /// `path`, where the settings came from.
    pub fn validate(&self, path: &str) -> Result<()> {
        let bad = |detail: String| Err(ModelError::Config { path: path.to_string(), detail });
        if self.num_attention_heads == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} must be a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !matches!(self.hidden_act.as_str(), "gelu" | "gelu_new" | "relu") {
            return bad(format!("hidden_act `{}` is not supported; use gelu, gelu_new or relu", self.hidden_act));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.max_position_embeddings == 0 {
            return bad("vocab_size, hidden_size and max_position_embeddings must be positive".into());
        }
        if self.gpt2.is_none() && self.type_vocab_size == 0 {
            return bad("type_vocab_size must be at least 1 (BERT has 2 token types, RoBERTa 1)".into());
        }
        if let Some(kind) = self.position_embedding_type.as_deref().filter(|k| *k != "absolute") {
            return bad(format!(
                "position_embedding_type `{kind}` is not supported; lazytrain implements `absolute` position embeddings"
            ));
        }
        if self.tie_word_embeddings == Some(false) {
            let head = if self.gpt2.is_some() { "an lm_head of its own" } else { "an untied masked-LM decoder" };
            return bad(format!(
                "tie_word_embeddings = false ({head}) is not supported; lazytrain's output layer always shares the \
                 word embeddings"
            ));
        }
        if self.parameter_count().is_none_or(|n| n > MAX_PARAMETERS) {
            return bad(format!(
                "the sizes describe more than {MAX_PARAMETERS} parameters (vocab_size {}, hidden_size {}, \
                 num_hidden_layers {}, intermediate_size {}, max_position_embeddings {}); is one of them wrong?",
                self.vocab_size,
                self.hidden_size,
                self.num_hidden_layers,
                self.intermediate_size,
                self.max_position_embeddings
            ));
        }
        if let Some(options) = &self.gpt2 {
            crate::gpt2_config::validate(self, options)
                .map_err(|detail| ModelError::Config { path: path.to_string(), detail })?;
        }
        if let Some(kind) = self.problem_type.as_deref().filter(|k| !PROBLEM_TYPES.contains(k)) {
            return bad(format!("problem_type `{kind}`; choose one of {}", PROBLEM_TYPES.join(", ")));
        }
        if self.pad_token_id < 0 || self.pad_token_id as usize >= self.vocab_size {
            return bad(format!("pad_token_id {} is outside the vocabulary of {}", self.pad_token_id, self.vocab_size));
        }
        self.check_numbers().map_or(Ok(()), bad)?;
        if let Some(labels) = &self.id2label {
            if let Some(key) = labels.keys().find(|k| !k.parse::<usize>().is_ok_and(|id| id < labels.len())) {
                return bad(format!(
                    "id2label's keys must be the label ids 0 to {} (one per label), found \"{key}\"",
                    labels.len().saturating_sub(1)
                ));
            }
        }
        Ok(())
    }

    /// The LayerNorm epsilon, dropout probabilities and initialiser range,
    /// named as this model type's `config.json` spells them, when one is out
    /// of its range (a negative epsilon makes every output NaN).
    fn check_numbers(&self) -> Option<String> {
        let gpt2 = self.gpt2.is_some();
        let (eps, hidden, attention) = match gpt2 {
            true => ("layer_norm_epsilon", "resid_pdrop", "attn_pdrop"),
            false => ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob"),
        };
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite()) {
            return Some(format!("{eps} {} must be a small positive number (e.g. 1e-12 or 1e-5)", self.layer_norm_eps));
        }
        for (name, p) in [(hidden, self.hidden_dropout_prob), (attention, self.attention_probs_dropout_prob)] {
            if !(0.0..1.0).contains(&p) {
                return Some(format!("{name} {p} is not in [0, 1)"));
            }
        }
        if !(self.initializer_range >= 0.0 && self.initializer_range.is_finite()) {
            return Some(format!("initializer_range {} must be a finite number >= 0", self.initializer_range));
        }
        None
    }

    /// This config for a sequence classifier over `labels` (names in id
    /// order): `architectures`, `id2label` and `label2id` as Hugging Face
    /// writes them.
    pub fn with_labels(mut self, labels: &[String]) -> ModelConfig {
        let class = match self.model_type {
            ModelType::Bert => "BertForSequenceClassification",
            ModelType::Roberta => "RobertaForSequenceClassification",
            ModelType::Gpt2 => "GPT2ForSequenceClassification",
        };
        self.architectures = vec![class.into()];
        self.id2label = Some(labels.iter().enumerate().map(|(i, l)| (i.to_string(), l.clone())).collect());
        self.label2id = Some(labels.iter().enumerate().map(|(i, l)| (l.clone(), i as i64)).collect());
        self
    }

    /// About how many parameters the sizes describe (embeddings and the
    /// layers' matrices), or `None` when that overflows.
    pub fn parameter_count(&self) -> Option<usize> {
        let h = self.hidden_size;
        let embeddings = self.vocab_size.checked_add(self.max_position_embeddings)?.checked_mul(h)?;
        let attention = h.checked_mul(h)?.checked_mul(4)?;
        let feed_forward = h.checked_mul(self.intermediate_size)?.checked_mul(2)?;
        let layers = attention.checked_add(feed_forward)?.checked_mul(self.num_hidden_layers)?;
        embeddings.checked_add(layers)
    }

    /// The longest sequence the position embeddings allow.
    pub fn max_sequence_length(&self) -> usize {
        match self.model_type {
            ModelType::Bert | ModelType::Gpt2 => self.max_position_embeddings,
            ModelType::Roberta => self.max_position_embeddings.saturating_sub(self.pad_token_id as usize + 1),
        }
    }
}

fn unknown_preset(name: &str) -> ModelError {
    ModelError::Config {
        path: format!("preset {name}"),
        detail: format!("unknown preset; choose one of {}", PRESETS.join(", ")),
    }
}
