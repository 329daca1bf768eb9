//! Helpers the integration tests share: scratch folders, generated review
//! data, opened shards and a tiny classifier config.

#![allow(dead_code)] // each test binary uses its own subset

use lazytrain_core::ScratchDir;
use lazytrain_data::classification::demo_task::sentiment_reviews;
use lazytrain_data::classification::{
    prepare_classification, ClassificationManifest, ClassificationOptions, Columns, LabelOrder,
};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::dataset::{find_shards, ShardedDataset};
use lazytrain_data::tfrecord::CorruptPolicy;
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::{TextTokenizer, TokenizerStyle};
use lazytrain_models::ModelConfig;
use std::path::Path;
use std::sync::Arc;

/// A fresh, empty scratch folder `lazytrain-{suite}-{name}-…` in the temp
/// dir, removed when the test passes (kept when it fails).
pub fn tmp(suite: &str, name: &str) -> ScratchDir {
    ScratchDir::new(&format!("{suite}-{name}")).unwrap()
}

/// The prepared shards of `split` under `dir/data`.
pub fn open(dir: &Path, split: &str) -> Arc<ShardedDataset> {
    Arc::new(ShardedDataset::open(&find_shards(&dir.join("data"), split).unwrap(), CorruptPolicy::Fail).unwrap())
}

/// `count` generated reviews written to `dir/reviews.jsonl`, a WordPiece
/// tokenizer trained on them, and the reviews prepared into `dir/data`
/// (max length 32, padded to `buckets`).
pub fn review_data(dir: &Path, count: usize, buckets: &[usize]) -> (TextTokenizer, ClassificationManifest) {
    let countries = demo_corpus(0, 6, 0).countries;
    let reviews = sentiment_reviews(0, &countries, count);
    let texts: Vec<String> = reviews.iter().map(|r| r.text.clone()).collect();
    let tok = train_tokenizer(&texts, SubwordModel::WordPiece, 200, TokenizerStyle::Bert).unwrap();
    let body: String =
        reviews.iter().map(|r| format!("{}\n", serde_json::json!({"text": r.text, "label": r.label}))).collect();
    std::fs::write(dir.join("reviews.jsonl"), body).unwrap();
    let options = ClassificationOptions {
        columns: Columns { text: "text".into(), text_pair: None, label: "label".into() },
        max_length: 32,
        buckets: buckets.to_vec(),
        label_order: LabelOrder::Sorted,
        num_shards: 2,
        validation_fraction: 0.1,
        seed: 0,
        skip_bad_rows: false,
        progress: false,
    };
    let manifest =
        prepare_classification(&tok, &[dir.join("reviews.jsonl")], &[], &dir.join("data"), &options).unwrap();
    (tok, manifest)
}

/// A 2-layer, 32-wide BERT classifier config over `labels`.
pub fn tiny_classifier_config(tok: &TextTokenizer, labels: &[String]) -> ModelConfig {
    let mut config = ModelConfig::preset("bert-tiny", tok.vocab_size()).unwrap().with_labels(labels);
    config.hidden_size = 32;
    config.num_attention_heads = 2;
    config.intermediate_size = 64;
    config
}
