//! `prepare` as a stream: documents are tokenized in batches as the readers
//! give them, packed into blocks, split and written to shards at once, so
//! memory stays bounded by a batch of documents however large the corpus
//! (a whole corpus in memory took about four times its size).
//!
//! The shards are written into a hidden folder inside the output and moved
//! into place only when the preparation is complete: an error or a kill on
//! the way leaves an earlier preparation in the folder as it was.

use crate::example::encode_int64_example;
use crate::formats::DocumentSink;
use crate::long_documents::{self, PIECE_BYTES};
use crate::prepare::{
    check_output_folder, check_split_options, finish_shards, remove_shards, shard_writers, tokenizer_hash, write_json,
    Manifest, Packing, PrepareOptions, ShardInfo, MAX_BLOCK_SIZE,
};
use crate::tfrecord::RecordWriter;
use crate::tokenizer::TextTokenizer;
use crate::{DataError, Result};
use std::path::{Path, PathBuf};

/// Documents tokenized together (the tokenizer spreads a batch over the
/// cores), unless [`BATCH_BYTES`] of text come first.
const BATCH_DOCUMENTS: usize = 4096;

/// Bytes of text tokenized together at most (besides one document that is
/// longer on its own).
const BATCH_BYTES: usize = 4 << 20;

/// The folder inside the output that shards are written into until the
/// preparation is complete.
const PARTIAL_FOLDER: &str = ".prepare-partial";

/// A preparation under way: give it the training documents (it is a
/// [`DocumentSink`]), then, after [`Preparation::held_out`], the held-out
/// validation documents, and [`Preparation::finish`] it.
pub struct Preparation<'t> {
    tokenizer: &'t TextTokenizer,
    options: PrepareOptions,
    out_dir: PathBuf,
    partial: PartialFolder,
    /// Documents waiting to be tokenized, and their bytes.
    pending: Vec<String>,
    pending_bytes: usize,
    packer: Packer,
    splitter: Splitter,
    train: Vec<(String, RecordWriter)>,
    validation: Vec<(String, RecordWriter)>,
    /// Training blocks written so far (they go to the shards in turn).
    train_written: usize,
    /// False until [`Preparation::held_out`].
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
            out_dir: out_dir.to_path_buf(),
            train: shard_writers(partial.path(), "train", options.num_shards)?,
            validation: shard_writers(partial.path(), "validation", validation_shards)?,
            partial,
            pending: Vec::new(),
            pending_bytes: 0,
            packer: Packer::new(options.packing, options.block_size, (special.start, special.end)),
            splitter: Splitter::new(options.validation_fraction, options.seed),
            train_written: 0,
            holding_out: false,
            training_blocks: 0,
            held_out_blocks: 0,
            documents: 0,
            null_rows: 0,
            dropped: 0,
            cuts_inside_words: 0,
            bar: counting_bar(options.progress, "tokenizing"),
        })
    }

    /// End the training documents: the documents given from now on are
    /// held-out validation documents, packed on their own.
    pub fn held_out(&mut self) -> Result<()> {
        self.end_training()?;
        self.holding_out = true;
        self.bar.finish_and_clear();
        self.bar = counting_bar(self.options.progress, "validation");
        Ok(())
    }

    /// Write the last blocks, move the shards into the output folder (in
    /// place of an earlier preparation's) and write `manifest.json`.
    pub fn finish(mut self) -> Result<Manifest> {
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
        let train = finish_shards(std::mem::take(&mut self.train))?;
        let validation = finish_shards(std::mem::take(&mut self.validation))?;
        self.partial.move_into_place(&self.out_dir, train.iter().chain(&validation))?;
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
        write_json(&self.out_dir.join("manifest.json"), &manifest)?;
        Ok(manifest)
    }

    /// Rows with a null text the readers skipped.
    pub fn null_rows(&self) -> u64 {
        self.null_rows
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
        for (block, validation) in self.splitter.finish(self.training_blocks)? {
            self.write(&block, validation)?;
        }
        Ok(())
    }

    /// Tokenize the pending documents, pack them and place their blocks.
    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        let count = batch.len() as u64;
        self.pending_bytes = 0;
        // Documents are tokenized together, but one too long to tokenize
        // at once on its own, in pieces.
        let mut together = Vec::new();
        for document in batch {
            if document.len() <= PIECE_BYTES {
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
                    self.write(&block, true)?;
                }
                false => {
                    self.training_blocks += 1;
                    for (block, validation) in self.splitter.place(block) {
                        self.write(&block, validation)?;
                    }
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

    /// Write `block` to the validation shard or the next training shard.
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

impl DocumentSink for Preparation<'_> {
    fn document(&mut self, text: &str) -> Result<()> {
        self.documents += 1;
        self.pending_bytes += text.len();
        self.pending.push(text.to_string());
        if self.pending.len() >= BATCH_DOCUMENTS || self.pending_bytes >= BATCH_BYTES {
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

/// The folder inside an output folder that shards are written into until
/// they are complete, removed with whatever is left in it when dropped
/// (after an error, or after the shards were moved out). `prepare` and
/// `prepare-classification` both write through one.
pub(crate) struct PartialFolder(PathBuf);

impl PartialFolder {
    /// Create the folder in `out_dir`, empty (a killed run's leftovers are
    /// removed first).
    pub(crate) fn create(out_dir: &Path) -> Result<PartialFolder> {
        let path = out_dir.join(PARTIAL_FOLDER);
        let io = |e: std::io::Error| DataError::Io { path: path.display().to_string(), detail: e.to_string() };
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        std::fs::create_dir_all(&path).map_err(io)?;
        Ok(PartialFolder(path))
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Replace an earlier preparation's manifest and shards in `out_dir`
    /// with the finished `shards` (and their index sidecars) from here.
    pub(crate) fn move_into_place<'s>(
        &self,
        out_dir: &Path,
        shards: impl Iterator<Item = &'s ShardInfo>,
    ) -> Result<()> {
        let io = |p: &Path, e: std::io::Error| DataError::Io { path: p.display().to_string(), detail: e.to_string() };
        let manifest = out_dir.join("manifest.json");
        match std::fs::remove_file(&manifest) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&manifest, e)),
            _ => {}
        }
        remove_shards(out_dir)?;
        for shard in shards {
            for name in [shard.file.clone(), format!("{}.idx", shard.file)] {
                let (from, to) = (self.0.join(&name), out_dir.join(&name));
                std::fs::rename(&from, &to).map_err(|e| io(&to, e))?;
            }
        }
        Ok(())
    }
}

impl Drop for PartialFolder {
    fn drop(&mut self) {
        // Nothing to report here: a folder left behind is removed by the
        // next preparation into the same output.
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// The seeded train/validation split of the training blocks: block `i`
/// is held out when draw `i` of the seed's uniform stream is below the
/// fraction; when that holds out none (or all), the block with the lowest
/// (highest) draw goes to validation (training), so neither side is empty.
/// Those two candidates are kept back until every block is known; every
/// other block is placed at once.
struct Splitter {
    fraction: f64,
    seed: u64,
    /// Blocks seen.
    next: u64,
    /// The blocks kept back: `(index, draw, block)`.
    kept_back: Vec<(u64, f32, Vec<u32>)>,
    /// The blocks with the lowest draw (the first of equals) and the
    /// highest (the last of equals) so far: `(index, draw)`.
    lowest: Option<(u64, f32)>,
    highest: Option<(u64, f32)>,
    /// Whether some block was held out (kept for training) by its draw.
    any_held_out: bool,
    any_trained: bool,
}

impl Splitter {
    fn new(fraction: f64, seed: u64) -> Splitter {
        Splitter {
            fraction,
            seed,
            next: 0,
            kept_back: Vec::new(),
            lowest: None,
            highest: None,
            any_held_out: false,
            any_trained: false,
        }
    }

    /// Whether `draw` holds its block out.
    fn holds_out(&self, draw: f32) -> bool {
        (draw as f64) < self.fraction
    }

    /// Place the next block: the blocks that can be written now, each with
    /// whether it is a validation block.
    fn place(&mut self, block: Vec<u32>) -> Vec<(Vec<u32>, bool)> {
        if self.fraction <= 0.0 {
            return vec![(block, false)];
        }
        let index = self.next;
        self.next += 1;
        let mut draw = [0f32];
        lazytrain_core::random::uniform_f32_from(self.seed, 0x5eed, index as usize, &mut draw);
        let draw = draw[0];
        match self.holds_out(draw) {
            true => self.any_held_out = true,
            false => self.any_trained = true,
        }
        if self.lowest.is_none_or(|(_, low)| draw < low) {
            self.lowest = Some((index, draw));
        }
        if self.highest.is_none_or(|(_, high)| draw >= high) {
            self.highest = Some((index, draw));
        }
        self.kept_back.push((index, draw, block));
        let candidate = |i: u64| [self.lowest, self.highest].iter().flatten().any(|&(c, _)| c == i);
        let (still, placed): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.kept_back).into_iter().partition(|(i, _, _)| candidate(*i));
        self.kept_back = still;
        placed.into_iter().map(|(_, draw, block)| (block, self.holds_out(draw))).collect()
    }

    /// The blocks kept back, placed now that all `blocks` are known.
    fn finish(&mut self, blocks: u64) -> Result<Vec<(Vec<u32>, bool)>> {
        if self.fraction <= 0.0 {
            return Ok(Vec::new());
        }
        if blocks < 2 {
            return Err(DataError::Invalid(format!(
                "the input packs into {blocks} block(s), too few to hold out validation data; add text, lower \
                 --block-size, or pass --validation-fraction 0"
            )));
        }
        let lowest = self.lowest.map(|(i, _)| i);
        let highest = self.highest.map(|(i, _)| i);
        let placed = std::mem::take(&mut self.kept_back).into_iter().map(|(index, draw, block)| {
            // The lowest draw goes to validation when no block did, the
            // highest to training when every block was held out.
            let validation = match self.holds_out(draw) {
                false => Some(index) == lowest && !self.any_held_out,
                true => Some(index) != highest || self.any_trained,
            };
            (block, validation)
        });
        Ok(placed.collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::{pack_blocks, pack_wrapped};

    /// The split of `blocks` blocks the whole-corpus rule makes: every draw
    /// at once, the lowest (highest) flipped when no block (every block)
    /// is held out.
    fn whole_corpus_split(blocks: usize, fraction: f64, seed: u64) -> Vec<bool> {
        let mut draws = vec![0f32; blocks];
        lazytrain_core::random::uniform_f32(seed, 0x5eed, &mut draws);
        let mut held_out: Vec<bool> = draws.iter().map(|&u| (u as f64) < fraction).collect();
        let by_draw = |a: &(usize, &f32), b: &(usize, &f32)| a.1.total_cmp(b.1);
        if !held_out.contains(&true) {
            held_out[draws.iter().enumerate().min_by(by_draw).unwrap().0] = true;
        }
        if !held_out.contains(&false) {
            held_out[draws.iter().enumerate().max_by(by_draw).unwrap().0] = false;
        }
        held_out
    }

    #[test]
    fn the_streamed_split_holds_out_the_blocks_the_whole_corpus_rule_does() {
        for (blocks, fraction, seed) in
            [(2, 0.01, 0), (2, 0.99, 1), (3, 0.5, 7), (50, 0.01, 42), (200, 0.1, 3), (97, 0.999, 5), (40, 1e-9, 9)]
        {
            let expected = whole_corpus_split(blocks, fraction, seed);
            let mut splitter = Splitter::new(fraction, seed);
            // Each block is its index, so the placement says which it was.
            let mut placed: Vec<(Vec<u32>, bool)> = Vec::new();
            for i in 0..blocks {
                placed.extend(splitter.place(vec![i as u32]));
            }
            placed.extend(splitter.finish(blocks as u64).unwrap());
            let mut got = vec![None; blocks];
            for (block, validation) in placed {
                assert!(got[block[0] as usize].replace(validation).is_none(), "block {} placed twice", block[0]);
            }
            let got: Vec<bool> = got.into_iter().map(|g| g.expect("every block placed")).collect();
            assert_eq!(got, expected, "{blocks} blocks, fraction {fraction}, seed {seed}");
        }
        let mut one = Splitter::new(0.5, 0);
        one.place(vec![0]);
        assert!(one.finish(1).unwrap_err().to_string().contains("1 block(s), too few"));
    }

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
