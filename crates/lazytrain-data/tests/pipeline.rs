//! The data path end to end: tokenizer training, prepare, TFRecord
//! integrity, sharded reading with resume, and the prefetching loader.

mod common;

use lazytrain_core::{Device, ScratchDir};
use lazytrain_data::collator::{Collator, HostBatch, MlmCollator};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::dataset::{find_shards, EpochSampler, ShardedDataset};
use lazytrain_data::formats::TextSource;
use lazytrain_data::loader::{DeviceLoader, LoaderPlan};
use lazytrain_data::prepare::{prepare, Manifest, Preparation, PrepareOptions};
use lazytrain_data::text::read_all_into;
use lazytrain_data::tfrecord::{index_path, masked_crc32c, CorruptPolicy, LocalShard, RecordIndex};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::{TextTokenizer, TokenizerStyle};
use std::sync::Arc;

/// A fresh scratch folder, removed when the test passes.
fn tmp(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("data-{name}")).unwrap()
}

fn corpus() -> Vec<String> {
    demo_corpus(0, 24, 3000).sentences
}

#[test]
fn tokenizers_train_in_every_model_and_style() {
    let docs = corpus();
    for model in [SubwordModel::WordPiece, SubwordModel::Unigram, SubwordModel::Bpe] {
        for style in [TokenizerStyle::Bert, TokenizerStyle::Roberta] {
            let tok = train_tokenizer(&docs, model, 400, style).unwrap();
            let names = style.token_names();
            let s = tok.special();
            assert_eq!(
                [s.pad, s.unk, s.start, s.end].map(|id| tok.id_to_token(id).unwrap()),
                names.map(String::from),
                "{model:?} {style:?}"
            );
            assert_eq!(s.mask.and_then(|id| tok.id_to_token(id)).as_deref(), style.mask_name());
            assert!(s.ids().iter().all(|&id| id < 5), "specials come first");
            let ids = tok.encode(&docs[0], true).unwrap();
            assert_eq!((ids[0], *ids.last().unwrap()), (s.start, s.end), "post-processor wraps the text");
            let text = tok.decode(&ids, true).unwrap();
            assert_eq!(text.replace(' ', ""), docs[0].replace(' ', ""), "{model:?} {style:?} decodes back");
            let dir = tmp(&format!("tok-{model:?}-{style:?}"));
            tok.save(&dir, 512).unwrap();
            let again = TextTokenizer::from_path(&dir).unwrap();
            assert_eq!(again.encode(&docs[1], true).unwrap(), tok.encode(&docs[1], true).unwrap());
            for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
                assert!(dir.join(f).exists());
            }
        }
    }
}

/// `--style gpt2`: GPT-2's byte-level BPE with `<|endoftext|>` at id 0 as
/// bos, eos, unk and pad, no mask token, no added tokens and no prefix
/// space; `prepare` ends each document with it; masked-LM collation is refused.
#[test]
fn gpt2_style_tokenizers_are_gpt2s() {
    let docs = corpus();
    assert!(train_tokenizer(&docs, SubwordModel::WordPiece, 300, TokenizerStyle::Gpt2).is_err(), "BPE only");
    let tok = train_tokenizer(&docs, SubwordModel::Bpe, 400, TokenizerStyle::Gpt2).unwrap();
    let s = tok.special();
    assert_eq!((s.pad, s.unk, s.start, s.end, s.mask), (0, 0, 0, 0, None));
    assert_eq!(tok.id_to_token(0).as_deref(), Some("<|endoftext|>"));
    let ids = tok.encode(&docs[0], true).unwrap();
    assert!(!ids.contains(&0), "no special tokens are added");
    assert_eq!(tok.decode(&ids, true).unwrap(), docs[0], "byte-level BPE decodes exactly");
    let (first, _) = docs[0].split_once(' ').unwrap();
    assert_eq!(tok.encode(first, false).unwrap(), ids[..tok.encode(first, false).unwrap().len()], "no prefix space");
    let dir = tmp("tok-gpt2");
    tok.save(&dir, 1024).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(config["tokenizer_class"], "GPT2TokenizerFast");
    assert_eq!(config["eos_token"], "<|endoftext|>");
    assert_eq!(config["add_prefix_space"], false);
    assert!(config.get("mask_token").is_none() && config.get("pad_token").is_none(), "{config}");
    assert_eq!(TextTokenizer::from_path(&dir).unwrap().special(), s);
    let err = MlmCollator::for_tokenizer(&tok, 0.15, 0).unwrap_err().to_string();
    assert!(err.contains("no mask token") && err.contains("--task causal-lm"), "{err}");

    let out = tmp("prepared-gpt2");
    let options = PrepareOptions {
        block_size: 8,
        num_shards: 1,
        validation_fraction: 0.0,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tok, &docs[..4], &out, &options).unwrap();
    let expected: usize = docs[..4].iter().map(|d| tok.encode(d, true).unwrap().len() + 1).sum();
    assert_eq!(manifest.tokens as usize, expected, "each document ends with <|endoftext|>");
}

/// `tokenizer_config.json` states what the normaliser and pre-tokeniser
/// do, so `BertTokenizerFast`/`RobertaTokenizerFast` (whose defaults are
/// `do_lower_case=True`, `add_prefix_space=False`) keep them: a cased
/// WordPiece stays cased, a byte-level BPE keeps its prefix space.
#[test]
fn tokenizer_configs_state_casing_and_prefix_spaces() {
    use tokenizers::normalizers::BertNormalizer;
    let config = |tok: &TextTokenizer, name: &str| {
        let dir = tmp(name);
        tok.save(&dir, 128).unwrap();
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap()
    };
    let bert = train_tokenizer(&corpus(), SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap();
    let c = config(&bert, "cfg-uncased");
    assert_eq!((c["do_lower_case"].as_bool(), c["tokenizer_class"].as_str()), (Some(true), Some("BertTokenizerFast")));
    let mut cased = bert.inner().clone();
    cased.with_normalizer(Some(BertNormalizer::new(true, true, Some(false), false)));
    let cased = TextTokenizer::new(cased, std::path::Path::new("<cased>")).unwrap();
    let c = config(&cased, "cfg-cased");
    assert_eq!((c["do_lower_case"].as_bool(), c["strip_accents"].as_bool()), (Some(false), Some(false)));
    let roberta = train_tokenizer(&corpus(), SubwordModel::Bpe, 300, TokenizerStyle::Roberta).unwrap();
    let c = config(&roberta, "cfg-roberta");
    assert_eq!((c["add_prefix_space"].as_bool(), c["trim_offsets"].as_bool()), (Some(true), Some(true)));
    assert!(c.get("do_lower_case").is_none());
}

/// Padding and truncation saved in a `tokenizer.json` are not applied
/// (Hugging Face's fast tokenizers turn them off on every call).
#[test]
fn stored_padding_and_truncation_are_ignored() {
    use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};
    let tok = train_tokenizer(&corpus(), SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap();
    let mut inner = tok.inner().clone();
    inner.with_truncation(Some(TruncationParams { max_length: 4, ..Default::default() })).unwrap();
    inner.with_padding(Some(PaddingParams { strategy: PaddingStrategy::Fixed(64), ..Default::default() }));
    let dir = tmp("padded-tok");
    inner.save(dir.join("tokenizer.json"), false).unwrap();
    let loaded = TextTokenizer::from_path(&dir).unwrap();
    let text = &corpus()[0];
    let ids = loaded.encode(text, true).unwrap();
    assert_eq!(ids, tok.encode(text, true).unwrap());
    assert!(ids.len() > 4 && ids.len() < 64, "{} ids", ids.len());
}

#[test]
fn a_tokenizer_without_special_tokens_is_refused() {
    let dir = tmp("plain-tok");
    let tok = train_tokenizer(&corpus(), SubwordModel::WordPiece, 200, TokenizerStyle::Bert).unwrap();
    let json = tok.inner().to_string(false).unwrap().replace("[MASK]", "[MSK]");
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    let msg = TextTokenizer::from_path(&dir).err().unwrap().to_string();
    assert!(msg.contains("[MASK]") && msg.contains("special tokens"), "{msg}");
}

fn prepared(name: &str, shards: usize) -> (ScratchDir, TextTokenizer, Manifest) {
    let tok = train_tokenizer(&corpus(), SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap();
    let dir = tmp(name);
    let options = PrepareOptions {
        block_size: 32,
        num_shards: shards,
        validation_fraction: 0.1,
        seed: 1,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tok, &corpus(), &dir, &options).unwrap();
    (dir, tok, manifest)
}

/// A scanned shard whose length field claims more than any record holds
/// (here 1.5 GiB in a sparse 2 GiB file) is refused before the claim is
/// allocated.
#[test]
fn a_record_longer_than_any_prepared_one_is_corrupt() {
    use std::io::Write;
    let dir = tmp("huge-record");
    let path = dir.join("huge.tfrecord");
    let len: u64 = 3 << 29;
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&len.to_le_bytes()).unwrap();
    file.write_all(&masked_crc32c(&len.to_le_bytes()).to_le_bytes()).unwrap();
    file.set_len(2 << 30).unwrap();
    drop(file);
    let msg = RecordIndex::scan(&path, CorruptPolicy::Fail).unwrap_err().to_string();
    assert!(msg.contains("a record of 1610612736 bytes (at most 1073741824)"), "{msg}");
    std::fs::remove_file(&path).unwrap();
}

/// Vocabularies outside `16..=MAX_VOCAB_SIZE` are refused before training
/// (a huge one aborted on the trainer's table).
#[test]
fn tokenizer_training_refuses_huge_vocabularies() {
    use lazytrain_data::train_tokenizer::MAX_VOCAB_SIZE;
    for model in [SubwordModel::Bpe, SubwordModel::WordPiece, SubwordModel::Unigram] {
        for size in [MAX_VOCAB_SIZE + 1, usize::MAX] {
            let msg = train_tokenizer(&corpus(), model, size, TokenizerStyle::Bert).err().unwrap().to_string();
            assert!(msg.contains(&format!("a vocabulary of {size} tokens is too large")), "{msg}");
        }
    }
}

/// A tokenizer.json whose ids skip some (here `[PAD]` moved past the
/// others): its vocabulary size is one more than the highest id, the rows
/// an embedding needs, not its count of tokens.
#[test]
fn vocab_size_covers_the_highest_id() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../lazytrain-models/tests/fixtures/tiny-bert/tokenizer.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let count = json["model"]["vocab"].as_object().unwrap().len();
    let moved = count + 9;
    json["model"]["vocab"]["[PAD]"] = moved.into();
    for token in json["added_tokens"].as_array_mut().unwrap() {
        if token["content"] == "[PAD]" {
            token["id"] = moved.into();
        }
    }
    let dir = tmp("id-gap");
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    let tok = TextTokenizer::from_path(&dir).unwrap();
    assert_eq!(tok.special().pad as usize, moved);
    assert_eq!(tok.vocab_size(), moved + 1, "{count} tokens, the highest id {moved}");
}

/// Block sizes outside `2..=MAX_BLOCK_SIZE` are refused before any work
/// (a block of 10^12 tokens would have aborted on its buffer's allocation).
#[test]
fn prepare_refuses_block_sizes_out_of_range() {
    let tok = train_tokenizer(&corpus(), SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap();
    for block_size in [1, lazytrain_data::prepare::MAX_BLOCK_SIZE + 1, 1 << 40] {
        let options = PrepareOptions { block_size, progress: false, ..Default::default() };
        let msg = prepare(&tok, &corpus(), &tmp("block-range"), &options).unwrap_err().to_string();
        assert!(msg.contains(&format!("--block-size {block_size} must be in 2..=")), "{msg}");
    }
    // The split settings are named by their flags too.
    for (options, expected) in [
        (PrepareOptions { num_shards: 0, ..Default::default() }, "--num-shards 0 must be in 1..=1024"),
        (PrepareOptions { num_shards: 1 << 40, ..Default::default() }, "must be in 1..=1024"),
        (
            PrepareOptions { validation_fraction: 1.0, ..Default::default() },
            "--validation-fraction 1 must be in [0, 1)",
        ),
        (PrepareOptions { validation_fraction: f64::NAN, ..Default::default() }, "--validation-fraction NaN"),
    ] {
        let msg = prepare(&tok, &corpus(), &tmp("split-range"), &options).unwrap_err().to_string();
        assert!(msg.contains(expected), "{msg}");
    }
    let dir = tmp("output-file");
    let file = dir.join("afile");
    std::fs::write(&file, "x").unwrap();
    let options = PrepareOptions { progress: false, ..Default::default() };
    let msg = prepare(&tok, &corpus(), &file, &options).unwrap_err().to_string();
    assert!(msg.contains("afile is a file; name a folder for the shards and manifest.json"), "{msg}");
}

#[test]
fn prepare_writes_blocks_that_read_back() {
    let (dir, tok, manifest) = prepared("prepare", 3);
    assert_eq!(manifest.train.len(), 3);
    assert_eq!(manifest.train[0].file, "train-00000-of-00003.tfrecord");
    assert_eq!(Manifest::read(&dir).unwrap(), manifest);
    let total = manifest.train_records() + manifest.validation.iter().map(|s| s.records).sum::<u64>();
    assert_eq!(total * 32 + manifest.dropped_tokens, manifest.tokens);
    let val = manifest.validation[0].records as f64 / total as f64;
    assert!((val - 0.1).abs() < 0.04, "validation share {val}");
    let data = ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap();
    assert_eq!(data.len() as u64, manifest.train_records());
    let ids = data.feature(0, "input_ids").unwrap();
    assert_eq!(ids.len(), 32);
    assert!(ids.contains(&(tok.special().end as i64)) || data.len() > 1);
    assert_eq!(data.feature(0, "attention_mask").unwrap(), vec![1; 32]);
    let glob = dir.join("train-*-of-00003.tfrecord");
    assert_eq!(find_shards(&glob, "train").unwrap().len(), 3);
}

#[test]
fn corrupt_and_truncated_shards_are_reported() {
    let (dir, _, _) = prepared("corrupt", 1);
    let shard = dir.join("train-00000-of-00001.tfrecord");
    let bytes = std::fs::read(&shard).unwrap();
    let spans = RecordIndex::scan(&shard, CorruptPolicy::Fail).unwrap().spans;
    let mut flipped = bytes.clone();
    flipped[spans[2].offset as usize + 20] ^= 0x40; // inside the data of record 2
    std::fs::write(&shard, &flipped).unwrap();
    let msg = ShardedDataset::open(std::slice::from_ref(&shard), CorruptPolicy::Fail).err().unwrap().to_string();
    assert!(
        msg.contains("record 2") && msg.contains(&format!("byte {}", spans[2].offset)) && msg.contains("checksum"),
        "{msg}"
    );
    let skipping = ShardedDataset::open(std::slice::from_ref(&shard), CorruptPolicy::Skip).unwrap();
    assert_eq!((skipping.len(), skipping.skipped()), (spans.len() - 1, 1), "a bad record is skipped and counted");
    let mut header = bytes.clone();
    header[spans[3].offset as usize + 1] ^= 0x01; // the length of record 3
    std::fs::write(&shard, &header).unwrap();
    let msg = ShardedDataset::open(std::slice::from_ref(&shard), CorruptPolicy::Fail).err().unwrap().to_string();
    assert!(msg.contains("record 3") && msg.contains("--skip-corrupt"), "{msg}");
    let skipping = ShardedDataset::open(std::slice::from_ref(&shard), CorruptPolicy::Skip).unwrap();
    assert_eq!((skipping.len(), skipping.skipped()), (3, 1));
    assert_eq!(skipping.unframed_bytes(), bytes.len() as u64 - spans[3].offset, "what the bad header cut off");
    // A length field near u64::MAX with a valid checksum: an error, not an overflow.
    let len = (u64::MAX - 3).to_le_bytes();
    let mut huge = len.to_vec();
    huge.extend(masked_crc32c(&len).to_le_bytes());
    huge.extend([0u8; 8]);
    std::fs::write(&shard, &huge).unwrap();
    let msg = ShardedDataset::open(std::slice::from_ref(&shard), CorruptPolicy::Skip).err().unwrap().to_string();
    assert!(msg.contains("truncated record data"), "{msg}");
    std::fs::write(&shard, &bytes[..bytes.len() - 5]).unwrap();
    let msg = ShardedDataset::open(&[shard], CorruptPolicy::Skip).err().unwrap().to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

/// Preparing again into a folder replaces its shards (8 shards, then 4:
/// no leftovers are read), and a folder whose shards are not one complete
/// set is refused by name.
#[test]
fn a_second_prepare_replaces_the_first_ones_shards() {
    let (dir, tok, _) = prepared("reprepare", 8);
    let options = PrepareOptions {
        block_size: 32,
        num_shards: 4,
        validation_fraction: 0.1,
        seed: 1,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tok, &corpus(), &dir, &options).unwrap();
    let files = find_shards(&dir, "train").unwrap();
    assert_eq!(files.len(), 4, "{files:?}");
    let data = ShardedDataset::open(&files, CorruptPolicy::Fail).unwrap();
    assert_eq!(data.len() as u64, manifest.train_records());
    std::fs::copy(dir.join("train-00000-of-00004.tfrecord"), dir.join("train-00000-of-00002.tfrecord")).unwrap();
    let msg = find_shards(&dir, "train").err().unwrap().to_string();
    assert!(msg.contains("not one complete set") && msg.contains("train-00000-of-00002.tfrecord"), "{msg}");
    std::fs::remove_file(dir.join("train-00000-of-00002.tfrecord")).unwrap();
    std::fs::remove_file(dir.join("train-00003-of-00004.tfrecord")).unwrap();
    let msg = find_shards(&dir, "train").err().unwrap().to_string();
    assert!(msg.contains("not one complete set of 4"), "a missing shard: {msg}");
}

/// A preparation that fails half-way (a bad line deep in a file, too
/// little text) leaves the folder's earlier preparation as it was; one fed
/// by the readers as they read writes what one of collected documents does.
#[test]
fn a_failed_prepare_keeps_the_earlier_one_and_a_streamed_one_matches() {
    let (dir, tok, manifest) = prepared("keep", 2);
    let listing = common::folder_contents;
    let before = listing(&dir);
    let options = PrepareOptions {
        block_size: 32,
        num_shards: 2,
        validation_fraction: 0.1,
        seed: 1,
        progress: false,
        ..Default::default()
    };
    let texts = tmp("keep-texts");
    // Past the first batch of documents, so shards were being written.
    let mut bad = [corpus(), corpus()].concat().join("\n").into_bytes();
    assert!(corpus().len() > 2048);
    bad.extend_from_slice(b"\nfine\n\xff\n");
    std::fs::write(texts.join("bad.txt"), &bad).unwrap();
    let mut preparation = Preparation::new(&tok, &dir, &options, false).unwrap();
    let err = read_all_into(&[texts.join("bad.txt")], &TextSource::default(), &mut preparation).unwrap_err();
    assert!(err.to_string().contains("invalid UTF-8"), "{err}");
    drop(preparation);
    assert_eq!(listing(&dir), before, "the earlier preparation is untouched, nothing is left behind");
    let err = prepare(&tok, &["too short".to_string()], &dir, &options).unwrap_err().to_string();
    assert!(err.contains("fewer than one block"), "{err}");
    assert_eq!(listing(&dir), before);
    // An output folder the failed preparation created is removed again.
    let fresh = texts.join("fresh-output");
    assert!(prepare(&tok, &["too short".to_string()], &fresh.join("a/b"), &options).is_err());
    assert!(!fresh.exists() && texts.exists(), "the folders it made are removed, only those");
    let mut unannounced = Preparation::new(&tok, &fresh, &options, false).unwrap();
    let err = unannounced.held_out().unwrap_err().to_string();
    assert!(err.contains("not announced"), "{err}");
    drop(unannounced);

    std::fs::write(texts.join("good.txt"), corpus().join("\n")).unwrap();
    let streamed = tmp("keep-streamed");
    let mut preparation = Preparation::new(&tok, &streamed, &options, false).unwrap();
    read_all_into(&[texts.join("good.txt")], &TextSource::default(), &mut preparation).unwrap();
    assert_eq!(preparation.finish().unwrap(), manifest);
    assert_eq!(listing(&streamed), before, "the same shards, sidecars and manifest");
}

/// A document longer than the tokenizers can take at once (over 1 MiB) is
/// tokenized in pieces cut where words end: its blocks hold the tokens of
/// the whole document, in every tokenizer style.
#[test]
fn a_document_over_a_mebibyte_gives_the_tokens_of_the_whole() {
    let sentences = corpus();
    let mut long = String::new();
    for (i, sentence) in sentences.iter().cycle().enumerate() {
        if long.len() > (1 << 20) + 50_000 {
            break;
        }
        // Runs of spaces, tabs and non-ASCII text between the sentences.
        long.push_str(["  ", " ", "\t ", " — é "][i % 4]);
        long.push_str(sentence);
    }
    for (model, style) in [
        (SubwordModel::WordPiece, TokenizerStyle::Bert),
        (SubwordModel::Unigram, TokenizerStyle::Roberta),
        (SubwordModel::Bpe, TokenizerStyle::Gpt2),
    ] {
        let tok = train_tokenizer(&sentences, model, 300, style).unwrap();
        let mut whole = tok.encode(&long, true).unwrap();
        whole.extend((style == TokenizerStyle::Gpt2).then_some(tok.special().end));
        let dir = tmp("long-document");
        let options = PrepareOptions {
            block_size: 64,
            num_shards: 1,
            validation_fraction: 0.0,
            progress: false,
            ..Default::default()
        };
        let manifest = prepare(&tok, std::slice::from_ref(&long), &dir, &options).unwrap();
        let data = ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap();
        let packed: Vec<u32> =
            (0..data.len()).flat_map(|k| data.feature(k, "input_ids").unwrap()).map(|t| t as u32).collect();
        assert_eq!(packed.len() as u64 + manifest.dropped_tokens, whole.len() as u64, "{model:?}");
        assert!(packed == whole[..packed.len()], "{model:?}: the pieces tokenize as the whole");
    }
}

/// A validation fraction too small to draw any block still holds one out,
/// and input too short to split is refused.
#[test]
fn a_validation_split_is_never_empty() {
    let tok = train_tokenizer(&corpus(), SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap();
    let dir = tmp("tiny-validation");
    let options = PrepareOptions {
        block_size: 32,
        num_shards: 1,
        validation_fraction: 1e-9,
        seed: 1,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tok, &corpus(), &dir, &options).unwrap();
    assert_eq!(manifest.validation.iter().map(|s| s.records).sum::<u64>(), 1);
    assert!(manifest.train_records() > 1);
    let short = vec![corpus()[0].clone()];
    let block_size = tok.encode(&short[0], true).unwrap().len();
    let options = PrepareOptions {
        block_size,
        num_shards: 1,
        validation_fraction: 0.5,
        seed: 1,
        progress: false,
        ..Default::default()
    };
    let msg = prepare(&tok, &short, &dir, &options).err().unwrap().to_string();
    assert!(msg.contains("too few to hold out") && msg.contains("--validation-fraction 0"), "{msg}");
}

fn collator(tok: &TextTokenizer) -> MlmCollator {
    MlmCollator::for_tokenizer(tok, 0.15, 9).unwrap()
}

fn collect(loader: DeviceLoader) -> Vec<(u64, usize, Vec<i64>, Vec<i64>)> {
    loader
        .map(|b| {
            let b = b.unwrap();
            (b.epoch, b.first_sample, b.input_ids.to_vec::<i64>().unwrap(), b.labels.to_vec::<i64>().unwrap())
        })
        .collect()
}

/// Collates like `inner` until `after` batches, then panics.
struct PanicsAfter<C> {
    inner: C,
    after: std::sync::atomic::AtomicUsize,
}

impl<C: Collator> Collator for PanicsAfter<C> {
    fn collate_records(
        &self,
        data: &ShardedDataset,
        records: &[usize],
        epoch: u64,
    ) -> lazytrain_data::Result<HostBatch> {
        if self.after.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("collator bug at record {}", records[0]);
        }
        self.inner.collate_records(data, records, epoch)
    }
}

/// A worker that panics is an error after the batches it made, never a
/// quiet end of the data; a saved position past the end of an epoch (even
/// near `usize::MAX`) starts the next epoch.
#[test]
fn a_loader_thread_panic_is_an_error_and_far_positions_do_not_overflow() {
    let (dir, tok, _) = prepared("loader-panic", 1);
    let data = Arc::new(ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap());
    let dev = Device::cpu();
    let plan = LoaderPlan { batch_size: 2, prefetch: 1, start_epoch: 0, start_sample: 0, max_batches: None, epochs: 1 };
    let sampler = || EpochSampler::new(data.len(), 5, true, 0, 1).unwrap();
    let panicking = PanicsAfter { inner: collator(&tok), after: 2.into() };
    let results: Vec<_> = DeviceLoader::new(data.clone(), sampler(), panicking, plan, &dev).unwrap().collect();
    assert_eq!(results.len(), 3, "two batches, then the error");
    assert!(results[..2].iter().all(Result::is_ok));
    let msg = results[2].as_ref().err().unwrap().to_string();
    assert!(msg.contains("loader thread panicked") && msg.contains("collator bug at record"), "{msg}");
    let far = LoaderPlan { start_sample: usize::MAX - 1, epochs: 2, ..plan };
    let batches = collect(DeviceLoader::new(data.clone(), sampler(), collator(&tok), far, &dev).unwrap());
    assert_eq!(batches.len(), data.len() / 2, "one whole epoch, the second");
    assert!(batches.iter().all(|b| b.0 == 1));
}

#[test]
fn the_loader_resumes_exactly_and_marks_steps() {
    let (dir, tok, _) = prepared("loader", 2);
    let data = Arc::new(ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap());
    let dev = Device::cpu();
    let plan = LoaderPlan { batch_size: 4, prefetch: 2, start_epoch: 0, start_sample: 0, max_batches: None, epochs: 2 };
    let sampler = || EpochSampler::new(data.len(), 5, true, 0, 1).unwrap();
    let full = collect(DeviceLoader::new(data.clone(), sampler(), collator(&tok), plan, &dev).unwrap());
    let per_epoch = data.len() / 4;
    assert_eq!(full.len(), 2 * per_epoch);
    let k = per_epoch + 3;
    let resumed_plan = LoaderPlan { start_epoch: full[k].0, start_sample: full[k].1, ..plan };
    let resumed = collect(DeviceLoader::new(data.clone(), sampler(), collator(&tok), resumed_plan, &dev).unwrap());
    assert_eq!(resumed, full[k..].to_vec(), "seeking to sample k continues the same sequence");
    assert_ne!(full[0].2, full[per_epoch].2, "epochs are reshuffled");
    // Each batch after the first marked a step; a step that traced work runs it.
    let loader =
        DeviceLoader::new(data.clone(), sampler(), collator(&tok), LoaderPlan { max_batches: Some(3), ..plan }, &dev)
            .unwrap();
    let mut sums = Vec::new();
    for batch in loader {
        sums.push(batch.unwrap().input_ids.sum_all().unwrap());
    }
    assert!(sums.iter().all(|s| !s.is_pending()), "the loader's step barrier materialised every step");
    assert_eq!(dev.metrics().forced_sync_count(), 0);
}

#[test]
fn replicas_read_disjoint_shares() {
    let (dir, _, _) = prepared("replicas", 2);
    let data = ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap();
    let n = data.len();
    let mut all = Vec::new();
    for r in 0..3 {
        let mut s = EpochSampler::new(n, 11, true, r, 3).unwrap();
        all.extend((0..s.samples_per_epoch()).map(|k| s.record(0, k)));
    }
    let mut unique = all.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "no overlap");
    assert_eq!(all.len(), n / 3 * 3, "everything but the remainder");
}

/// Malformed `tokenizer.json` files the fuzzer found that panic inside the
/// `tokenizers` crate (at load, or at every encode) are parse errors.
#[test]
fn tokenizer_files_that_panic_the_library_are_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-tokenizers");
    for (file, expected) in [
        ("decoder-key-not-a-string.json", "the tokenizers library failed"),
        ("undefined-template-token.json", "its post-processor or model is inconsistent"),
        ("empty-prepend-normalizer.json", "Prepend normalizer with an empty string"),
    ] {
        let err = TextTokenizer::from_path(&dir.join(file)).err().expect("refused").to_string();
        assert!(err.contains(file) && err.contains(expected), "{file}: {err}");
    }
}

/// `prepare` writes an index sidecar per shard that equals a scan of it;
/// a sidecar that does not frame its shard is refused by name.
#[test]
fn index_sidecars_match_a_scan_and_are_checked() {
    let (dir, _, _) = prepared("sidecar", 2);
    let shard = dir.join("train-00001-of-00002.tfrecord");
    let sidecar = index_path(&shard);
    let text = std::fs::read_to_string(&sidecar).unwrap();
    let source = LocalShard::open(&shard).unwrap();
    let indexed = RecordIndex::from_sidecar(&source, "idx", &text).unwrap();
    // A record longer than any prepared one: corrupt, refused by line.
    let msg = RecordIndex::from_sidecar(&source, "idx", "0 2000000000\n").unwrap_err().to_string();
    assert!(msg.contains("line 1: a record of 2000000000 bytes (at most 1073741824 of data)"), "{msg}");
    assert_eq!(indexed.spans, RecordIndex::scan(&shard, CorruptPolicy::Fail).unwrap().spans);
    let bytes = std::fs::read(&shard).unwrap();
    for k in [0, indexed.spans.len() - 1] {
        let span = indexed.spans[k];
        let data = &bytes[(span.offset + 12) as usize..][..span.len as usize];
        assert_eq!(indexed.read_from(&source, k).unwrap(), data);
    }
    let dropped_line: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    let msg = RecordIndex::from_sidecar(&source, "the.idx", &dropped_line).unwrap_err().to_string();
    assert!(msg.contains("the.idx") && msg.contains("line 1") && msg.contains("delete the index"), "{msg}");
    let short: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    let msg = RecordIndex::from_sidecar(&source, "the.idx", &short).unwrap_err().to_string();
    assert!(msg.contains("the index covers") && msg.contains("prepare the data again"), "{msg}");
    let msg = RecordIndex::from_sidecar(&source, "the.idx", "0 x\n").unwrap_err().to_string();
    assert!(msg.contains("expected `offset size`"), "{msg}");
    // A sidecar that frames the shard differently: the record header disagrees.
    let (a, b) = (indexed.spans[0], indexed.spans[1]);
    let (size_a, size_b) = (a.len + 16, b.len + 16);
    // A record size that would run past 2^64.
    let huge = format!("0 {size_a}\n{size_a} {}\n", u64::MAX);
    let msg = RecordIndex::from_sidecar(&source, "the.idx", &huge).unwrap_err().to_string();
    assert!(msg.contains("the.idx: line 2: a record of 18446744073709551615 bytes"), "{msg}");
    let rest: String = text.lines().skip(2).map(|l| format!("{l}\n")).collect();
    if size_a != size_b {
        let swapped = format!("0 {size_b}\n{size_b} {size_a}\n{rest}");
        let index = RecordIndex::from_sidecar(&source, "the.idx", &swapped).unwrap();
        let msg = index.read_from(&source, 0).unwrap_err().to_string();
        assert!(msg.contains("record header does not match the index"), "{msg}");
    }
}
