//! `prepare`: tokenize documents, pack them into fixed blocks (Hugging Face
//! `group_texts`, or RoBERTa's wrapped stream: [`Packing`]), split
//! train/validation and write TFRecord shards with a `manifest.json`.

use crate::formats::DocumentSink;
pub use crate::preparation::Preparation;
use crate::tfrecord::RecordWriter;
use crate::tokenizer::TextTokenizer;
use crate::{DataError, Result};
use lazytrain_storage::StorageUrl;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Options for [`prepare`].
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// Tokens per block.
    pub block_size: usize,
    /// Training shards.
    pub num_shards: usize,
    /// Fraction of blocks held out for validation (chosen by seed).
    pub validation_fraction: f64,
    /// Seed of the train/validation split.
    pub seed: u64,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// How documents become blocks.
    pub packing: Packing,
}

impl Default for PrepareOptions {
    /// 128-token blocks in 8 shards, 1 % held out, seed 42, no progress bar,
    /// `group_texts` packing (the CLI's defaults).
    fn default() -> PrepareOptions {
        PrepareOptions {
            block_size: 128,
            num_shards: 8,
            validation_fraction: 0.01,
            seed: 42,
            progress: false,
            packing: Packing::GroupTexts,
        }
    }
}

/// How tokenized documents are packed into fixed blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Packing {
    /// Hugging Face `run_mlm.py`'s `group_texts`: each document encoded
    /// with the tokenizer's special tokens (`<s> … </s>`, `[CLS] … [SEP]`;
    /// a GPT-2 document ends with `<|endoftext|>`), concatenated, cut into
    /// `block_size` pieces.
    #[default]
    GroupTexts,
    /// RoBERTa's pre-training stream (fairseq `--sample-break-mode none`):
    /// documents encoded without special tokens and joined by the end
    /// token, cut into `block_size - 2` pieces, each wrapped as
    /// `<s> piece </s>` (`[CLS] piece [SEP]`), so every block starts and
    /// ends like a sentence the model will see.
    Wrapped,
}

impl Packing {
    /// Parse `group-texts` or `wrapped`.
    pub fn parse(name: &str) -> Result<Packing> {
        match name {
            "group-texts" => Ok(Packing::GroupTexts),
            "wrapped" => Ok(Packing::Wrapped),
            other => Err(DataError::Invalid(format!("unknown packing `{other}`; choose group-texts or wrapped"))),
        }
    }
}

/// One shard file and its record count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name inside the output folder.
    pub file: String,
    /// Records (blocks) in it.
    pub records: u64,
}

/// What `prepare` wrote, saved as `manifest.json` beside the shards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Tokens per block.
    pub block_size: usize,
    /// Training shards.
    pub train: Vec<ShardInfo>,
    /// Validation shards.
    pub validation: Vec<ShardInfo>,
    /// Masked CRC32C of the tokenizer's `tokenizer.json`, hex.
    pub tokenizer_hash: String,
    /// The tokenizer's vocabulary size.
    pub vocab_size: usize,
    /// Seed of the split.
    pub seed: u64,
    /// Documents read.
    pub documents: u64,
    /// Tokens after concatenation (special tokens included).
    pub tokens: u64,
    /// Tokens dropped as the final partial block.
    pub dropped_tokens: u64,
    /// How the blocks were packed (absent in older manifests: `group-texts`).
    #[serde(default)]
    pub packing: Packing,
}

impl Manifest {
    /// Read `manifest.json` from a prepared folder.
    pub fn read(dir: &Path) -> Result<Manifest> {
        Manifest::read_url(&StorageUrl::Local(dir.to_path_buf()))
    }

    /// Read `manifest.json` from a prepared folder or bucket prefix.
    pub fn read_url(dir: &StorageUrl) -> Result<Manifest> {
        read_manifest(
            dir,
            None,
            "lazytrain prepare",
            "this folder holds labelled data from `prepare-classification`, not masked-LM blocks; train it with --task sequence-classification",
        )
    }

    /// Training records in all shards.
    pub fn train_records(&self) -> u64 {
        self.train.iter().map(|s| s.records).sum()
    }
}

/// The longest block [`prepare`] packs: far beyond any model's positions,
/// small enough that a block's buffer is always allocated.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// Concatenate token sequences and cut the stream into `block_size`
/// blocks; the final partial block is dropped (HF `group_texts`). Returns
/// the blocks and the number of dropped tokens.
pub fn pack_blocks(sequences: &[Vec<u32>], block_size: usize) -> (Vec<Vec<u32>>, usize) {
    let mut blocks = Vec::new();
    let mut current = Vec::with_capacity(block_size);
    for seq in sequences {
        for &t in seq {
            current.push(t);
            if current.len() == block_size {
                blocks.push(std::mem::replace(&mut current, Vec::with_capacity(block_size)));
            }
        }
    }
    (blocks, current.len())
}

/// A progress bar of `len` steps drawn with the indicatif `template` (or a
/// hidden one when `enabled` is false), shared by `prepare` and the Trainer.
pub fn progress_bar(len: u64, enabled: bool, template: &str) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Tokenize `documents` (in parallel; a GPT-2 tokenizer's documents each
/// end with `<|endoftext|>`), pack, split and write shards into `out_dir`;
/// returns the manifest (also written as `manifest.json`).
pub fn prepare(
    tokenizer: &TextTokenizer,
    documents: &[String],
    out_dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest> {
    prepare_with_validation(tokenizer, documents, &[], out_dir, options)
}

/// [`prepare`] with held-out documents: `validation_documents` are packed
/// on their own and every one of their blocks is a validation block (HF's
/// `--validation_file`), besides the `validation_fraction` of the training
/// blocks (usually 0 then). The documents stream through a
/// [`Preparation`], which the CLI feeds from its readers directly.
pub fn prepare_with_validation(
    tokenizer: &TextTokenizer,
    documents: &[String],
    validation_documents: &[String],
    out_dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest> {
    let mut preparation = Preparation::new(tokenizer, out_dir, options, !validation_documents.is_empty())?;
    for document in documents {
        preparation.document(document)?;
    }
    if !validation_documents.is_empty() {
        preparation.held_out()?;
        for document in validation_documents {
            preparation.document(document)?;
        }
    }
    preparation.finish()
}

/// [`Packing::Wrapped`]: join `sequences` with `end`, cut the stream into
/// `block_size - 2` pieces and wrap each as `start piece end`; the final
/// partial piece is dropped. Returns the blocks and the dropped tokens.
pub fn pack_wrapped(sequences: &[Vec<u32>], block_size: usize, start: u32, end: u32) -> (Vec<Vec<u32>>, usize) {
    let separated: Vec<Vec<u32>> = sequences
        .iter()
        .enumerate()
        .map(|(i, seq)| (i > 0).then_some(end).into_iter().chain(seq.iter().copied()).collect())
        .collect();
    let (pieces, dropped) = pack_blocks(&separated, block_size - 2);
    let blocks = pieces.into_iter().map(|piece| std::iter::once(start).chain(piece).chain([end]).collect()).collect();
    (blocks, dropped)
}

/// Remove the shards of an earlier preparation from `out_dir` (files named
/// like [`shard_writers`]' output, and their index sidecars), so a folder
/// never mixes two of them.
pub(crate) fn remove_shards(out_dir: &Path) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| DataError::Io { path: p.display().to_string(), detail: e.to_string() };
    for entry in std::fs::read_dir(out_dir).map_err(|e| io(out_dir, e))? {
        let path = entry.map_err(|e| io(out_dir, e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let shard = name.strip_suffix(".idx").unwrap_or(&name);
        let ours = ["train", "validation"].iter().any(|split| shard_position(shard, split).is_some());
        if ours && path.is_file() {
            std::fs::remove_file(&path).map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

/// `(i, n)` of a shard file named `{split}-{i:05}-of-{n:05}.tfrecord`.
pub(crate) fn shard_position(name: &str, split: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix(split)?.strip_prefix('-')?.strip_suffix(".tfrecord")?;
    let (i, n) = rest.split_once("-of-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(i) && digits(n)) {
        return None;
    }
    Some((i.parse().ok()?, n.parse().ok()?))
}

/// Read `manifest.json` in `dir` (a folder or bucket prefix), written by
/// `command`, whose `task` field must be `task` (absent for masked-LM
/// blocks); a folder of the other kind is refused with `mismatch`.
pub(crate) fn read_manifest<T: serde::de::DeserializeOwned>(
    dir: &StorageUrl,
    task: Option<&str>,
    command: &str,
    mismatch: &str,
) -> Result<T> {
    let url = dir.join("manifest.json");
    let io = |detail: String| DataError::Io { path: url.to_string(), detail };
    let bytes = match lazytrain_storage::read(&url) {
        Ok(bytes) => bytes,
        Err(lazytrain_storage::StorageError::NotFound { .. }) => {
            return Err(io(format!("cannot read the manifest (no such file); run `{command}` first")))
        }
        Err(lazytrain_storage::StorageError::Other { detail, .. }) => {
            return Err(io(format!("cannot read the manifest ({detail}); run `{command}` first")))
        }
        Err(e) => return Err(e.into()),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| io(e.to_string()))?;
    if value.get("task").and_then(serde_json::Value::as_str) != task {
        return Err(io(mismatch.to_string()));
    }
    serde_json::from_value(value).map_err(|e| io(e.to_string()))
}

/// The most shards a split is written into: every shard is an open file
/// while the split is written (TensorFlow's largest public datasets use
/// 1024).
pub const MAX_SHARDS: usize = 1024;

/// Refuse an output path that is a file (the shards go into a folder).
pub(crate) fn check_output_folder(out_dir: &Path) -> Result<()> {
    lazytrain_core::check_output_folder("--output", out_dir, "the shards and manifest.json")
        .map_err(|e| DataError::Invalid(e.to_string()))
}

/// Check the split settings `prepare` and `prepare-classification` share,
/// each named by its flag.
pub(crate) fn check_split_options(num_shards: usize, validation_fraction: f64) -> Result<()> {
    if !(1..=MAX_SHARDS).contains(&num_shards) {
        return Err(DataError::Invalid(format!(
            "--num-shards {num_shards} must be in 1..={MAX_SHARDS} (each shard is an open file while it is written)"
        )));
    }
    if !(0.0..1.0).contains(&validation_fraction) {
        return Err(DataError::Invalid(format!(
            "--validation-fraction {validation_fraction} must be in [0, 1) (the share of the data held out; 0 \
             holds out none)"
        )));
    }
    Ok(())
}

/// `n` shard writers `{split}-{i:05}-of-{n:05}.tfrecord` in `out_dir`.
pub(crate) fn shard_writers(out_dir: &Path, split: &str, n: usize) -> Result<Vec<(String, RecordWriter)>> {
    (0..n)
        .map(|i| {
            let file = format!("{split}-{i:05}-of-{n:05}.tfrecord");
            RecordWriter::create_indexed(&out_dir.join(&file)).map(|w| (file, w))
        })
        .collect()
}

/// Close shard writers, returning each file's record count.
pub(crate) fn finish_shards(writers: Vec<(String, RecordWriter)>) -> Result<Vec<ShardInfo>> {
    writers.into_iter().map(|(file, w)| w.finish_with_index().map(|records| ShardInfo { file, records })).collect()
}

/// The hash that ties prepared data to the tokenizer that made it
/// ([`TextTokenizer::content_hash`]).
pub(crate) fn tokenizer_hash(tokenizer: &TextTokenizer) -> Result<String> {
    tokenizer.content_hash()
}

/// Write `value` as pretty JSON to `path`.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| DataError::Invalid(e.to_string()))?;
    lazytrain_core::atomic_file::write_atomically(path, text.as_bytes())
        .map_err(|e| DataError::Io { path: path.display().to_string(), detail: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_follows_group_texts() {
        let (blocks, dropped) = pack_blocks(&[vec![9, 1, 2, 3, 8], vec![9, 4, 5, 8], vec![9, 6, 8]], 4);
        assert_eq!(blocks, vec![vec![9, 1, 2, 3], vec![8, 9, 4, 5], vec![8, 9, 6, 8]]);
        assert_eq!(dropped, 0);
    }

    #[test]
    fn packing_names_parse_and_a_wrong_one_lists_the_choices() {
        assert_eq!(Packing::parse("group-texts").unwrap(), Packing::GroupTexts);
        assert_eq!(Packing::parse("wrapped").unwrap(), Packing::Wrapped);
        let e = Packing::parse("fairseq").unwrap_err().to_string();
        assert!(e.contains("`fairseq`") && e.contains("group-texts or wrapped"), "{e}");
        // Manifests written before packing was recorded read as group_texts.
        let old: Manifest = serde_json::from_str(
            r#"{"block_size": 8, "train": [], "validation": [], "tokenizer_hash": "0", "vocab_size": 9,
                "seed": 1, "documents": 2, "tokens": 16, "dropped_tokens": 0}"#,
        )
        .unwrap();
        assert_eq!(old.packing, Packing::GroupTexts);
    }

    #[test]
    fn wrapped_packing_joins_documents_with_the_end_token() {
        // start 0, end 2: the stream 1 3 5 | 2 | 6 7 | 2 | 8 9 11 12 cut into 3-token pieces.
        let (blocks, dropped) = pack_wrapped(&[vec![1, 3, 5], vec![6, 7], vec![8, 9, 11, 12]], 5, 0, 2);
        assert_eq!(blocks, vec![vec![0, 1, 3, 5, 2], vec![0, 2, 6, 7, 2], vec![0, 2, 8, 9, 2]]);
        assert_eq!(dropped, 2);
        let (blocks, dropped) = pack_wrapped(&[vec![1, 3]], 5, 0, 2);
        assert!(blocks.is_empty());
        assert_eq!(dropped, 2);
    }
}
