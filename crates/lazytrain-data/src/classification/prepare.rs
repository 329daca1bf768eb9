//! `prepare-classification`: labelled rows → token ids padded to a fixed
//! length (or the smallest of a few bucket lengths) → TFRecord shards with
//! `input_ids`, `attention_mask`, `token_type_ids` and `label`, plus
//! `labels.json` and `manifest.json`.

use super::rows::{
    label_names, read_labelled_file, BadRowCounts, BadRowKind, Columns, LabelOrder, LabelledRow, RowPolicy,
};
use crate::example::encode_int64_example;
use crate::prepare::{
    finish_shards, read_manifest, remove_shards, shard_writers, stage_bar, tokenizer_hash, write_json, ShardInfo,
};
use crate::tokenizer::TextTokenizer;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokenizers::{EncodeInput, TruncationDirection, TruncationParams, TruncationStrategy};

/// The `task` written into a classification manifest.
pub const SEQUENCE_CLASSIFICATION: &str = "sequence-classification";

/// Options for [`prepare_classification`].
#[derive(Clone, Debug)]
pub struct ClassificationOptions {
    /// Which columns to read.
    pub columns: Columns,
    /// Longest sequence (special tokens included); longer ones are truncated.
    pub max_length: usize,
    /// Lengths rows are padded to (the smallest that fits); empty means
    /// `[max_length]`. `max_length` is always the last bucket.
    pub buckets: Vec<usize>,
    /// How label ids are assigned.
    pub label_order: LabelOrder,
    /// Training shards.
    pub num_shards: usize,
    /// Fraction of training rows held out when no validation files are given.
    pub validation_fraction: f64,
    /// Seed of that split.
    pub seed: u64,
    /// Skip and count bad rows instead of failing on the first.
    pub skip_bad_rows: bool,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

/// What `prepare-classification` wrote (`manifest.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassificationManifest {
    /// Always `sequence-classification`.
    pub task: String,
    /// Longest sequence.
    pub max_length: usize,
    /// Padded lengths, ascending; the last is `max_length`.
    pub buckets: Vec<usize>,
    /// Label names in id order.
    pub labels: Vec<String>,
    /// How the ids were assigned.
    pub label_order: LabelOrder,
    /// The columns read.
    pub columns: Columns,
    /// Training shards.
    pub train: Vec<ShardInfo>,
    /// Validation shards.
    pub validation: Vec<ShardInfo>,
    /// Rows written (both splits).
    pub rows: u64,
    /// Rows cut to `max_length`.
    pub truncated: u64,
    /// Bad rows skipped, by reason (empty unless `--skip-bad-rows`).
    pub skipped_rows: BadRowCounts,
    /// Masked CRC32C of the tokenizer's `tokenizer.json`, hex.
    pub tokenizer_hash: String,
    /// The tokenizer's vocabulary size.
    pub vocab_size: usize,
    /// Seed of the split.
    pub seed: u64,
}

impl ClassificationManifest {
    /// Read `manifest.json` of a `prepare-classification` folder.
    pub fn read(dir: &Path) -> Result<ClassificationManifest> {
        ClassificationManifest::read_url(&lazytrain_storage::StorageUrl::Local(dir.to_path_buf()))
    }

    /// Read `manifest.json` of a `prepare-classification` folder or bucket prefix.
    pub fn read_url(dir: &lazytrain_storage::StorageUrl) -> Result<ClassificationManifest> {
        read_manifest(
            dir,
            Some(SEQUENCE_CLASSIFICATION),
            "lazytrain prepare-classification",
            "this folder holds masked-LM blocks from `prepare`, not labelled data; prepare labelled data with `lazytrain prepare-classification`",
        )
    }

    /// `id2label` as Hugging Face's `config.json` writes it.
    pub fn id2label(&self) -> BTreeMap<String, String> {
        self.labels.iter().enumerate().map(|(i, l)| (i.to_string(), l.clone())).collect()
    }

    /// `label2id` as Hugging Face's `config.json` writes it.
    pub fn label2id(&self) -> BTreeMap<String, i64> {
        self.labels.iter().enumerate().map(|(i, l)| (l.clone(), i as i64)).collect()
    }
}

/// `labels.json`: the label names and ids both ways, and how ids were chosen.
#[derive(Serialize)]
struct LabelsFile<'a> {
    order: LabelOrder,
    id2label: BTreeMap<String, String>,
    label2id: BTreeMap<String, i64>,
    note: &'a str,
}

/// The longest `--max-length`: rows are padded to their bucket, so the
/// prepared data (and the memory that writes it) grows with rows × length;
/// far beyond any encoder's positions.
pub const MAX_LENGTH: usize = 1 << 16;

/// `max_length` must leave room for text after the special tokens the
/// tokenizer adds (`[CLS] .. [SEP]`, three with a text pair on BERT).
fn check_room_for_text(tokenizer: &TextTokenizer, max_length: usize, pairs: bool) -> Result<()> {
    use tokenizers::PostProcessor;
    let added = tokenizer.inner().get_post_processor().map_or(0, |p| p.added_tokens(pairs));
    if max_length <= added {
        return Err(DataError::Invalid(format!(
            "--max-length {max_length} leaves no room for text: the tokenizer adds {added} special tokens to every \
             {}; pass a larger --max-length",
            if pairs { "text pair" } else { "text" }
        )));
    }
    Ok(())
}

/// The bucket lengths: sorted, unique, ending at `max_length`.
fn resolve_buckets(buckets: &[usize], max_length: usize) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = buckets.to_vec();
    if let Some(&bad) = out.iter().find(|&&b| b < 4 || b > max_length) {
        return Err(DataError::Invalid(format!("bucket length {bad} must be between 4 and --max-length {max_length}")));
    }
    out.push(max_length);
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn read_all(
    files: &[PathBuf],
    columns: &Columns,
    skip: bool,
    counts: &mut BadRowCounts,
) -> Result<Vec<(PathBuf, LabelledRow)>> {
    let mut rows = Vec::new();
    for file in files {
        rows.extend(read_labelled_file(file, columns, skip, counts)?.into_iter().map(|r| (file.clone(), r)));
    }
    Ok(rows)
}

/// Tokenize and write labelled rows. `validation_files` (which may only use
/// labels the training files have) give the validation split; without them
/// `validation_fraction` of the training rows are held out by seed.
pub fn prepare_classification(
    tokenizer: &TextTokenizer,
    train_files: &[PathBuf],
    validation_files: &[PathBuf],
    out_dir: &Path,
    options: &ClassificationOptions,
) -> Result<ClassificationManifest> {
    if train_files.is_empty() {
        return Err(DataError::Invalid("give at least one training file (--files)".into()));
    }
    crate::prepare::check_split_options(options.num_shards, options.validation_fraction)?;
    if options.max_length > MAX_LENGTH {
        return Err(DataError::Invalid(format!(
            "--max-length {} must be at most {MAX_LENGTH}: every row is padded to its bucket (the model's \
             positions, often 512, are the usual choice)",
            options.max_length
        )));
    }
    let buckets = resolve_buckets(&options.buckets, options.max_length)?;
    check_room_for_text(tokenizer, options.max_length, options.columns.text_pair.is_some())?;
    let mut skipped = BadRowCounts::new();
    let train_rows = read_all(train_files, &options.columns, options.skip_bad_rows, &mut skipped)?;
    let rows_only: Vec<LabelledRow> = train_rows.iter().map(|(_, r)| r.clone()).collect();
    let labels = label_names(&rows_only, options.label_order);
    if labels.len() < 2 {
        return Err(DataError::Invalid(format!(
            "the training files have {} distinct label(s) in column `{}`; classification needs at least 2",
            labels.len(),
            options.columns.label
        )));
    }
    let mut eval_rows = Vec::new();
    for (file, row) in read_all(validation_files, &options.columns, options.skip_bad_rows, &mut skipped)? {
        if labels.contains(&row.label) {
            eval_rows.push((file, row));
        } else {
            let mut policy = RowPolicy { path: &file, skip: options.skip_bad_rows, counts: &mut skipped };
            let detail = format!("label `{}` is not one of the training labels ({})", row.label, labels.join(", "));
            policy.reject(BadRowKind::UnknownLabel, row.line, detail)?;
        }
    }
    let mut held_out = vec![0f32; train_rows.len()];
    lazytrain_core::random::uniform_f32(options.seed, 0xc1a5, &mut held_out);
    let split_by_fraction = validation_files.is_empty();
    let mut train = Vec::new();
    for ((file, row), u) in train_rows.into_iter().zip(held_out) {
        if split_by_fraction && (u as f64) < options.validation_fraction {
            eval_rows.push((file, row));
        } else {
            train.push((file, row));
        }
    }
    let encoder = Encoder::new(tokenizer, options.max_length, &buckets)?;
    crate::prepare::check_output_folder(out_dir)?;
    std::fs::create_dir_all(out_dir)
        .map_err(|e| DataError::Io { path: out_dir.display().to_string(), detail: e.to_string() })?;
    if train.is_empty() {
        return Err(DataError::Invalid("no training rows are left after the validation split".into()));
    }
    remove_shards(out_dir)?;
    let mut truncated = 0;
    let label_id = |name: &str| labels.iter().position(|l| l == name).unwrap_or_default() as i64;
    let mut write_split = |split: &str, rows: &[(PathBuf, LabelledRow)], shards: usize| -> Result<Vec<ShardInfo>> {
        let mut writers = shard_writers(out_dir, split, shards)?;
        let bar = stage_bar(rows.len() as u64, options.progress, split);
        for (k, chunk) in rows.chunks(1024).enumerate() {
            for (i, (record, cut)) in encoder.encode(chunk)?.into_iter().enumerate() {
                truncated += u64::from(cut);
                let label = [label_id(&chunk[i].1.label)];
                let features = [
                    ("input_ids", record.input_ids.as_slice()),
                    ("attention_mask", record.attention_mask.as_slice()),
                    ("token_type_ids", record.token_type_ids.as_slice()),
                    ("label", label.as_slice()),
                ];
                let at = k * 1024 + i;
                writers[at % shards].1.write(&encode_int64_example(&features))?;
            }
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        finish_shards(writers)
    };
    let train_shards = write_split("train", &train, options.num_shards)?;
    let validation_shards = if eval_rows.is_empty() { Vec::new() } else { write_split("validation", &eval_rows, 1)? };
    let manifest = ClassificationManifest {
        task: SEQUENCE_CLASSIFICATION.into(),
        max_length: options.max_length,
        buckets,
        labels,
        label_order: options.label_order,
        columns: options.columns.clone(),
        train: train_shards,
        validation: validation_shards,
        rows: (train.len() + eval_rows.len()) as u64,
        truncated,
        skipped_rows: skipped,
        tokenizer_hash: tokenizer_hash(tokenizer)?,
        vocab_size: tokenizer.vocab_size(),
        seed: options.seed,
    };
    let labels_file = LabelsFile {
        order: manifest.label_order,
        id2label: manifest.id2label(),
        label2id: manifest.label2id(),
        note: match manifest.label_order {
            LabelOrder::Sorted => "ids follow the sorted label names (numerically when all labels are integers)",
            LabelOrder::FirstSeen => "ids follow the order in which labels first appear in the training files",
        },
    };
    write_json(&out_dir.join("labels.json"), &labels_file)?;
    write_json(&out_dir.join("manifest.json"), &manifest)?;
    Ok(manifest)
}

/// One encoded row, padded to its bucket.
struct EncodedRow {
    input_ids: Vec<i64>,
    attention_mask: Vec<i64>,
    token_type_ids: Vec<i64>,
}

/// A tokenizer set to truncate to `max_length` (longest text first, as
/// Hugging Face's `truncation=True`) and the buckets to pad to.
struct Encoder<'a> {
    tokenizer: tokenizers::Tokenizer,
    pad_id: i64,
    buckets: &'a [usize],
}

impl<'a> Encoder<'a> {
    fn new(tokenizer: &TextTokenizer, max_length: usize, buckets: &'a [usize]) -> Result<Encoder<'a>> {
        let mut inner = tokenizer.inner().clone();
        inner
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| DataError::Invalid(format!("cannot truncate to --max-length {max_length}: {e}")))?;
        inner.with_padding(None);
        Ok(Encoder { tokenizer: inner, pad_id: tokenizer.special().pad as i64, buckets })
    }

    /// Encode rows; each result says whether the row was truncated.
    fn encode(&self, rows: &[(PathBuf, LabelledRow)]) -> Result<Vec<(EncodedRow, bool)>> {
        let inputs: Vec<EncodeInput> = rows
            .iter()
            .map(|(_, r)| match &r.text_pair {
                Some(pair) => EncodeInput::Dual(r.text.as_str().into(), pair.as_str().into()),
                None => EncodeInput::Single(r.text.as_str().into()),
            })
            .collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| DataError::Invalid(format!("tokenization failed: {e}")))?;
        Ok(encodings
            .iter()
            .map(|e| {
                let len = e.get_ids().len();
                let bucket = self.buckets.iter().copied().find(|&b| b >= len).unwrap_or(len);
                let pad = |mut v: Vec<i64>, with: i64| {
                    v.resize(bucket, with);
                    v
                };
                let row = EncodedRow {
                    input_ids: pad(e.get_ids().iter().map(|&t| t as i64).collect(), self.pad_id),
                    attention_mask: pad(vec![1; len], 0),
                    token_type_ids: pad(e.get_type_ids().iter().map(|&t| t as i64).collect(), 0),
                };
                (row, !e.get_overflowing().is_empty())
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_end_at_max_length() {
        assert_eq!(resolve_buckets(&[64, 32, 32], 128).unwrap(), [32, 64, 128]);
        assert_eq!(resolve_buckets(&[], 128).unwrap(), [128]);
        assert!(resolve_buckets(&[256], 128).unwrap_err().to_string().contains("bucket length 256"));
    }
}
