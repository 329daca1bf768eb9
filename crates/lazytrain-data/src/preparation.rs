//! `prepare` as a stream: documents are tokenized in batches as the readers
//! give them, packed into blocks, split and written to shards at once, so
//! memory stays bounded by a batch of documents however large the corpus
//! (a whole corpus in memory took about four times its size).
//!
//! The shards are written into a [`PartialFolder`] inside the output and
//! moved into place only when the preparation is complete: an error or a
//! kill on the way leaves an earlier preparation in the folder as it was.

use crate::block_split::{BlockSink, Splitter};
use crate::document_batch::DocumentBatch;
use crate::example::encode_int64_example;
use crate::formats::DocumentSink;
use crate::long_documents::{self, PIECE_BYTES};
use crate::partial_folder::PartialFolder;
use crate::prepare::{
    check_output_folder, check_split_options, finish_shards, shard_writers, tokenizer_hash, write_json, Manifest,
    Packing, PrepareOptions, MAX_BLOCK_SIZE,
};
use crate::tfrecord::RecordWriter;
use crate::tokenizer::TextTokenizer;
use crate::{DataError, Result};
use std::path::Path;

/// Bytes of text tokenized together at most (the tokenizer spreads a batch
/// over the cores).
const BATCH_BYTES: usize = 4 << 20;

/// A preparation under way: give it the training documents (it is a
/// [`DocumentSink`]), then, after [`Preparation::held_out`], the held-out
/// validation documents, and [`Preparation::finish`] it.
pub struct Preparation<'t> {
    tokenizer: &'t TextTokenizer,
    options: PrepareOptions,
    /// Documents waiting to be tokenized.
    pending: DocumentBatch,
    /// Whether a document too long to tokenize at once may be tokenized
    /// in pieces with this tokenizer ([`long_documents::cuts_are_exact`]).
    pieces_are_exact: bool,
    packer: Packer,
    splitter: Splitter,
    shards: Shards,
    /// Whether held-out documents were announced, and whether they are
    /// being given (after [`Preparation::held_out`]).
    held_out_announced: bool,
    holding_out: bool,
    /// Blocks packed from the training and from the held-out documents.
    training_blocks: u64,
    held_out_blocks: u64,
    documents: u64,
    null_rows: u64,
    dropped: u64,
    /// Cuts inside a word of documents tokenized in pieces.
    cuts_inside_words: u64,
    bar: indicatif::ProgressBar,
    /// Last, so that the shard files above are closed before it is removed.
    partial: PartialFolder,
}

impl<'t> Preparation<'t> {
    /// Start a preparation into `out_dir` (created when missing); when
    /// `held_out_documents` is set, documents given after
    /// [`Preparation::held_out`] are all validation blocks (HF's
    /// `--validation_file`), besides `options.validation_fraction` of the
    /// training blocks.
    pub fn new(
        tokenizer: &'t TextTokenizer,
        out_dir: &Path,
        options: &PrepareOptions,
        held_out_documents: bool,
    ) -> Result<Preparation<'t>> {
        let min_block = match options.packing {
            Packing::GroupTexts => 2,
            Packing::Wrapped => 3,
        };
        if !(min_block..=MAX_BLOCK_SIZE).contains(&options.block_size) {
            return Err(DataError::Invalid(format!(
                "--block-size {} must be in {min_block}..={MAX_BLOCK_SIZE}",
                options.block_size
            )));
        }
        check_split_options(options.num_shards, options.validation_fraction)?;
        check_output_folder(out_dir)?;
        let partial = PartialFolder::create(out_dir)?;
        let validation_shards = usize::from(options.validation_fraction > 0.0 || held_out_documents);
        let special = tokenizer.special();
        Ok(Preparation {
            tokenizer,
            options: options.clone(),
            pending: DocumentBatch::new(BATCH_BYTES),
            pieces_are_exact: long_documents::cuts_are_exact(tokenizer.inner()),
            packer: Packer::new(options.packing, options.block_size, (special.start, special.end)),
            splitter: Splitter::new(options.validation_fraction, options.seed, partial.path().join("kept-back.bin")),
            shards: Shards {
                train: shard_writers(partial.path(), "train", options.num_shards)?,
                validation: shard_writers(partial.path(), "validation", validation_shards)?,
                train_written: 0,
            },
            held_out_announced: held_out_documents,
            holding_out: false,
            training_blocks: 0,
            held_out_blocks: 0,
            documents: 0,
            null_rows: 0,
            dropped: 0,
            cuts_inside_words: 0,
            bar: counting_bar(options.progress, "tokenizing"),
            partial,
        })
    }

    /// End the training documents: the documents given from now on are
    /// held-out validation documents, packed on their own (announced to
    /// [`Preparation::new`]).
    pub fn held_out(&mut self) -> Result<()> {
        if !self.held_out_announced || self.holding_out {
            return Err(DataError::Invalid(
                "held-out documents were not announced when the preparation began, or were begun twice (a bug in \
                 the caller)"
                    .into(),
            ));
        }
        self.end_training()?;
        self.holding_out = true;
        self.bar.finish_and_clear();
        self.bar = counting_bar(self.options.progress, "validation");
        Ok(())
    }

    /// Write the last blocks, move the shards into the output folder (in
    /// place of an earlier preparation's) and `manifest.json` last.
    pub fn finish(mut self) -> Result<Manifest> {
        if self.held_out_announced && !self.holding_out {
            self.held_out()?;
        }
        if self.holding_out {
            self.flush()?;
            self.dropped += self.packer.finish() as u64;
            if self.held_out_blocks == 0 {
                return Err(DataError::Invalid(format!(
                    "the validation files have {} tokens, fewer than one block of {}; add text or lower --block-size",
                    self.packer.dropped_in_stage, self.options.block_size
                )));
            }
        } else {
            self.end_training()?;
        }
        self.bar.finish_and_clear();
        if self.cuts_inside_words > 0 {
            eprintln!("{}", long_documents::cut_words_note(self.cuts_inside_words));
        }
        let train = finish_shards(std::mem::take(&mut self.shards.train))?;
        let validation = finish_shards(std::mem::take(&mut self.shards.validation))?;
        let blocks = self.training_blocks + self.held_out_blocks;
        let manifest = Manifest {
            block_size: self.options.block_size,
            train,
            validation,
            tokenizer_hash: tokenizer_hash(self.tokenizer)?,
            vocab_size: self.tokenizer.vocab_size(),
            seed: self.options.seed,
            documents: self.documents,
            tokens: blocks * self.options.block_size as u64 + self.dropped,
            dropped_tokens: self.dropped,
            packing: self.options.packing,
        };
        write_json(&self.partial.path().join("manifest.json"), &manifest)?;
        self.partial.publish(manifest.train.iter().chain(&manifest.validation), &["manifest.json"])?;
        Ok(manifest)
    }

    /// Tokenize the last training documents, check the blocks and write
    /// the blocks the split held back.
    fn end_training(&mut self) -> Result<()> {
        self.flush()?;
        let dropped = self.packer.finish();
        self.dropped += dropped as u64;
        if self.training_blocks == 0 {
            return Err(DataError::Invalid(format!(
                "the input has {dropped} tokens, fewer than one block of {}; add text or lower --block-size",
                self.options.block_size
            )));
        }
        self.splitter.finish(self.training_blocks, &mut self.shards)
    }

    /// Tokenize the pending documents, pack them and place their blocks.
    fn flush(&mut self) -> Result<()> {
        let batch = self.pending.take();
        if batch.is_empty() {
            return Ok(());
        }
        let count = batch.len() as u64;
        // Documents are tokenized together, but one too long to tokenize
        // at once on its own, in pieces.
        let mut together = Vec::new();
        for document in batch {
            if document.len() <= PIECE_BYTES || !self.pieces_are_exact {
                together.push(document);
                continue;
            }
            self.tokenize_together(std::mem::take(&mut together))?;
            self.tokenize_in_pieces(&document)?;
        }
        self.tokenize_together(together)?;
        self.bar.inc(count);
        Ok(())
    }

    /// Write `blocks` where the split places them.
    fn place(&mut self, blocks: Vec<Vec<u32>>) -> Result<()> {
        for block in blocks {
            match self.holding_out {
                true => {
                    self.held_out_blocks += 1;
                    self.shards.write(&block, true)?;
                }
                false => {
                    self.training_blocks += 1;
                    self.splitter.place(&block, &mut self.shards)?;
                }
            }
        }
        Ok(())
    }

    /// Whether documents are encoded with the tokenizer's special tokens,
    /// and the token that ends each (GPT-2's tokenizer adds no special
    /// tokens: each document ends with `<|endoftext|>`, as GPT-2's training
    /// text is laid out).
    fn document_tokens(&self) -> (bool, Option<u32>) {
        let special = self.tokenizer.special();
        let with_specials = self.options.packing == Packing::GroupTexts;
        (with_specials, (with_specials && special.style == crate::TokenizerStyle::Gpt2).then_some(special.end))
    }

    /// Tokenize `documents` in one batch, pack them and write their blocks.
    fn tokenize_together(&mut self, documents: Vec<String>) -> Result<()> {
        if documents.is_empty() {
            return Ok(());
        }
        let (with_specials, separator) = self.document_tokens();
        let encodings = self
            .tokenizer
            .inner()
            .encode_batch(documents, with_specials)
            .map_err(|e| DataError::Invalid(format!("tokenization failed: {e}")))?;
        let mut blocks = Vec::new();
        for encoding in &encodings {
            self.packer.push(encoding.get_ids().iter().copied().chain(separator), &mut blocks);
        }
        drop(encodings);
        self.place(blocks)
    }

    /// Tokenize a long `document` in pieces cut where words end, a few at
    /// a time, and pack it as one document, inside the special tokens the
    /// tokenizer puts around a text; its blocks are written as they fill.
    fn tokenize_in_pieces(&mut self, document: &str) -> Result<()> {
        let (with_specials, separator) = self.document_tokens();
        let (pieces, inside_words) = long_documents::pieces(document, PIECE_BYTES);
        self.cuts_inside_words += inside_words;
        let failed = |e: tokenizers::Error| DataError::Invalid(format!("tokenization failed: {e}"));
        let tokenizer: &'t TextTokenizer = self.tokenizer;
        let inner = tokenizer.inner();
        // The post-processor's tokens around one placeholder token.
        let placeholder = u32::MAX;
        let around =
            tokenizers::Encoding::from_tokens(vec![tokenizers::Token::new(placeholder, String::new(), (0, 0))], 0);
        let wrapped = inner.post_process(around, None, with_specials).map_err(failed)?.get_ids().to_vec();
        let at = wrapped.iter().position(|&id| id == placeholder).ok_or_else(|| {
            DataError::Invalid("tokenization failed: the post-processor dropped the text of a long document".into())
        })?;
        let mut blocks = Vec::new();
        self.packer.begin(&mut blocks);
        self.packer.extend(wrapped[..at].iter().copied(), &mut blocks);
        for few in pieces.chunks(rayon::current_num_threads().max(1)) {
            for encoding in inner.encode_batch(few.to_vec(), false).map_err(failed)? {
                self.packer.extend(encoding.get_ids().iter().copied(), &mut blocks);
            }
            self.place(std::mem::take(&mut blocks))?;
        }
        self.packer.extend(wrapped[at + 1..].iter().copied().chain(separator), &mut blocks);
        self.place(blocks)
    }
}

impl DocumentSink for Preparation<'_> {
    fn document(&mut self, text: &str) -> Result<()> {
        self.documents += 1;
        if self.pending.add(text) {
            self.flush()?;
        }
        Ok(())
    }

    fn null_row(&mut self) {
        self.null_rows += 1;
    }

    fn counts(&self) -> (u64, u64) {
        (self.documents, self.null_rows)
    }
}

/// The shard writers of one preparation.
struct Shards {
    train: Vec<(String, RecordWriter)>,
    validation: Vec<(String, RecordWriter)>,
    /// Training blocks written so far (they go to the shards in turn).
    train_written: usize,
}

impl BlockSink for Shards {
    fn write(&mut self, block: &[u32], validation: bool) -> Result<()> {
        let ids: Vec<i64> = block.iter().map(|&t| t as i64).collect();
        let ones = vec![1i64; block.len()];
        let record = encode_int64_example(&[("input_ids", &ids), ("attention_mask", &ones)]);
        if validation {
            return self.validation[0].1.write(&record);
        }
        let shard = self.train_written % self.train.len();
        self.train_written += 1;
        self.train[shard].1.write(&record)
    }
}

/// A spinner counting documents or rows (hidden when `enabled` is
/// false): the total is not known while the readers stream.
pub(crate) fn counting_bar(enabled: bool, what: &str) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg:>12} {spinner} {pos} ({per_sec})") {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    bar
}

/// Token sequences in, fixed blocks out, as [`Packing`] says: the stream
/// form of [`crate::prepare::pack_blocks`] and
/// [`crate::prepare::pack_wrapped`], with the same blocks.
struct Packer {
    /// Tokens of a block's body (`block_size`, or `block_size - 2` inside
    /// `start … end` when wrapped).
    body: usize,
    /// `(start, end)` when wrapped.
    wrap: Option<(u32, u32)>,
    /// The block being filled.
    current: Vec<u32>,
    /// Whether a sequence was packed yet (wrapped sequences are joined by
    /// `end`).
    started: bool,
    /// Tokens the last [`Packer::finish`] dropped.
    dropped_in_stage: usize,
}

impl Packer {
    fn new(packing: Packing, block_size: usize, (start, end): (u32, u32)) -> Packer {
        let (body, wrap) = match packing {
            Packing::GroupTexts => (block_size, None),
            Packing::Wrapped => (block_size - 2, Some((start, end))),
        };
        Packer { body, wrap, current: Vec::with_capacity(body), started: false, dropped_in_stage: 0 }
    }

    /// Pack one sequence, appending the blocks it completes to `blocks`.
    fn push(&mut self, sequence: impl Iterator<Item = u32>, blocks: &mut Vec<Vec<u32>>) {
        self.begin(blocks);
        self.extend(sequence, blocks);
    }

    /// Start a sequence (wrapped sequences are joined by `end`).
    fn begin(&mut self, blocks: &mut Vec<Vec<u32>>) {
        let joint = self.wrap.filter(|_| self.started).map(|(_, end)| end);
        self.started = true;
        self.extend(joint.into_iter(), blocks);
    }

    /// Add tokens to the sequence begun.
    fn extend(&mut self, tokens: impl Iterator<Item = u32>, blocks: &mut Vec<Vec<u32>>) {
        for token in tokens {
            self.current.push(token);
            if self.current.len() == self.body {
                let body = std::mem::replace(&mut self.current, Vec::with_capacity(self.body));
                blocks.push(match self.wrap {
                    Some((start, end)) => std::iter::once(start).chain(body).chain([end]).collect(),
                    None => body,
                });
            }
        }
    }

    /// End a stage (the training or the held-out documents): the partial
    /// block is dropped (HF's `group_texts`) and the next sequence starts a
    /// new stream. Returns the dropped tokens.
    fn finish(&mut self) -> usize {
        self.dropped_in_stage = self.current.len();
        self.current.clear();
        self.started = false;
        self.dropped_in_stage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::{pack_blocks, pack_wrapped};

    #[test]
    fn the_packer_makes_the_blocks_the_whole_corpus_packers_do() {
        let sequences: Vec<Vec<u32>> =
            (0..40u32).map(|i| (0..(i * 7) % 23).map(|t| 10 + i * 100 + t).collect()).collect();
        for block_size in [3, 8, 17, 128] {
            for packing in [Packing::GroupTexts, Packing::Wrapped] {
                let mut packer = Packer::new(packing, block_size, (1, 2));
                let mut blocks = Vec::new();
                for sequence in &sequences {
                    packer.push(sequence.iter().copied(), &mut blocks);
                }
                let dropped = packer.finish();
                let expected = match packing {
                    Packing::GroupTexts => pack_blocks(&sequences, block_size),
                    Packing::Wrapped => pack_wrapped(&sequences, block_size, 1, 2),
                };
                assert_eq!((blocks, dropped), expected, "{packing:?}, block size {block_size}");
            }
        }
    }
}
