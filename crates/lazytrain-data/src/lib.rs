//! # lazytrain-data
//!
//! The data side of training: Hugging Face tokenizers loaded and saved as
//! `tokenizer.json` folders ([`tokenizer`]).

mod error;
pub mod tokenizer;

pub use error::{DataError, Result};
pub use tokenizer::{SpecialTokens, TextTokenizer, TokenizerStyle};
