//! # lazytrain
//!
//! The user-facing layer: Hugging Face model folders with their tokenizers
//! ([`folder`]) and inference pipelines ([`pipelines`]: fill-mask and
//! feature extraction), used by the `lazytrain` CLI.

mod error;
pub mod folder;
pub mod pipelines;

pub use error::{Error, Result};
