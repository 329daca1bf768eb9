//! Subword training that learns the same vocabulary in every process.
//!
//! `tokenizers`' `Tokenizer::train` counts words into hash maps seeded at
//! random per process and walks them in that order: WordPiece then numbers
//! its `##` continuations (and so breaks merge ties) differently from run to
//! run (huggingface/tokenizers#1794); the unigram trainer's EM sums floats
//! in that order, split over threads by work stealing, and it scores the
//! characters it adds back in a hash-set order. Each changes the vocabulary
//! and every loss trained on it. Here the words are counted in parallel
//! (integer sums, order-free), sorted, and handed to the trainers' own
//! `do_train` in that order: BPE and WordPiece through a hash map with
//! fixed seeds filled in sorted order, unigram's EM on one thread, its
//! result then put in a canonical order ([`canonical_pieces`]).

use crate::document_batch::DocumentBatch;
use crate::formats::DocumentSink;
use crate::long_documents::{self, PIECE_BYTES};
use crate::train_tokenizer::train_error;
use crate::{DataError, Result};
use ahash::{AHashMap, RandomState};
use compact_str::CompactString;
use rayon::prelude::*;
use std::collections::HashMap;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::unigram::{Unigram, UnigramTrainer};
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

/// How often each pre-tokenized word occurs in the documents, sorted by word.
pub(crate) type WordCounts = Vec<(String, u64)>;

/// Fixed seeds for the hash map the BPE trainer walks: its iteration order
/// then depends only on the (sorted) insertion order.
const WORD_MAP_SEEDS: [u64; 4] = [0x6c61_7a79, 0x7472_6169, 0x6e5f_7365, 0x6564_7321];

/// The longest word (a pre-tokenizer's split, in bytes) that tokenizer
/// training counts. Longer ones — base64 blobs, binary data read as text —
/// are left out: the trainers' work grows with the square of a word's length
/// and the unigram trainer's recursion overflowed the stack on an 80 KB word.
/// SentencePiece skips sentences over 4192 bytes for the same reason.
pub const MAX_TRAINING_WORD_BYTES: usize = 4096;

/// Bytes of text counted together at most (the counting spreads a batch
/// over the cores).
const BATCH_BYTES: usize = 16 << 20;

/// Counts the words of documents as they are given (it is a
/// [`DocumentSink`]), in batches: each document normalised and
/// pre-tokenized with the tokenizer's own normaliser and pre-tokenizer (as
/// `Tokenizer::train` does before any token is added). Memory holds the
/// distinct words, not the text. Words longer than
/// [`MAX_TRAINING_WORD_BYTES`] are left out, said in a note.
pub(crate) struct WordCounter {
    tokenizer: Tokenizer,
    pending: DocumentBatch,
    counts: HashMap<String, u64>,
    too_long: u64,
    /// Cuts inside a word of documents counted in pieces.
    cuts_inside_words: u64,
    documents: u64,
    null_rows: u64,
}

impl WordCounter {
    /// Count words as `tokenizer` cuts them.
    pub(crate) fn new(tokenizer: Tokenizer) -> WordCounter {
        WordCounter {
            tokenizer,
            pending: DocumentBatch::new(BATCH_BYTES),
            counts: HashMap::new(),
            too_long: 0,
            cuts_inside_words: 0,
            documents: 0,
            null_rows: 0,
        }
    }

    /// The tokenizer and the counts of every word given, sorted by word.
    pub(crate) fn finish(mut self) -> Result<(Tokenizer, WordCounts)> {
        self.count_pending()?;
        if self.cuts_inside_words > 0 {
            eprintln!("{}", long_documents::cut_words_note(self.cuts_inside_words));
        }
        if self.too_long > 0 {
            eprintln!(
                "note: left {} word(s) longer than {MAX_TRAINING_WORD_BYTES} bytes out of tokenizer training \
                 (base64 or binary data in the text?)",
                self.too_long
            );
        }
        let mut sorted: WordCounts = self.counts.into_iter().collect();
        sorted.sort_unstable();
        Ok((self.tokenizer, sorted))
    }

    /// Count the pending documents' words in parallel (integer sums: the
    /// counts do not depend on how the work was split).
    fn count_pending(&mut self) -> Result<()> {
        let tokenizer = &self.tokenizer;
        let words_of = |document: &String| -> Result<Vec<String>> {
            let mut normalized = document.as_str().into();
            if let Some(normalizer) = tokenizer.get_normalizer() {
                normalizer.normalize(&mut normalized).map_err(train_error)?;
            }
            let mut pre_tokenized = PreTokenizedString::from(normalized);
            if let Some(pre_tokenizer) = tokenizer.get_pre_tokenizer() {
                pre_tokenizer.pre_tokenize(&mut pre_tokenized).map_err(train_error)?;
            }
            Ok(pre_tokenized
                .get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(word, _, _)| word.to_owned())
                .collect())
        };
        let (counts, too_long) = self
            .pending
            .take()
            .par_iter()
            .try_fold(
                || (HashMap::<String, u64>::new(), 0u64),
                |(mut counts, mut too_long), document| {
                    for word in words_of(document)? {
                        match word.len() > MAX_TRAINING_WORD_BYTES {
                            true => too_long += 1,
                            false => *counts.entry(word).or_default() += 1,
                        }
                    }
                    Ok::<_, DataError>((counts, too_long))
                },
            )
            .try_reduce(
                || (HashMap::new(), 0),
                |(mut total, too_long), (part, part_too_long)| {
                    for (word, count) in part {
                        *total.entry(word).or_default() += count;
                    }
                    Ok((total, too_long + part_too_long))
                },
            )?;
        for (word, count) in counts {
            *self.counts.entry(word).or_default() += count;
        }
        self.too_long += too_long;
        Ok(())
    }
}

impl DocumentSink for WordCounter {
    fn document(&mut self, text: &str) -> Result<()> {
        self.documents += 1;
        // A long document is counted in pieces cut where words end (see
        // `long_documents`), which hold the same words.
        let (pieces, inside_words) = long_documents::pieces(text, PIECE_BYTES);
        self.cuts_inside_words += inside_words;
        for piece in pieces {
            if self.pending.add(piece) {
                self.count_pending()?;
            }
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

/// Run `trainer` (byte-level BPE, or WordPiece's BPE with `##`
/// continuations) on `words`, which it walks in their sorted order.
fn train_bpe(trainer: &BpeTrainer, words: &WordCounts) -> Result<BPE> {
    let mut word_map: AHashMap<CompactString, u64> = AHashMap::with_hasher(RandomState::with_seeds(
        WORD_MAP_SEEDS[0],
        WORD_MAP_SEEDS[1],
        WORD_MAP_SEEDS[2],
        WORD_MAP_SEEDS[3],
    ));
    word_map.extend(words.iter().map(|(word, count)| (CompactString::from(word.as_str()), *count)));
    let mut bpe = BPE::default();
    trainer.do_train(&word_map, &mut bpe).map_err(train_error)?;
    Ok(bpe)
}

/// Byte-level BPE: `vocab_size` tokens, `specials` first, every byte in the
/// alphabet.
pub(crate) fn train_byte_level_bpe(
    words: &WordCounts,
    vocab_size: usize,
    specials: &[AddedToken],
) -> Result<ModelWrapper> {
    let trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .special_tokens(specials.to_vec())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .show_progress(false)
        .build();
    Ok(train_bpe(&trainer, words)?.into())
}

/// WordPiece as `WordPieceTrainer` trains it: BPE with `##` continuations,
/// read back as a WordPiece vocabulary with `unk` for unknown words.
pub(crate) fn train_wordpiece(
    words: &WordCounts,
    vocab_size: usize,
    specials: &[AddedToken],
    unk: &str,
) -> Result<ModelWrapper> {
    let prefix = "##";
    let trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .special_tokens(specials.to_vec())
        .continuing_subword_prefix(prefix.to_string())
        .show_progress(false)
        .build();
    let bpe = train_bpe(&trainer, words)?;
    let vocab: AHashMap<String, u32> = tokenizers::Model::get_vocab(&bpe).into_iter().collect();
    let wordpiece = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk.to_string())
        .continuing_subword_prefix(prefix.to_string())
        .build()
        .map_err(train_error)?;
    Ok(wordpiece.into())
}

/// A SentencePiece-style unigram LM of about `vocab_size` pieces. The EM
/// runs on one thread: its float sums then happen in one order whatever the
/// machine's core count.
pub(crate) fn train_unigram(
    words: &WordCounts,
    vocab_size: usize,
    specials: &[AddedToken],
    unk: &str,
) -> Result<ModelWrapper> {
    let trainer = UnigramTrainer::builder()
        .vocab_size(vocab_size as u32)
        .special_tokens(specials.to_vec())
        .unk_token(Some(unk.to_string()))
        .show_progress(false)
        .build()
        .map_err(train_error)?;
    let sentences = words
        .iter()
        .map(|(word, count)| {
            let count = u32::try_from(*count).map_err(|_| {
                DataError::Invalid(format!(
                    "the word `{word}` occurs {count} times, more than the unigram trainer counts (2^32 - 1); \
                     train the tokenizer on a sample of the text"
                ))
            })?;
            Ok((word.clone(), count))
        })
        .collect::<Result<Vec<_>>>()?;
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().map_err(train_error)?;
    let mut unigram = Unigram::default();
    one_thread.install(|| trainer.do_train(sentences, &mut unigram)).map_err(train_error)?;
    let specials_count = specials.len();
    let unk_id = specials.iter().position(|t| t.content == unk);
    let pieces = canonical_pieces(unigram.iter().cloned().collect(), specials_count);
    Ok(Unigram::from(pieces, unk_id, unigram.byte_fallback()).map_err(train_error)?.into())
}

/// The score step between the characters the unigram trainer adds back in
/// its last pass (every character of the text stays in the vocabulary):
/// those the model dropped come back with its lowest score plus 1e-4 per
/// character, numbered in a per-process hash-set order, and pieces of equal
/// score end up in that walk's order too.
const DROPPED_CHARACTER_STEP: f64 = 0.0001;

/// Put the trained pieces (after the `specials_count` special tokens) in
/// an order that does not depend on the trainer's hash sets: the
/// characters holding the dropped-character scores (the lowest score, then
/// +1e-4 at a time, as the trainer adds them) take those scores in
/// character order, and pieces are sorted by score, then by text.
fn canonical_pieces(mut pieces: Vec<(String, f64)>, specials_count: usize) -> Vec<(String, f64)> {
    let first_trained = specials_count.min(pieces.len());
    let trained = &mut pieces[first_trained..];
    let Some(lowest) = trained.iter().map(|(_, score)| *score).min_by(f64::total_cmp) else {
        return pieces;
    };
    let is_character = |piece: &str| piece.chars().count() == 1;
    let mut dropped_scores = Vec::new();
    let mut penalty = 0.0;
    // Each round claims at least one piece, so this ends.
    while dropped_scores.len() < trained.len() {
        let score = lowest + penalty;
        let holders = trained.iter().filter(|(piece, s)| is_character(piece) && *s == score).count();
        if holders == 0 {
            break;
        }
        dropped_scores.extend(std::iter::repeat_n(score, holders));
        penalty += DROPPED_CHARACTER_STEP;
    }
    let mut holders: Vec<&mut (String, f64)> =
        trained.iter_mut().filter(|(piece, score)| is_character(piece) && dropped_scores.contains(score)).collect();
    holders.sort_by(|a, b| a.0.cmp(&b.0));
    dropped_scores.sort_by(f64::total_cmp);
    for (holder, score) in holders.into_iter().zip(dropped_scores) {
        holder.1 = score;
    }
    trained.sort_by(|(a, score_a), (b, score_b)| score_b.total_cmp(score_a).then_with(|| a.cmp(b)));
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words counted batch by batch (batches closed by document count and
    /// by bytes) are the words of the whole text, counted at once.
    #[test]
    fn words_counted_in_batches_are_the_whole_texts_words() {
        use crate::document_batch::BATCH_DOCUMENTS;
        let mut tokenizer = Tokenizer::new(ModelWrapper::from(BPE::default()));
        tokenizer.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::WhitespaceSplit));
        let long = "x".repeat(BATCH_BYTES / 3);
        let documents: Vec<String> = (0..2 * BATCH_DOCUMENTS + 7)
            .map(|i| match i % 1000 {
                0 => format!("{long} {i}"),
                _ => format!("word{} shared {}", i % 97, "y".repeat(i % 5000 / 1000)),
            })
            .collect();
        let mut counter = WordCounter::new(tokenizer);
        for document in &documents {
            counter.document(document).unwrap();
        }
        assert_eq!(counter.counts(), (documents.len() as u64, 0));
        let (_, counted) = counter.finish().unwrap();
        let mut expected: HashMap<String, u64> = HashMap::new();
        for word in documents.iter().flat_map(|d| d.split_whitespace()) {
            if word.len() <= MAX_TRAINING_WORD_BYTES {
                *expected.entry(word.to_string()).or_default() += 1;
            }
        }
        let mut expected: WordCounts = expected.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(counted, expected);
    }

    fn pieces(list: &[(&str, f64)]) -> Vec<(String, f64)> {
        list.iter().map(|(p, s)| (p.to_string(), *s)).collect()
    }

    #[test]
    fn dropped_characters_take_their_scores_in_character_order_whatever_the_walk() {
        let m = -9.0;
        let step = |k: usize| (0..k).fold(0.0, |penalty, _| penalty + DROPPED_CHARACTER_STEP) + m;
        let specials = [("<s>", 0.0), ("<unk>", 0.0)];
        let trained = [("▁the", -2.0), ("▁a", -3.0), ("x", -4.0), ("▁rare", m)];
        let walk_one = [("q", step(0)), ("j", step(1)), ("[", step(2))];
        let walk_two = [("[", step(0)), ("q", step(1)), ("j", step(2))];
        let assemble = |walk: &[(&str, f64)], reverse: bool| {
            let mut list: Vec<(&str, f64)> = walk.iter().chain(&trained).copied().collect();
            if reverse {
                list.reverse();
            }
            canonical_pieces(pieces(&specials.iter().chain(&list).copied().collect::<Vec<_>>()), specials.len())
        };
        let canonical = assemble(&walk_one, false);
        assert_eq!(canonical, assemble(&walk_two, true));
        assert_eq!(
            canonical,
            pieces(&[
                ("<s>", 0.0),
                ("<unk>", 0.0),
                ("▁the", -2.0),
                ("▁a", -3.0),
                ("x", -4.0),
                ("q", step(2)),
                ("j", step(1)),
                ("[", m),
                ("▁rare", m),
            ])
        );
    }

    #[test]
    fn a_character_scored_off_the_dropped_progression_keeps_its_score() {
        let list = pieces(&[("<unk>", 0.0), ("a", -1.0), ("b", -5.0), ("c", -5.0 + DROPPED_CHARACTER_STEP / 2.0)]);
        let canonical = canonical_pieces(list, 1);
        assert_eq!(
            canonical,
            pieces(&[("<unk>", 0.0), ("a", -1.0), ("c", -5.0 + DROPPED_CHARACTER_STEP / 2.0), ("b", -5.0)])
        );
    }
}
