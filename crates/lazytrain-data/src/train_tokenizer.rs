//! Training a tokenizer with the `tokenizers` crate.

use crate::formats::DocumentSink;
pub use crate::reproducible_training::MAX_TRAINING_WORD_BYTES;
use crate::reproducible_training::{train_byte_level_bpe, train_unigram, train_wordpiece, WordCounter};
use crate::tokenizer::{TextTokenizer, TokenizerStyle};
use crate::{DataError, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::metaspace::Metaspace as MetaspaceDecoder;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::{BertNormalizer, Lowercase, NormalizerWrapper, Sequence, NFC, NFKC};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, DecoderWrapper, Tokenizer};

/// The subword model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubwordModel {
    /// SentencePiece-style unigram LM (Metaspace pre-tokenizer).
    Unigram,
    /// BERT's WordPiece (`##` continuations).
    WordPiece,
    /// Byte-level BPE, as GPT-2 and RoBERTa use.
    Bpe,
}

impl SubwordModel {
    /// Parse `unigram`, `wordpiece` or `bpe`.
    pub fn parse(name: &str) -> Result<SubwordModel> {
        match name {
            "unigram" => Ok(SubwordModel::Unigram),
            "wordpiece" => Ok(SubwordModel::WordPiece),
            "bpe" => Ok(SubwordModel::Bpe),
            other => {
                Err(DataError::Invalid(format!("unknown tokenizer model `{other}`; choose unigram, wordpiece or bpe")))
            }
        }
    }
}

/// The text normaliser a trained tokenizer applies before splitting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Normalization {
    /// The style's own: BERT's (clean text, CJK spacing, lowercase, strip
    /// accents), NFC for RoBERTa, none for GPT-2.
    #[default]
    Style,
    /// NFKC, then lowercase (SentencePiece-style recipes).
    NfkcLowercase,
}

impl Normalization {
    /// Parse `style` or `nfkc-lowercase`.
    pub fn parse(name: &str) -> Result<Normalization> {
        match name {
            "style" => Ok(Normalization::Style),
            "nfkc-lowercase" => Ok(Normalization::NfkcLowercase),
            other => Err(DataError::Invalid(format!("unknown normalizer `{other}`; choose style or nfkc-lowercase"))),
        }
    }

    /// The `tokenizers` normaliser for `style`.
    fn normalizer(self, style: TokenizerStyle) -> Option<NormalizerWrapper> {
        match (self, style) {
            (Normalization::Style, TokenizerStyle::Bert) => Some(BertNormalizer::new(true, true, None, true).into()),
            (Normalization::Style, TokenizerStyle::Roberta) => Some(NFC.into()),
            (Normalization::Style, TokenizerStyle::Gpt2) => None,
            (Normalization::NfkcLowercase, _) => Some(Sequence::new(vec![NFKC.into(), Lowercase.into()]).into()),
        }
    }
}

impl TokenizerStyle {
    /// Parse `bert`, `roberta` or `gpt2`.
    pub fn parse(name: &str) -> Result<TokenizerStyle> {
        match name {
            "bert" => Ok(TokenizerStyle::Bert),
            "roberta" => Ok(TokenizerStyle::Roberta),
            "gpt2" => Ok(TokenizerStyle::Gpt2),
            other => {
                Err(DataError::Invalid(format!("unknown tokenizer style `{other}`; choose bert, roberta or gpt2")))
            }
        }
    }

    /// Special tokens in vocabulary order (the first ids).
    fn vocabulary_order(self) -> &'static [&'static str] {
        match self {
            TokenizerStyle::Bert => &["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            TokenizerStyle::Roberta => &["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            TokenizerStyle::Gpt2 => &[crate::tokenizer::END_OF_TEXT],
        }
    }
}

/// A training failure, as the error users see.
pub(crate) fn train_error(e: impl std::fmt::Display) -> DataError {
    let e = e.to_string();
    // The unigram trainer's words for a vocabulary smaller than the alphabet.
    let fix = match e.contains("not large enough to contain all chars") {
        true => "; raise --vocab-size: it must hold every character of the text (binary or base64 data has many)",
        false => "",
    };
    DataError::Invalid(format!("tokenizer training failed: {e}{fix}"))
}

/// Train a `model` tokenizer of about `vocab_size` tokens on `documents`,
/// with `style`'s special tokens first and its post-processor (`[CLS] A
/// [SEP]` or `<s> A </s>`; GPT-2 adds no tokens). The GPT-2 style is
/// GPT-2's byte-level BPE: no normaliser, no prefix space, `<|endoftext|>`
/// at id 0.
pub fn train_tokenizer(
    documents: &[String],
    model: SubwordModel,
    vocab_size: usize,
    style: TokenizerStyle,
) -> Result<TextTokenizer> {
    train_tokenizer_with(documents, model, vocab_size, style, Normalization::Style)
}

/// The largest vocabulary [`train_tokenizer_with`] trains: far beyond any
/// model's, small enough that the trainers' tables are always allocated.
pub const MAX_VOCAB_SIZE: usize = 1 << 24;

/// [`train_tokenizer`] with a chosen text [`Normalization`].
pub fn train_tokenizer_with(
    documents: &[String],
    model: SubwordModel,
    vocab_size: usize,
    style: TokenizerStyle,
    normalization: Normalization,
) -> Result<TextTokenizer> {
    let mut training = TokenizerTraining::new(model, vocab_size, style, normalization)?;
    for document in documents {
        training.document(document)?;
    }
    training.finish()
}

/// A tokenizer being trained: give it the documents (it is a
/// [`DocumentSink`]; the CLI's readers feed it as they read, and memory
/// holds the distinct words, not the text), then [`TokenizerTraining::finish`]
/// it.
pub struct TokenizerTraining {
    words: WordCounter,
    model: SubwordModel,
    vocab_size: usize,
    style: TokenizerStyle,
}

impl TokenizerTraining {
    /// Check the settings and set up the normaliser and pre-tokenizer that
    /// cut the documents into the words the trainer counts.
    pub fn new(
        model: SubwordModel,
        vocab_size: usize,
        style: TokenizerStyle,
        normalization: Normalization,
    ) -> Result<TokenizerTraining> {
        if vocab_size < 16 {
            return Err(DataError::Invalid(format!(
                "a vocabulary of {vocab_size} tokens is too small; use at least 16"
            )));
        }
        if vocab_size > MAX_VOCAB_SIZE {
            return Err(DataError::Invalid(format!(
                "a vocabulary of {vocab_size} tokens is too large; use at most {MAX_VOCAB_SIZE} (the largest models \
                 use about 250 000)"
            )));
        }
        if style == TokenizerStyle::Gpt2 && model != SubwordModel::Bpe {
            return Err(DataError::Invalid(format!(
                "the gpt2 style is GPT-2's byte-level BPE; use --model bpe (not {model:?})"
            )));
        }
        // The model is a placeholder until training: the normaliser and the
        // pre-tokenizer set below cut the documents into the words it counts.
        let mut tokenizer = Tokenizer::new(ModelWrapper::from(BPE::default()));
        tokenizer.with_normalizer(normalization.normalizer(style));
        let (pre, decoder): (PreTokenizerWrapper, DecoderWrapper) = match model {
            SubwordModel::Unigram => (
                Metaspace::new('▁', PrependScheme::Always, true).into(),
                MetaspaceDecoder::new('▁', PrependScheme::Always, true).into(),
            ),
            SubwordModel::WordPiece => (BertPreTokenizer.into(), WordPieceDecoder::default().into()),
            // A prefix space makes a word's sentence-initial token the same as its
            // mid-sentence one (`Ġword`), as `add_prefix_space=True` does in HF;
            // GPT-2's tokenizer has none.
            SubwordModel::Bpe => {
                (ByteLevel::new(style != TokenizerStyle::Gpt2, true, true).into(), ByteLevelDecoder::default().into())
            }
        };
        tokenizer.with_pre_tokenizer(Some(pre));
        tokenizer.with_decoder(Some(decoder));
        Ok(TokenizerTraining { words: WordCounter::new(tokenizer), model, vocab_size, style })
    }

    /// Train on the words of every document given, and add the style's
    /// special tokens and post-processor.
    pub fn finish(self) -> Result<TextTokenizer> {
        let TokenizerTraining { words, model, vocab_size, style } = self;
        let specials: Vec<AddedToken> = style
            .vocabulary_order()
            .iter()
            .map(|t| AddedToken::from(t.to_string(), true).lstrip(*t == "<mask>"))
            .collect();
        let unk = style.token_names()[1];
        let (mut tokenizer, words) = words.finish()?;
        if words.is_empty() {
            return Err(DataError::Invalid(format!(
                "no words to train the tokenizer on: the text is empty or every word is longer than \
                 {MAX_TRAINING_WORD_BYTES} bytes"
            )));
        }
        let trained = match model {
            SubwordModel::Unigram => train_unigram(&words, vocab_size, &specials, unk)?,
            SubwordModel::WordPiece => train_wordpiece(&words, vocab_size, &specials, unk)?,
            SubwordModel::Bpe => train_byte_level_bpe(&words, vocab_size, &specials)?,
        };
        drop(words);
        tokenizer.with_model(trained);
        tokenizer.add_special_tokens(&specials);
        let id =
            |t: &str| tokenizer.token_to_id(t).ok_or_else(|| train_error(format!("{t} is missing after training")));
        let post: PostProcessorWrapper = match style {
            TokenizerStyle::Bert => {
                let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
                TemplateProcessing::builder()
                    .try_single("[CLS] $A [SEP]")
                    .map_err(train_error)?
                    .try_pair("[CLS] $A [SEP] $B:1 [SEP]:1")
                    .map_err(train_error)?
                    .special_tokens(vec![("[CLS]", cls), ("[SEP]", sep)])
                    .build()
                    .map_err(train_error)?
                    .into()
            }
            TokenizerStyle::Roberta => RobertaProcessing::new(("</s>".into(), id("</s>")?), ("<s>".into(), id("<s>")?))
                .trim_offsets(true)
                .add_prefix_space(false)
                .into(),
            TokenizerStyle::Gpt2 => ByteLevel::new(true, false, true).into(),
        };
        tokenizer.with_post_processor(Some(post));
        TextTokenizer::new(tokenizer, Path::new("<trained>"))
    }
}

impl DocumentSink for TokenizerTraining {
    fn document(&mut self, text: &str) -> Result<()> {
        self.words.document(text)
    }

    fn null_row(&mut self) {
        self.words.null_row();
    }

    fn counts(&self) -> (u64, u64) {
        self.words.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizer_names_parse_and_a_wrong_one_lists_the_choices() {
        assert_eq!(Normalization::parse("style").unwrap(), Normalization::Style);
        assert_eq!(Normalization::parse("nfkc-lowercase").unwrap(), Normalization::NfkcLowercase);
        let e = Normalization::parse("nfkd").unwrap_err().to_string();
        assert!(e.contains("`nfkd`") && e.contains("style or nfkc-lowercase"), "{e}");
    }

    /// An 80 KB word without spaces (a base64 blob) overflowed the unigram
    /// trainer's stack and made WordPiece's work quadratic: it is left out,
    /// and the rest of the text trains the same vocabulary as without it.
    #[test]
    fn words_too_long_to_train_on_are_left_out() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let blob: String = (0..80_000)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                char::from(b'a' + (state >> 59) as u8 % 26)
            })
            .collect();
        assert!(blob.len() > MAX_TRAINING_WORD_BYTES);
        let alone = train_tokenizer(std::slice::from_ref(&blob), SubwordModel::Unigram, 100, TokenizerStyle::Roberta);
        let err = alone.err().expect("nothing left to train on").to_string();
        assert!(err.contains("no words to train the tokenizer on"), "{err}");
        let docs: Vec<String> = (0..30).map(|i| format!("the state of the union {i} is strong")).collect();
        let with_blob: Vec<String> = docs.iter().cloned().chain([blob]).collect();
        for model in [SubwordModel::Unigram, SubwordModel::WordPiece] {
            let vocab = |docs: &[String]| {
                let tok = train_tokenizer(docs, model, 100, TokenizerStyle::Roberta).unwrap();
                let mut v: Vec<(String, u32)> = tok.inner().get_vocab(true).into_iter().collect();
                v.sort();
                v
            };
            assert_eq!(vocab(&with_blob), vocab(&docs), "{model:?}");
        }
    }

    #[test]
    fn a_vocabulary_smaller_than_the_alphabet_names_the_flag() {
        let docs: Vec<String> = (0..20).map(|i| format!("abcdefghijklmnopqrstuvwxyz 0123456789 {i}")).collect();
        let err = train_tokenizer(&docs, SubwordModel::Unigram, 16, TokenizerStyle::Roberta).err().unwrap().to_string();
        assert!(err.contains("raise --vocab-size: it must hold every character"), "{err}");
    }

    #[test]
    fn nfkc_lowercase_folds_width_and_case() {
        let docs: Vec<String> =
            (0..40).map(|i| format!("the union is strong and the state of the union {i} is good")).collect();
        let tok = train_tokenizer_with(
            &docs,
            SubwordModel::Unigram,
            60,
            TokenizerStyle::Roberta,
            Normalization::NfkcLowercase,
        )
        .unwrap();
        let ids = |text: &str| tok.inner().encode(text, false).unwrap().get_ids().to_vec();
        // Full-width letters are NFKC-folded, capitals lowercased.
        assert_eq!(ids("ＴＨＥ Union"), ids("the union"));
        let plain = train_tokenizer(&docs, SubwordModel::Unigram, 60, TokenizerStyle::Roberta).unwrap();
        let plain_ids = |text: &str| plain.inner().encode(text, false).unwrap().get_ids().to_vec();
        assert_ne!(plain_ids("THE Union"), plain_ids("the union"));
    }

    #[test]
    fn every_model_learns_the_same_vocabulary_each_time() {
        // tokenizers' own `Tokenizer::train` walks per-instance-seeded hash
        // maps: WordPiece's `##` ids and merge ties, and unigram's scores,
        // changed from one training to the next.
        let corpus = crate::corpus::demo_corpus(3, 12, 400);
        for model in [SubwordModel::WordPiece, SubwordModel::Unigram, SubwordModel::Bpe] {
            let vocabulary = || {
                let tok = train_tokenizer(&corpus.sentences, model, 300, TokenizerStyle::Bert).unwrap();
                tok.inner().to_string(false).unwrap()
            };
            let first = vocabulary();
            for _ in 0..4 {
                assert!(first == vocabulary(), "{model:?} learned a different tokenizer on the same text");
            }
        }
    }
}
