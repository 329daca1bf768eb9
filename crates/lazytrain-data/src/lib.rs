//! # lazytrain-data
//!
//! The data side of training:
//!
//! - tokenizers: trained ([`train_tokenizer`]) and loaded/saved as
//!   `tokenizer.json` folders ([`tokenizer`]);
//! - `prepare`: documents ([`text`]) → fixed blocks → TFRecord shards of
//!   `tf.train.Example`s ([`prepare`], [`tfrecord`], [`example`]);
//! - reading: random access, seeded epoch shuffles, per-replica shares and
//!   O(1) seeking ([`dataset`]), the MLM collator ([`collator`]) and the
//!   prefetching [`loader::DeviceLoader`];
//! - labelled data for sequence classification: JSON Lines/CSV/TSV rows →
//!   padded shards, their collator and the generated demo task
//!   ([`classification`]);
//! - the embedded demo corpus ([`corpus`]).

mod block_split;
pub mod classification;
pub mod collator;
pub mod corpus;
pub mod dataset;
mod document_batch;
mod error;
pub mod example;
pub mod formats;
pub mod loader;
mod long_documents;
mod partial_folder;
mod preparation;
pub mod prepare;
pub mod protobuf;
mod quiet;
mod reproducible_training;
pub mod text;
pub mod tfrecord;
pub mod tokenizer;
pub mod train_tokenizer;

pub use error::{DataError, Result};
pub use tokenizer::{SpecialTokens, TextTokenizer, TokenizerStyle};
