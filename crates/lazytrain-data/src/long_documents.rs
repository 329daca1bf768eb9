//! Documents too long to tokenize in one piece. The tokenizers library
//! keeps an alignment table entry per byte of a text while it normalises
//! and pre-tokenizes it: a 50 MB line took 2.8 GB to tokenize with
//! WordPiece and 9 GB with a unigram model. Such documents are tokenized in
//! pieces of at most [`PIECE_BYTES`], cut where a word ends, so the pieces
//! give the tokens the whole document would.

/// The longest text tokenized (or counted for tokenizer training) at once.
pub(crate) const PIECE_BYTES: usize = 1 << 20;

/// `text` cut into pieces of at most `max` bytes, and the number of cuts
/// that fell inside a word.
///
/// A cut is placed before an ASCII space that follows a character other
/// than whitespace: every pre-tokenizer lazytrain trains (BERT's, byte-level
/// BPE's, the unigram Metaspace) ends a word there and starts the next one
/// with that space, and the normalisers work character by character, so
/// the pieces tokenize as the whole text does. A stretch of `max` bytes
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
