//! # lazytrain
//!
//! The user-facing layer: the [`trainer::Trainer`] driven by
//! [`trainer::TrainingArguments`], Hugging Face model folders with their
//! tokenizers ([`folder`]) and inference pipelines ([`pipelines`]: fill-mask
//! and feature extraction), used by the `lazytrain` CLI.

mod error;
pub mod folder;
pub mod hub_cache;
pub mod pipelines;
pub mod plot;
pub mod trainer;

pub use error::{Error, Result};
