//! # lazytrain-models
//!
//! BERT and RoBERTa encoders with masked-LM and sequence-classification
//! heads, the GPT-2 decoder with its LM head and a fixed-capacity KV cache
//! for generation, parameter names identical to Hugging Face's,
//! `config.json` in HF's field names, and HF checkpoint folders both ways
//! ([`hub`]).

mod classification;
mod config;
mod embeddings;
mod encoder;
mod error;
pub mod generation;
mod gpt2;
mod gpt2_config;
pub mod hub;
mod kv_cache;
mod masked_lm;
mod model;
mod task;

pub use classification::ForSequenceClassification;
pub use config::{Gpt2Options, ModelConfig, ModelType, PRESETS};
pub use error::{ModelError, Result};
pub use gpt2::{Gpt2Attention, Gpt2Block, Gpt2LMHeadModel, Gpt2Mlp, Gpt2Model};
pub use kv_cache::{KvCache, LayerCache};
pub use masked_lm::ForMaskedLM;
pub use model::EncoderModel;
pub use task::TaskModel;
