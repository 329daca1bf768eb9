//! Fuzzing every parser of user files with structure-aware mutations of
//! valid files (bit flips, truncations, huge lengths, wrong JSON types,
//! missing keys), on stable as a bounded test: no input may panic, abort,
//! hang or allocate more than 1 GiB at once (the allocator below refuses,
//! which aborts the process). `LAZYTRAIN_FUZZ_ITERATIONS` (default 150 per
//! harness, seconds in all) sets the budget and `LAZYTRAIN_FUZZ_HARNESSES`
//! (names, comma-separated) picks harnesses; the README gives a long run's
//! counts. A failing input is written to `target/tmp/fuzz-failures/`.

use lazytrain::trainer::{RngState, SchedulerState, TrainerState, TrainingArguments};
use lazytrain_core::Device;
use lazytrain_data::classification::ClassificationManifest;
use lazytrain_data::dataset::ShardedDataset;
use lazytrain_data::example::{decode_int64_example, encode_int64_example};
use lazytrain_data::formats::TextSource;
use lazytrain_data::prepare::Manifest;
use lazytrain_data::tfrecord::{CorruptPolicy, RecordWriter};
use lazytrain_data::TextTokenizer;
use lazytrain_models::ModelConfig;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The allocator of this test binary: any single allocation above 1 GiB is
/// refused (Rust then aborts), so a header announcing 2^60 bytes that a
/// parser believed fails the run instead of passing unnoticed.
struct Bounded;

const MAX_ALLOCATION: usize = 1 << 30;

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

/// An input slower than this is reported as a hang.
const SLOW: Duration = Duration::from_secs(5);

/// xorshift64*: the mutations are reproducible from the harness name.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        Rng(name.bytes().fold(0x9e37_79b9_7f4a_7c15, |h, b| (h ^ b as u64).wrapping_mul(0x1000_0000_01b3)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break length fields and counters.
const HUGE: [u64; 6] = [u64::MAX, 1 << 60, 1 << 40, u32::MAX as u64, 1 << 31, 0];

/// Byte-level mutations: flips, interesting bytes, truncation, duplication,
/// insertion, and huge little-endian integers over any 8 bytes.
fn mutate_bytes(input: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = [0x00, 0xff, 0x7f, 0x80, b'"', b'{', b'['][rng.below(7)];
            }
            2 => out.truncate(rng.below(len + 1)),
            3 if len > 0 => {
                let (a, b) = (rng.below(len), rng.below(len));
                let chunk = out[a.min(b)..a.max(b)].to_vec();
                let at = rng.below(len);
                out.splice(at..at, chunk);
            }
            4 => {
                let at = rng.below(len + 1);
                let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                out.splice(at..at, extra);
            }
            5 if len >= 8 => {
                let at = rng.below(len - 7);
                out[at..at + 8].copy_from_slice(&HUGE[rng.below(HUGE.len())].to_le_bytes());
            }
            _ if len >= 4 => {
                let at = rng.below(len - 3);
                out[at..at + 4].copy_from_slice(&(HUGE[rng.below(HUGE.len())] as u32).to_le_bytes());
            }
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

/// A JSON value with one node replaced: a wrong type, a huge or negative
/// number, a removed key, an empty or very long string, deep nesting.
fn mutate_json(value: &mut serde_json::Value, rng: &mut Rng) {
    use serde_json::{json, Value};
    let replacement = |rng: &mut Rng| match rng.below(9) {
        0 => Value::Null,
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(1e300),
        4 => json!(""),
        5 => json!("x".repeat(1 + rng.below(5000))),
        6 => json!([[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]),
        7 => json!({"unexpected": true}),
        _ => json!(true),
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.below(keys.len())];
            match rng.below(4) {
                0 => {
                    map.remove(key);
                }
                1 => mutate_json(map.get_mut(key).unwrap(), rng),
                _ => {
                    map.insert(key.clone(), replacement(rng));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.below(items.len());
            match rng.below(3) {
                0 => {
                    items.remove(i);
                }
                1 => mutate_json(&mut items[i], rng),
                _ => items[i] = replacement(rng),
            }
        }
        other => *other = replacement(rng),
    }
}

/// Feeds one input to a parser (errors are fine; panics are not).
type Parse = Box<dyn Fn(&[u8])>;

/// One parser under test: its valid seed files and how to feed it bytes.
struct Harness {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    /// Seeds are JSON: also mutate their structure.
    json: bool,
    run: Parse,
}

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

/// A fresh scratch folder for one harness, removed with the harness.
fn scratch(name: &str) -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new(&format!("fuzz-{name}")).unwrap()
}

/// Write `bytes` to `dir/file` (the parsers under test read files).
fn put(dir: &Path, file: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn json_harness<T: serde::de::DeserializeOwned + 'static>(name: &'static str, seed: String, check: fn(T)) -> Harness {
    Harness {
        name,
        seeds: vec![seed.into_bytes()],
        json: true,
        run: Box::new(move |bytes| {
            if let Ok(value) = serde_json::from_slice::<T>(bytes) {
                check(value);
            }
        }),
    }
}

fn harnesses() -> Vec<Harness> {
    let device = Device::cpu();
    let mut list = Vec::new();

    // TFRecord framing and the records' tf.train.Example protobufs.
    let dir = scratch("tfrecord");
    let mut writer = RecordWriter::create(&dir.join("seed.tfrecord")).unwrap();
    for k in 0..3i64 {
        writer
            .write(&encode_int64_example(&[("input_ids", &[k, 5, 6, 7]), ("attention_mask", &[1, 1, 1, 1])]))
            .unwrap();
    }
    writer.finish().unwrap();
    let seed = std::fs::read(dir.join("seed.tfrecord")).unwrap();
    list.push(Harness {
        name: "tfrecord",
        seeds: vec![seed],
        json: false,
        run: Box::new(move |bytes| {
            let path = put(&dir, "shard.tfrecord", bytes);
            for policy in [CorruptPolicy::Fail, CorruptPolicy::Skip] {
                if let Ok(data) = ShardedDataset::open(std::slice::from_ref(&path), policy) {
                    for k in 0..data.len() {
                        let _ = data.feature(k, "input_ids");
                    }
                }
            }
        }),
    });
    list.push(Harness {
        name: "tf.train.Example",
        seeds: vec![encode_int64_example(&[("input_ids", &[1, 300, -5, i64::MAX]), ("label", &[2])])],
        json: false,
        run: Box::new(|bytes| {
            let _ = decode_int64_example(bytes);
        }),
    });

    // safetensors headers and tensors against the config (shapes, dtypes, offsets).
    let dir = scratch("safetensors");
    put(&dir, "config.json", &fixture("lazytrain-models/tests/fixtures/tiny-bert/config.json"));
    let dev = device.clone();
    list.push(Harness {
        name: "safetensors",
        seeds: vec![fixture("lazytrain-models/tests/fixtures/tiny-bert/model.safetensors")],
        json: false,
        run: Box::new(move |bytes| {
            put(&dir, "model.safetensors", bytes);
            let _ = lazytrain_models::hub::load_masked_lm(&dir, &dev);
        }),
    });

    // config.json (BERT/RoBERTa and GPT-2 field names).
    let configs = ["tiny-bert", "tiny-roberta", "tiny-gpt2"]
        .map(|m| fixture(&format!("lazytrain-models/tests/fixtures/{m}/config.json")))
        .to_vec();
    list.push(Harness {
        name: "config.json",
        seeds: configs,
        json: true,
        run: Box::new(|bytes| {
            if let Ok(text) = std::str::from_utf8(bytes) {
                let _ = ModelConfig::from_json(text, "config.json");
            }
        }),
    });

    // tokenizer.json (and tokenizer_config.json, read through the folder).
    let dir = scratch("tokenizer");
    put(&dir, "tokenizer_config.json", &fixture("lazytrain-models/tests/fixtures/tiny-bert/tokenizer_config.json"));
    list.push(Harness {
        name: "tokenizer.json",
        seeds: vec![
            fixture("lazytrain-models/tests/fixtures/tiny-bert/tokenizer.json"),
            fixture("lazytrain-models/tests/fixtures/tiny-gpt2/tokenizer.json"),
        ],
        json: true,
        run: Box::new(move |bytes| {
            put(&dir, "tokenizer.json", bytes);
            if let Ok(tok) = TextTokenizer::from_path(&dir) {
                let _ = tok.encode("the capital of france is [MASK] .", true);
            }
        }),
    });

    // manifest.json of prepare and of prepare-classification (with labels).
    let dir = scratch("manifest");
    let manifest = serde_json::json!({
        "block_size": 16, "train": [{"file": "train-00000-of-00001.tfrecord", "records": 3}],
        "validation": [], "tokenizer_hash": "0123abcd", "vocab_size": 99, "seed": 0,
        "documents": 4, "tokens": 50, "dropped_tokens": 2,
    });
    list.push(Harness {
        name: "manifest.json",
        seeds: vec![manifest.to_string().into_bytes()],
        json: true,
        run: Box::new(move |bytes| {
            put(&dir, "manifest.json", bytes);
            if let Ok(m) = Manifest::read(&dir) {
                let _ = m.train_records();
            }
            let _ = ClassificationManifest::read(&dir);
        }),
    });

    // trainer_state.json, rng_state.json, scheduler.json (resume state).
    let state = serde_json::to_string(&TrainerState::default()).unwrap();
    list.push(json_harness::<TrainerState>("trainer_state.json", state, |s| drop(serde_json::to_string(&s))));
    let rng = serde_json::json!({"seed": 42, "dropout_step": 3, "data_epoch": 1, "data_sample": 16, "replicas": 1})
        .to_string();
    list.push(json_harness::<RngState>("rng_state.json", rng, |s| drop(serde_json::to_string(&s))));
    let scheduler = serde_json::json!({
        "lr_scheduler_type": "linear", "base_lr": 0.001, "warmup_steps": 2, "total_steps": 10, "last_step": 4,
    })
    .to_string();
    list.push(json_harness::<SchedulerState>("scheduler.json", scheduler, |s| drop(serde_json::to_string(&s))));

    // Training configs as TOML and JSON.
    let dir = std::sync::Arc::new(scratch("training-config"));
    let args = TrainingArguments::default();
    let toml_seed = toml::to_string(&args).unwrap().into_bytes();
    let dir2 = std::sync::Arc::clone(&dir);
    list.push(Harness {
        name: "training config (TOML)",
        seeds: vec![toml_seed],
        json: false,
        run: Box::new(move |bytes| {
            if let Ok(a) = TrainingArguments::from_file(&put(&dir, "args.toml", bytes)) {
                let _ = a.validate(true);
            }
        }),
    });
    list.push(Harness {
        name: "training config (JSON)",
        seeds: vec![serde_json::to_vec(&args).unwrap()],
        json: true,
        run: Box::new(move |bytes| {
            if let Ok(a) = TrainingArguments::from_file(&put(&dir2, "args.json", bytes)) {
                let _ = a.validate(true);
            }
        }),
    });

    // Rows of text and labelled data, and the columnar formats.
    let formats = "lazytrain-data/tests/fixtures/formats";
    for (name, file) in [
        ("JSON Lines", "corpus.jsonl"),
        ("JSON Lines (zstd)", "corpus.jsonl.zst"),
        ("JSON array", "corpus-array.json"),
        ("CSV", "corpus.csv"),
        ("Parquet", "corpus-snappy.parquet"),
        ("Parquet (gzip)", "corpus-gzip.parquet"),
        ("Parquet (LZ4)", "corpus-lz4.parquet"),
        ("Arrow stream", "corpus.arrow"),
        ("Feather", "corpus.feather"),
        ("Arrow file", "corpus-file.arrow"),
        ("Feather (LZ4)", "corpus-lz4.feather"),
        ("Feather (LZ4 dictionary)", "corpus-lz4-dictionary.feather"),
        ("Arrow stream (zstd)", "corpus-zstd.arrow"),
    ] {
        let dir = scratch(&name.replace(' ', "-"));
        list.push(Harness {
            name,
            seeds: vec![fixture(&format!("{formats}/{file}"))],
            json: false,
            run: Box::new(move |bytes| {
                let _ = lazytrain_data::text::read_documents(&put(&dir, file, bytes), &TextSource::default());
            }),
        });
    }
    for (name, file) in [
        ("labelled JSON Lines", "labelled.jsonl"),
        ("labelled JSON array", "labelled-array.json"),
        ("labelled Parquet", "labelled.parquet"),
        ("labelled Feather (LZ4)", "labelled-lz4.feather"),
    ] {
        let dir = scratch(&name.replace(' ', "-"));
        list.push(Harness {
            name,
            seeds: vec![fixture(&format!("{formats}/{file}"))],
            json: false,
            run: Box::new(move |bytes| {
                let columns = lazytrain_data::classification::Columns {
                    text: "text".into(),
                    text_pair: None,
                    label: "label".into(),
                };
                let mut counts = Default::default();
                let path = put(&dir, file, bytes);
                let _ = lazytrain_data::classification::rows::read_labelled_file(&path, &columns, true, &mut counts);
                let _ = lazytrain_data::classification::rows::read_labelled_file(&path, &columns, false, &mut counts);
            }),
        });
    }
    list
}

/// Run `iterations` mutated inputs through `harness`; returns the count.
fn fuzz(harness: &Harness, iterations: usize) -> usize {
    let mut rng = Rng::new(harness.name);
    for i in 0..iterations {
        let seed = &harness.seeds[i % harness.seeds.len()];
        let input = match (harness.json, rng.below(2)) {
            (true, 0) => match serde_json::from_slice::<serde_json::Value>(seed) {
                Ok(mut value) => {
                    for _ in 0..1 + rng.below(3) {
                        mutate_json(&mut value, &mut rng);
                    }
                    serde_json::to_vec(&value).unwrap()
                }
                Err(_) => mutate_bytes(seed, &mut rng),
            },
            _ => mutate_bytes(seed, &mut rng),
        };
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (harness.run)(&input)));
        let slow = start.elapsed() > SLOW;
        if outcome.is_err() || slow {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{}-{i}.bin", harness.name.replace([' ', '(', ')', '/'], "_")));
            std::fs::write(&file, &input).unwrap();
            panic!(
                "{}: input {i} {} (saved to {})",
                harness.name,
                if slow { "took longer than 5 s" } else { "panicked" },
                file.display()
            );
        }
    }
    iterations
}

#[test]
fn no_parser_of_user_files_panics_hangs_or_overallocates() {
    let iterations: usize = std::env::var("LAZYTRAIN_FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    // The seeds themselves are valid: each harness parses them without error.
    // A long run may take only some harnesses (`LAZYTRAIN_FUZZ_HARNESSES=Parquet,Arrow stream`).
    let only: Option<Vec<String>> =
        std::env::var("LAZYTRAIN_FUZZ_HARNESSES").ok().map(|v| v.split(',').map(|n| n.trim().to_string()).collect());
    let start = Instant::now();
    let mut total = 0;
    for harness in
        harnesses().into_iter().filter(|h| only.as_ref().is_none_or(|names| names.iter().any(|n| n == h.name)))
    {
        for seed in &harness.seeds {
            (harness.run)(seed);
        }
        let count = fuzz(&harness, iterations);
        eprintln!("{:<24} {count} inputs, 0 failures", harness.name);
        total += count;
    }
    eprintln!("{total} inputs in {:.1} s", start.elapsed().as_secs_f64());
}
