//! `prepare-classification`: labelled rows → token ids padded to a fixed
//! length (or the smallest of a few bucket lengths) → TFRecord shards with
//! `input_ids`, `attention_mask`, `token_type_ids` and `label`, plus
//! `labels.json` and `manifest.json`.

use super::rows::{
    for_each_labelled_row, BadRowCounts, BadRowKind, Columns, LabelOrder, LabelledRow, LabelsSeen, RowPolicy,
};
use crate::example::encode_int64_example;
use crate::partial_folder::PartialFolder;
use crate::preparation::counting_bar;
use crate::prepare::{finish_shards, read_manifest, shard_writers, tokenizer_hash, write_json, ShardInfo};
use crate::tfrecord::RecordWriter;
use crate::tokenizer::TextTokenizer;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
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
    // First pass: the training files' labels (and their bad rows, counted
    // here once); memory holds the label names, not the rows.
    let mut skipped = BadRowCounts::new();
    let mut seen = LabelsSeen::default();
    let mut training_rows = 0u64;
    for file in train_files {
        for_each_labelled_row(file, &options.columns, options.skip_bad_rows, &mut skipped, &mut |row| {
            seen.add(&row.label);
            training_rows += 1;
            Ok(())
        })?;
    }
    let labels = seen.in_order(options.label_order);
    if labels.len() < 2 {
        return Err(DataError::Invalid(format!(
            "the training files have {} distinct label(s) in column `{}`; classification needs at least 2",
            labels.len(),
            options.columns.label
        )));
    }
    let split_by_fraction = validation_files.is_empty();
    let held_out = |index: u64| {
        let mut draw = [0f32];
        lazytrain_core::random::uniform_f32_from(options.seed, 0xc1a5, index as usize, &mut draw);
        split_by_fraction && (draw[0] as f64) < options.validation_fraction
    };
    if (0..training_rows).all(held_out) {
        return Err(DataError::Invalid("no training rows are left after the validation split".into()));
    }
    let encoder = Encoder::new(tokenizer, options.max_length, &buckets)?;
    crate::prepare::check_output_folder(out_dir)?;
    // Second pass: every row tokenized and written a chunk at a time, into
    // a folder moved into place when all is written.
    let partial = PartialFolder::create(out_dir)?;
    let label_ids: HashMap<&str, i64> = labels.iter().enumerate().map(|(i, l)| (l.as_str(), i as i64)).collect();
    let mut train = SplitWriter::new(shard_writers(partial.path(), "train", options.num_shards)?);
    let mut validation = SplitWriter::new(shard_writers(partial.path(), "validation", 1)?);
    let bar = counting_bar(options.progress, "rows");
    let write = |split: &mut SplitWriter, row: LabelledRow| {
        bar.inc(1);
        split.add(row, &encoder, &label_ids)
    };
    for file in validation_files {
        let mut unknown = BadRowCounts::new();
        for_each_labelled_row(file, &options.columns, options.skip_bad_rows, &mut skipped, &mut |row| {
            if label_ids.contains_key(row.label.as_str()) {
                return write(&mut validation, row);
            }
            let mut policy = RowPolicy { path: file, skip: options.skip_bad_rows, counts: &mut unknown };
            let detail = format!("label `{}` is not one of the training labels ({})", row.label, labels.join(", "));
            policy.reject(BadRowKind::UnknownLabel, row.line, detail)
        })?;
        for (kind, count) in unknown {
            *skipped.entry(kind).or_default() += count;
        }
    }
    // Bad training rows were counted in the first pass.
    let mut index = 0u64;
    for file in train_files {
        for_each_labelled_row(file, &options.columns, true, &mut BadRowCounts::new(), &mut |row| {
            let split = if held_out(index) { &mut validation } else { &mut train };
            index += 1;
            write(split, row)
        })?;
    }
    bar.finish_and_clear();
    if index != training_rows {
        return Err(DataError::Invalid(format!(
            "the training files gave {training_rows} rows when first read and {index} when read again; were they \
             changed meanwhile? Prepare again once they are complete"
        )));
    }
    let rows = train.rows + validation.rows;
    let (train_shards, mut truncated) = train.finish(&encoder, &label_ids)?;
    let validation_shards = match validation.rows {
        0 => {
            // Closed before its folder is published and removed.
            drop(validation);
            Vec::new()
        }
        _ => {
            let (shards, cut) = validation.finish(&encoder, &label_ids)?;
            truncated += cut;
            shards
        }
    };
    let manifest = ClassificationManifest {
        task: SEQUENCE_CLASSIFICATION.into(),
        max_length: options.max_length,
        buckets,
        labels,
        label_order: options.label_order,
        columns: options.columns.clone(),
        train: train_shards,
        validation: validation_shards,
        rows,
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
    write_json(&partial.path().join("labels.json"), &labels_file)?;
    write_json(&partial.path().join("manifest.json"), &manifest)?;
    partial.publish(manifest.train.iter().chain(&manifest.validation), &["labels.json", "manifest.json"])?;
    Ok(manifest)
}

/// Rows tokenized together.
const CHUNK_ROWS: usize = 1024;

/// One split's shards, written a chunk of rows at a time (row `i` of the
/// split to shard `i % shards`).
struct SplitWriter {
    writers: Vec<(String, RecordWriter)>,
    pending: Vec<LabelledRow>,
    /// Rows given.
    rows: u64,
    /// Rows written, and how many of them were cut to `max_length`.
    written: u64,
    truncated: u64,
}

impl SplitWriter {
    fn new(writers: Vec<(String, RecordWriter)>) -> SplitWriter {
        SplitWriter { writers, pending: Vec::with_capacity(CHUNK_ROWS), rows: 0, written: 0, truncated: 0 }
    }

    /// Add `row`, writing the chunk it completes.
    fn add(&mut self, row: LabelledRow, encoder: &Encoder, label_ids: &HashMap<&str, i64>) -> Result<()> {
        self.rows += 1;
        self.pending.push(row);
        match self.pending.len() >= CHUNK_ROWS {
            true => self.write_pending(encoder, label_ids),
            false => Ok(()),
        }
    }

    fn write_pending(&mut self, encoder: &Encoder, label_ids: &HashMap<&str, i64>) -> Result<()> {
        for (row, (record, cut)) in self.pending.iter().zip(encoder.encode(&self.pending)?) {
            self.truncated += u64::from(cut);
            let Some(&id) = label_ids.get(row.label.as_str()) else {
                return Err(DataError::Invalid(format!(
                    "line {}: label `{}` was not in the training files when they were first read; were they changed \
                     meanwhile? Prepare again once they are complete",
                    row.line, row.label
                )));
            };
            let label = [id];
            let features = [
                ("input_ids", record.input_ids.as_slice()),
                ("attention_mask", record.attention_mask.as_slice()),
                ("token_type_ids", record.token_type_ids.as_slice()),
                ("label", label.as_slice()),
            ];
            let shard = (self.written % self.writers.len() as u64) as usize;
            self.writers[shard].1.write(&encode_int64_example(&features))?;
            self.written += 1;
        }
        self.pending.clear();
        Ok(())
    }

    /// Write the last rows and close the shards: their record counts, and
    /// the rows cut to `max_length`.
    fn finish(mut self, encoder: &Encoder, label_ids: &HashMap<&str, i64>) -> Result<(Vec<ShardInfo>, u64)> {
        self.write_pending(encoder, label_ids)?;
        Ok((finish_shards(self.writers)?, self.truncated))
    }
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
    fn encode(&self, rows: &[LabelledRow]) -> Result<Vec<(EncodedRow, bool)>> {
        let inputs: Vec<EncodeInput> = rows
            .iter()
            .map(|r| match &r.text_pair {
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
