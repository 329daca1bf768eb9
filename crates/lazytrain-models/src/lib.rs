//! # lazytrain-models
//!
//! BERT and RoBERTa encoders with masked-LM and sequence-classification
//! heads, parameter names identical to Hugging Face's, `config.json` in HF's
//! field names, and HF checkpoint folders both ways ([`hub`]).

mod classification;
mod config;
mod embeddings;
mod encoder;
mod error;
pub mod hub;
mod masked_lm;
mod model;
mod task;

pub use classification::ForSequenceClassification;
pub use config::{ModelConfig, ModelType};
pub use error::{ModelError, Result};
pub use masked_lm::ForMaskedLM;
pub use model::EncoderModel;
pub use task::TaskModel;
