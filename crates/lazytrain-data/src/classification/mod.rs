//! Labelled data for sequence classification: rows from JSON Lines, CSV or
//! TSV ([`rows`]), tokenized into padded TFRecord shards ([`prepare`]),
//! batched one label per sequence ([`collator`]), and the generated demo
//! task ([`demo_task`]).

pub mod collator;
pub mod demo_task;
pub mod prepare;
pub mod rows;

pub use collator::ClassificationCollator;
pub use prepare::{prepare_classification, ClassificationManifest, ClassificationOptions};
pub use rows::{BadRowKind, Columns, LabelOrder, LabelledRow};
