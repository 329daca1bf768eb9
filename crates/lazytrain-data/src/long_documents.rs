//! Documents too long to tokenize in one piece. The tokenizers library
//! keeps an alignment table entry per byte of a text while it normalises
//! and pre-tokenizes it: a 50 MB line took 2.8 GB to tokenize with
//! WordPiece and 12 GB with a unigram model. With a tokenizer for which
//! that is exact ([`cuts_are_exact`]: every tokenizer lazytrain trains),
//! such documents are tokenized in pieces of at most [`PIECE_BYTES`], cut
//! where a word ends, so the pieces give the tokens the whole document
//! would.

use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, Tokenizer};

/// The longest text tokenized (or counted for tokenizer training) at once.
pub(crate) const PIECE_BYTES: usize = 1 << 20;

/// `text` cut into pieces of at most `max` bytes, and the number of cuts
/// that fell inside a word.
///
/// A cut is placed before an ASCII space that follows a character other
/// than whitespace, where the tokenizers [`cuts_are_exact`] accepts end a
/// word and start the next one with that space. A stretch of `max` bytes
/// with no such place (one word longer than that: base64, binary data) is
/// cut at a character boundary, and counted.
pub(crate) fn pieces(text: &str, max: usize) -> (Vec<&str>, u64) {
    assert!(max >= 4, "a piece holds at least one character");
    let mut pieces = Vec::new();
    let mut inside_words = 0;
    let mut rest = text;
    while rest.len() > max {
        let end = (0..=max).rev().find(|&at| rest.is_char_boundary(at)).unwrap_or(0);
        let window = &rest[..end];
        let boundary = window
            .char_indices()
            .rev()
            .filter(|&(at, c)| c == ' ' && at > 0)
            .find(|&(at, _)| window[..at].chars().next_back().is_some_and(|before| !before.is_whitespace()))
            .map(|(at, _)| at);
        let cut = boundary.unwrap_or_else(|| {
            inside_words += 1;
            window.len()
        });
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces.push(rest);
    (pieces, inside_words)
}

/// Whether [`pieces`]' cuts leave `tokenizer`'s tokens as they are: its
/// normaliser (if any) works character by character, its pre-tokenizer
/// ends a word at every space that follows one and starts the next word
/// with it (BERT's, byte-level BPE's with its regex, a splitting Metaspace,
/// whitespace splits, with punctuation and digit splits beside them), and
/// no added token holds a space or takes in the spaces after it. Other tokenizers (a SentencePiece
/// `Prepend`/`Replace` normaliser without a pre-tokenizer, a custom split
/// pattern) tokenize a long document whole.
pub(crate) fn cuts_are_exact(tokenizer: &Tokenizer) -> bool {
    fn by_character(normalizer: &NormalizerWrapper) -> bool {
        match normalizer {
            NormalizerWrapper::BertNormalizer(_)
            | NormalizerWrapper::StripAccents(_)
            | NormalizerWrapper::NFC(_)
            | NormalizerWrapper::NFD(_)
            | NormalizerWrapper::NFKC(_)
            | NormalizerWrapper::NFKD(_)
            | NormalizerWrapper::Lowercase(_) => true,
            NormalizerWrapper::Sequence(sequence) => sequence.as_ref().iter().all(by_character),
            // Strip trims the text's ends, Prepend and Replace add or
            // change text around spaces; the others are not examined.
            NormalizerWrapper::StripNormalizer(_)
            | NormalizerWrapper::Nmt(_)
            | NormalizerWrapper::Precompiled(_)
            | NormalizerWrapper::Replace(_)
            | NormalizerWrapper::Prepend(_)
            | NormalizerWrapper::ByteLevel(_) => false,
        }
    }
    /// `Some(splits at spaces)` for a pre-tokenizer that splits only
    /// where its input says (not by position or a custom pattern).
    fn splits(pre: &PreTokenizerWrapper) -> Option<bool> {
        match pre {
            PreTokenizerWrapper::BertPreTokenizer(_)
            | PreTokenizerWrapper::Whitespace(_)
            | PreTokenizerWrapper::WhitespaceSplit(_) => Some(true),
            PreTokenizerWrapper::ByteLevel(byte_level) => byte_level.use_regex.then_some(true),
            PreTokenizerWrapper::Metaspace(metaspace) => metaspace.get_split().then_some(true),
            PreTokenizerWrapper::Punctuation(_) | PreTokenizerWrapper::Digits(_) => Some(false),
            PreTokenizerWrapper::Sequence(sequence) => {
                let each: Option<Vec<bool>> = sequence.as_ref().iter().map(splits).collect();
                each.map(|each| each.contains(&true))
            }
            PreTokenizerWrapper::Delimiter(_)
            | PreTokenizerWrapper::Split(_)
            | PreTokenizerWrapper::UnicodeScripts(_)
            | PreTokenizerWrapper::FixedLength(_) => None,
        }
    }
    let normalizer = tokenizer.get_normalizer().is_none_or(by_character);
    let pre_tokenizer = tokenizer.get_pre_tokenizer().and_then(splits) == Some(true);
    // An added token that takes in the spaces after it (`rstrip`) would
    // take the space a cut moves into the next piece.
    let added =
        tokenizer.get_added_tokens_decoder().values().all(|token| !token.content.contains(' ') && !token.rstrip);
    normalizer && pre_tokenizer && added
}

/// The note said when `cuts` cuts fell inside a word.
pub(crate) fn cut_words_note(cuts: u64) -> String {
    format!(
        "note: cut {cuts} time(s) inside a word (or a run of spaces) longer than {} MiB to tokenize a long \
         document in pieces (base64 or binary data in the text?)",
        PIECE_BYTES >> 20
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_used_only_with_tokenizers_they_tokenize_exactly() {
        use crate::train_tokenizer::{train_tokenizer, SubwordModel};
        use crate::TokenizerStyle;
        let docs: Vec<String> = (0..50).map(|i| format!("the state of the union {i} is strong")).collect();
        for (model, style) in [
            (SubwordModel::WordPiece, TokenizerStyle::Bert),
            (SubwordModel::Unigram, TokenizerStyle::Roberta),
            (SubwordModel::Bpe, TokenizerStyle::Gpt2),
        ] {
            let tokenizer = train_tokenizer(&docs, model, 100, style).unwrap();
            assert!(cuts_are_exact(tokenizer.inner()), "{model:?}");
        }
        // A SentencePiece-style tokenizer: `▁` prepended, spaces replaced,
        // no pre-tokenizer: a cut would add a `▁`.
        let mut sentencepiece = Tokenizer::new(tokenizers::models::bpe::BPE::default());
        sentencepiece.with_normalizer(Some(tokenizers::normalizers::Prepend::new("▁".into())));
        assert!(!cuts_are_exact(&sentencepiece));
        sentencepiece.with_normalizer(None::<NormalizerWrapper>);
        assert!(!cuts_are_exact(&sentencepiece), "no pre-tokenizer: the text is one word");
        sentencepiece.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::punctuation::Punctuation::default()));
        assert!(!cuts_are_exact(&sentencepiece), "punctuation alone does not split at spaces");
        sentencepiece.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::sequence::Sequence::new(vec![
            tokenizers::pre_tokenizers::whitespace::WhitespaceSplit.into(),
            tokenizers::pre_tokenizers::punctuation::Punctuation::default().into(),
        ])));
        assert!(cuts_are_exact(&sentencepiece));
        sentencepiece.add_tokens(&[tokenizers::AddedToken::from("new york", false)]);
        assert!(!cuts_are_exact(&sentencepiece), "an added token with a space");
        let mut stripping = Tokenizer::new(tokenizers::models::bpe::BPE::default());
        stripping.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::WhitespaceSplit));
        assert!(cuts_are_exact(&stripping));
        stripping.add_special_tokens(&[tokenizers::AddedToken::from("<sep>", true).rstrip(true)]);
        assert!(!cuts_are_exact(&stripping), "an added token that takes in the spaces after it");
    }

    #[test]
    fn cuts_fall_before_a_space_after_a_word_or_inside_an_overlong_word() {
        let (cut, inside) = pieces("one two   three four", 9);
        assert_eq!((cut, inside), (vec!["one two", "   three", " four"], 0));
        assert_eq!(pieces("short", 9), (vec!["short"], 0));
        // No space after a word in the window: a cut inside the word.
        let (cut, inside) = pieces("abcdefghijkl mn", 5);
        assert_eq!((cut, inside), (vec!["abcde", "fghij", "kl mn"], 2));
        // Multi-byte characters are never split.
        let (cut, _) = pieces("ééééé", 5);
        assert_eq!(cut, vec!["éé", "éé", "é"]);
        // Whitespace other than a space before the space: not a word's end.
        let (cut, _) = pieces("ab\t  cd", 6);
        assert_eq!(cut, vec!["ab\t  c", "d"]);
        for text in ["one two   three four", "abcdefghijkl mn", "ééééé x y", "ab\t  cd"] {
            for max in 4..12 {
                let (cut, _) = pieces(text, max);
                assert_eq!(cut.concat(), text, "{max}");
                assert!(cut.iter().all(|p| p.len() <= max && !p.is_empty()), "{cut:?}");
            }
        }
    }
}
