//! Hugging Face tokenizers (`tokenizer.json`) through the `tokenizers`
//! crate, with the special tokens BERT, RoBERTa and GPT-2 need and the side files
//! (`tokenizer_config.json`, `special_tokens_map.json`) `AutoTokenizer` reads.

use crate::quiet::quietly;
use crate::{DataError, Result};
use lazytrain_core::atomic_file::write_atomically;
use serde_json::json;
use std::path::Path;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::Tokenizer;

/// Which special-token convention a tokenizer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerStyle {
    /// `[PAD] [UNK] [CLS] [SEP] [MASK]`.
    Bert,
    /// `<s> <pad> </s> <unk> <mask>`.
    Roberta,
    /// GPT-2's single `<|endoftext|>`: bos, eos and unk at once, also used
    /// to pad (padding is masked out); no mask token.
    Gpt2,
}

/// GPT-2's one special token.
pub const END_OF_TEXT: &str = "<|endoftext|>";

impl TokenizerStyle {
    /// The style's tokens in order: pad, unk, start (cls/bos), end (sep/eos).
    pub fn token_names(self) -> [&'static str; 4] {
        match self {
            TokenizerStyle::Bert => ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
            TokenizerStyle::Roberta => ["<pad>", "<unk>", "<s>", "</s>"],
            TokenizerStyle::Gpt2 => [END_OF_TEXT; 4],
        }
    }

    /// The mask token, for the styles of masked LMs.
    pub fn mask_name(self) -> Option<&'static str> {
        match self {
            TokenizerStyle::Bert => Some("[MASK]"),
            TokenizerStyle::Roberta => Some("<mask>"),
            TokenizerStyle::Gpt2 => None,
        }
    }
}

/// The special token ids of a tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    /// The convention.
    pub style: TokenizerStyle,
    /// Padding.
    pub pad: u32,
    /// Unknown.
    pub unk: u32,
    /// `[CLS]` / `<s>`.
    pub start: u32,
    /// `[SEP]` / `</s>`.
    pub end: u32,
    /// `[MASK]` / `<mask>` (none for GPT-2).
    pub mask: Option<u32>,
}

impl SpecialTokens {
    /// Every special id (pad, unk, start, end and the mask when there is one).
    pub fn ids(&self) -> Vec<u32> {
        let mut ids = vec![self.pad, self.unk, self.start, self.end];
        ids.extend(self.mask);
        ids.dedup();
        ids
    }
}

/// A loaded tokenizer with its special tokens resolved.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    special: SpecialTokens,
}

/// True when `normalizer`, or one in its sequence, prepends an empty
/// string: the `tokenizers` crate marks the first character as inserted
/// without inserting one, and a later step (ByteLevel's pre-tokenizer)
/// indexes past the alignments (found by `tests/fuzz.rs`).
fn prepends_nothing(normalizer: &NormalizerWrapper) -> bool {
    match normalizer {
        NormalizerWrapper::Prepend(prepend) => prepend.prepend.is_empty(),
        NormalizerWrapper::Sequence(sequence) => sequence.as_ref().iter().any(prepends_nothing),
        // The other normalizers of the library's enum (a foreign type, which
        // grows with its versions) hold no text to prepend.
        _ => false,
    }
}

fn tokenizer_error(path: &Path, detail: impl Into<String>) -> DataError {
    DataError::Tokenizer { path: path.display().to_string(), detail: detail.into() }
}

impl TextTokenizer {
    /// Wrap a `tokenizers` tokenizer, finding its special tokens (BERT style
    /// when it has `[CLS]`, RoBERTa style when it has `<s>`, GPT-2 style
    /// when it has `<|endoftext|>`).
    ///
    /// Padding and truncation settings stored in `tokenizer.json` are turned
    /// off, as Hugging Face's fast tokenizers do on every call: lazytrain
    /// pads and truncates where it means to (collators, pipelines).
    pub fn new(mut inner: Tokenizer, origin: &Path) -> Result<TextTokenizer> {
        if inner.get_normalizer().is_some_and(prepends_nothing) {
            return Err(tokenizer_error(
                origin,
                "has a Prepend normalizer with an empty string, which the tokenizers library misaligns \
                 (it panics on later encodes); remove that normalizer or give it the text to prepend",
            ));
        }
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| tokenizer_error(origin, format!("cannot turn off its truncation: {e}")))?;
        let style = if inner.token_to_id("[CLS]").is_some() {
            TokenizerStyle::Bert
        } else if inner.token_to_id("<s>").is_some() {
            TokenizerStyle::Roberta
        } else if inner.token_to_id(END_OF_TEXT).is_some() {
            TokenizerStyle::Gpt2
        } else {
            return Err(tokenizer_error(
                origin,
                "has none of [CLS] (BERT style), <s> (RoBERTa style) and <|endoftext|> (GPT-2 style) in its vocabulary",
            ));
        };
        let mut ids = [0u32; 4];
        let mut missing = Vec::new();
        for (slot, name) in ids.iter_mut().zip(style.token_names()) {
            match inner.token_to_id(name) {
                Some(id) => *slot = id,
                None => missing.push(name),
            }
        }
        let mask = style.mask_name().and_then(|name| {
            let id = inner.token_to_id(name);
            if id.is_none() {
                missing.push(name);
            }
            id
        });
        if !missing.is_empty() {
            return Err(tokenizer_error(
                origin,
                format!(
                    "lacks the special tokens {} that {style:?}-style models need; retrain it with them",
                    missing.join(" ")
                ),
            ));
        }
        // Some inconsistent files load but panic inside the `tokenizers`
        // crate on every encode (a template naming a special token the
        // post-processor does not define): refuse them here, by name.
        quietly(|| {
            let _ = inner.encode("a b", true);
            let _ = inner.encode(("a", "b"), true);
        })
        .map_err(|message| {
            tokenizer_error(
                origin,
                format!("cannot encode text ({message}); its post-processor or model is inconsistent"),
            )
        })?;
        let [pad, unk, start, end] = ids;
        Ok(TextTokenizer { inner, special: SpecialTokens { style, pad, unk, start, end, mask } })
    }

    /// Load `tokenizer.json` from a file or from a folder containing one.
    pub fn from_path(path: &Path) -> Result<TextTokenizer> {
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        if !file.exists() {
            return Err(tokenizer_error(&file, "not found; a model folder needs a tokenizer.json"));
        }
        // The `tokenizers` crate panics on some malformed files (an
        // `unwrap` in its decoder deserialiser): a parse error all the same,
        // without the panic's message on stderr.
        let parsed = quietly(|| Tokenizer::from_file(&file))
            .unwrap_or_else(|message| Err(format!("the tokenizers library failed: {message}").into()));
        let inner = parsed.map_err(|e| tokenizer_error(&file, format!("cannot be parsed: {e}")))?;
        TextTokenizer::new(inner, &file)
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// The special token ids.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// The mask token's text (`[MASK]` or `<mask>`; none for GPT-2).
    pub fn mask_token(&self) -> Option<&'static str> {
        self.special.style.mask_name()
    }

    /// Vocabulary size including added tokens: one more than the highest
    /// id, the rows an embedding needs (a tokenizer.json whose ids skip
    /// some, or that gives an added token a higher id than its vocabulary
    /// entry, has more than it has tokens).
    pub fn vocab_size(&self) -> usize {
        let highest = self.inner.get_vocab(true).into_values().max().map_or(0, |id| id as usize + 1);
        highest.max(self.inner.get_vocab_size(true))
    }

    /// Token ids of `text`, with the post-processor's special tokens when
    /// `add_special_tokens` is set.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| DataError::Invalid(format!("cannot tokenize {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens dropped when `skip_special_tokens`).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| DataError::Invalid(format!("cannot decode {ids:?}: {e}")))
    }

    /// The masked CRC32C (hex) of the `tokenizer.json` text: what a
    /// manifest records to tie prepared data to its tokenizer.
    pub fn content_hash(&self) -> Result<String> {
        let json = self.inner.to_string(false).map_err(|e| DataError::Invalid(e.to_string()))?;
        Ok(format!("{:08x}", crate::tfrecord::masked_crc32c(json.as_bytes())))
    }

    /// The token string of `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Write `tokenizer.json`, `tokenizer_config.json` and
    /// `special_tokens_map.json` into `dir` (what `AutoTokenizer` loads).
    pub fn save(&self, dir: &Path, model_max_length: usize) -> Result<()> {
        let io = |p: &Path, e: String| DataError::Io { path: p.display().to_string(), detail: e };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e.to_string()))?;
        let file = dir.join("tokenizer.json");
        let text = self.inner.to_string(false).map_err(|e| io(&file, e.to_string()))?;
        write_atomically(&file, text.as_bytes()).map_err(|e| io(&file, e.to_string()))?;
        let [pad, unk, start, end] = self.special.style.token_names();
        let mask = self.special.style.mask_name();
        // The model-specific classes rebuild their own pipeline from the
        // vocabulary; anything else must load tokenizer.json as it is.
        let class = match (self.inner.get_model(), self.special.style) {
            (ModelWrapper::WordPiece(_), TokenizerStyle::Bert) => "BertTokenizerFast",
            (ModelWrapper::BPE(_), TokenizerStyle::Roberta) => "RobertaTokenizerFast",
            (ModelWrapper::BPE(_), TokenizerStyle::Gpt2) => "GPT2TokenizerFast",
            _ => "PreTrainedTokenizerFast",
        };
        let map = match self.special.style {
            TokenizerStyle::Bert => {
                json!({"pad_token": pad, "unk_token": unk, "cls_token": start, "sep_token": end, "mask_token": mask})
            }
            TokenizerStyle::Roberta => {
                json!({"bos_token": start, "eos_token": end, "cls_token": start, "sep_token": end,
                       "pad_token": pad, "unk_token": unk, "mask_token": mask})
            }
            // GPT-2 has no pad token in transformers either (pipelines pad with eos).
            TokenizerStyle::Gpt2 => json!({"bos_token": start, "eos_token": end, "unk_token": unk}),
        };
        let mut config = map.clone();
        config["tokenizer_class"] = json!(class);
        config["model_max_length"] = json!(model_max_length);
        // The model-specific classes rebuild the normaliser / pre-tokeniser
        // from these arguments when they differ from their defaults
        // (`do_lower_case=True`, `add_prefix_space=False`): state them.
        if let Some(NormalizerWrapper::BertNormalizer(n)) = self.inner.get_normalizer() {
            config["do_lower_case"] = json!(n.lowercase);
            config["strip_accents"] = json!(n.strip_accents);
            config["tokenize_chinese_chars"] = json!(n.handle_chinese_chars);
        }
        if let Some(PreTokenizerWrapper::ByteLevel(b)) = self.inner.get_pre_tokenizer() {
            config["add_prefix_space"] = json!(b.add_prefix_space);
            config["trim_offsets"] = json!(b.trim_offsets);
        }
        let write = |name: &str, value: &serde_json::Value| {
            let path = dir.join(name);
            write_atomically(&path, serde_json::to_string_pretty(value).unwrap_or_default().as_bytes())
                .map_err(|e| io(&path, e.to_string()))
        };
        write("tokenizer_config.json", &config)?;
        write("special_tokens_map.json", &map)
    }
}
