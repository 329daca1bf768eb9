//! Labelled data: the three file formats, padding to buckets, truncation,
//! pairs, labels.json, every bad-row class, and batches with one label per
//! sequence.

mod common;

use lazytrain_core::Device;
use lazytrain_data::classification::demo_task::sentiment_reviews;
use lazytrain_data::classification::{
    prepare_classification, BadRowKind, ClassificationCollator, ClassificationManifest, ClassificationOptions, Columns,
    LabelOrder,
};
use lazytrain_data::collator::Collator;
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::dataset::{find_shards, EpochSampler, ShardedDataset};
use lazytrain_data::loader::{DeviceLoader, LoaderPlan};
use lazytrain_data::tfrecord::CorruptPolicy;
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::{TextTokenizer, TokenizerStyle};
use std::path::Path;

/// A fresh scratch folder, removed when the test passes.
fn tmp(name: &str) -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new(&format!("cls-{name}")).unwrap()
}

fn tokenizer() -> TextTokenizer {
    let countries = demo_corpus(0, 8, 0).countries;
    let docs: Vec<String> = sentiment_reviews(0, &countries, 2000).into_iter().map(|r| r.text).collect();
    train_tokenizer(&docs, SubwordModel::WordPiece, 300, TokenizerStyle::Bert).unwrap()
}

fn options(max_length: usize, buckets: Vec<usize>) -> ClassificationOptions {
    ClassificationOptions {
        columns: Columns { text: "text".into(), text_pair: None, label: "label".into() },
        max_length,
        buckets,
        label_order: LabelOrder::Sorted,
        num_shards: 2,
        validation_fraction: 0.0,
        seed: 1,
        skip_bad_rows: false,
        progress: false,
    }
}

/// Every record's `(input_ids, attention_mask, token_type_ids, label)`, in shard order.
fn records(dir: &Path) -> Vec<Vec<Vec<i64>>> {
    let data = ShardedDataset::open(&find_shards(dir, "train").unwrap(), CorruptPolicy::Fail).unwrap();
    (0..data.len())
        .map(|k| data.features(k, &["input_ids", "attention_mask", "token_type_ids", "label"]).unwrap())
        .collect()
}

const ROWS: [(&str, &str); 4] = [
    ("the hotel was lovely , and \"clean\"", "pos"),
    ("the food was awful", "neg"),
    ("our trip was not great", "neg"),
    ("the park is superb", "pos"),
];

#[test]
fn jsonl_csv_and_tsv_give_the_same_records() {
    let dir = tmp("formats");
    let tok = tokenizer();
    let mut jsonl = String::new();
    let mut csv = String::from("label,text\n");
    let mut tsv = String::from("text\tlabel\n");
    for (text, label) in ROWS {
        jsonl.push_str(&format!("{}\n", serde_json::json!({"text": text, "label": label, "id": 7})));
        csv.push_str(&format!("{label},\"{}\"\n", text.replace('"', "\"\"")));
        tsv.push_str(&format!("\"{}\"\t{label}\n", text.replace('"', "\"\"")));
    }
    let mut outputs = Vec::new();
    for (name, body) in [("rows.jsonl", jsonl), ("rows.csv", csv), ("rows.tsv", tsv)] {
        std::fs::write(dir.join(name), body).unwrap();
        let out = dir.join(format!("out-{name}"));
        let m = prepare_classification(&tok, &[dir.join(name)], &[], &out, &options(32, vec![16])).unwrap();
        assert_eq!(
            (m.labels.clone(), m.rows, m.truncated, m.buckets.clone()),
            (vec!["neg".into(), "pos".into()], 4, 0, vec![16, 32])
        );
        outputs.push(records(&out));
        let labels: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("labels.json")).unwrap()).unwrap();
        assert_eq!(labels["id2label"], serde_json::json!({"0": "neg", "1": "pos"}));
        assert_eq!(labels["label2id"], serde_json::json!({"neg": 0, "pos": 1}));
        assert_eq!(labels["order"], "sorted");
        assert_eq!(ClassificationManifest::read(&out).unwrap(), m);
    }
    assert_eq!(outputs[0], outputs[1], "csv == jsonl");
    assert_eq!(outputs[0], outputs[2], "tsv == jsonl");
    let mut expected_labels: Vec<i64> = ROWS.iter().map(|(_, l)| i64::from(*l == "pos")).collect();
    let mut got: Vec<i64> = outputs[0].iter().map(|r| r[3][0]).collect();
    expected_labels.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, expected_labels);
    for record in &outputs[0] {
        let (ids, mask) = (&record[0], &record[1]);
        assert_eq!(ids.len(), 16, "short rows pad to the first bucket");
        let tokens = mask.iter().filter(|&&m| m == 1).count();
        assert_eq!(ids[0], tok.special().start as i64);
        assert_eq!(ids[tokens - 1], tok.special().end as i64);
        assert!(ids[tokens..].iter().all(|&t| t == tok.special().pad as i64));
    }
}

/// Rows stream through in chunks: row `i` of the training files is held
/// out when draw `i` of the seed says so, training row `k` lands in shard
/// `k % shards` in order, across chunk boundaries; a preparation that then
/// fails (an unknown validation label) leaves the earlier one as it was.
#[test]
fn rows_stream_in_chunks_and_a_failed_preparation_keeps_the_earlier_one() {
    let dir = tmp("chunks");
    let tok = tokenizer();
    let names = ["neg", "pos", "meh"];
    let labels: Vec<&str> = (0..2600).map(|i| names[(i * 7 + i / 5) % 3]).collect();
    let body: String = labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            format!("{}\n", serde_json::json!({"text": format!("review {i} of the hotel"), "label": label}))
        })
        .collect();
    std::fs::write(dir.join("rows.jsonl"), body).unwrap();
    let out = dir.join("out");
    let options = ClassificationOptions { validation_fraction: 0.1, num_shards: 3, ..options(16, vec![]) };
    let manifest = prepare_classification(&tok, &[dir.join("rows.jsonl")], &[], &out, &options).unwrap();
    let mut draws = vec![0f32; labels.len()];
    lazytrain_core::random::uniform_f32(options.seed, 0xc1a5, &mut draws);
    let (held, kept): (Vec<_>, Vec<_>) = labels.iter().zip(&draws).partition(|(_, &u)| (u as f64) < 0.1);
    assert_eq!(manifest.validation[0].records, held.len() as u64);
    assert_eq!(manifest.rows, labels.len() as u64);
    let id = |label: &str| manifest.labels.iter().position(|l| l == label).unwrap() as i64;
    let shards: Vec<Vec<i64>> = find_shards(&out, "train")
        .unwrap()
        .iter()
        .map(|shard| {
            let data = ShardedDataset::open(std::slice::from_ref(shard), CorruptPolicy::Fail).unwrap();
            (0..data.len()).map(|k| data.feature(k, "label").unwrap()[0]).collect()
        })
        .collect();
    let in_order: Vec<i64> = (0..kept.len()).map(|k| shards[k % 3][k / 3]).collect();
    assert_eq!(in_order, kept.iter().map(|(l, _)| id(l)).collect::<Vec<_>>());

    let listing = common::folder_contents;
    let before = listing(&out);
    std::fs::write(
        dir.join("val.jsonl"),
        "{\"text\": \"fine\", \"label\": \"pos\"}\n{\"text\": \"x\", \"label\": \"odd\"}\n",
    )
    .unwrap();
    let err = prepare_classification(&tok, &[dir.join("rows.jsonl")], &[dir.join("val.jsonl")], &out, &options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("val.jsonl:2") && err.contains("label `odd` is not one of the training labels"), "{err}");
    assert_eq!(listing(&out), before, "the earlier preparation is untouched, nothing is left behind");
}

#[test]
fn pairs_get_segment_ids_and_long_rows_are_truncated_and_counted() {
    let dir = tmp("pairs");
    let tok = tokenizer();
    let long = "the hotel was lovely and clean ".repeat(20);
    let rows = [
        serde_json::json!({"premise": "the food was awful", "hypothesis": "the food was bad", "label": 1}),
        serde_json::json!({"premise": long, "hypothesis": "the hotel was good", "label": 0}),
        serde_json::json!({"premise": "the park is superb", "hypothesis": "the park is ugly", "label": 10}),
    ];
    let body: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join("nli.jsonl"), body).unwrap();
    let mut o = options(24, vec![]);
    o.columns = Columns { text: "premise".into(), text_pair: Some("hypothesis".into()), label: "label".into() };
    o.num_shards = 1;
    o.label_order = LabelOrder::FirstSeen;
    let m = prepare_classification(&tok, &[dir.join("nli.jsonl")], &[], &dir.join("out"), &o).unwrap();
    assert_eq!(m.labels, ["1", "0", "10"], "integer labels, first-seen order");
    assert_eq!(m.truncated, 1);
    let recs = records(&dir.join("out"));
    assert!(recs.iter().all(|r| r[0].len() == 24), "no buckets: everything pads to max_length");
    let long_row = &recs[1];
    assert!(long_row[1].iter().all(|&m| m == 1), "the truncated row fills max_length");
    let types = &recs[0][2];
    let second = types.iter().position(|&t| t == 1).expect("the second text has segment id 1");
    assert_eq!(recs[0][0][second - 1], tok.special().end as i64, "segment 1 starts after [SEP]");
    assert_eq!(recs[0][3], [0], "label \"1\" is id 0 in first-seen order");
    let mut sorted = o.clone();
    sorted.label_order = LabelOrder::Sorted;
    let m = prepare_classification(&tok, &[dir.join("nli.jsonl")], &[], &dir.join("sorted"), &sorted).unwrap();
    assert_eq!(m.labels, ["0", "1", "10"], "integer labels sort numerically");
    // [CLS] a [SEP] b [SEP]: a max_length of 3 leaves no room for text.
    let tight = ClassificationOptions { max_length: 3, ..o.clone() };
    let msg = prepare_classification(&tok, &[dir.join("nli.jsonl")], &[], &dir.join("tight"), &tight).err().unwrap();
    assert!(
        msg.to_string().contains("--max-length 3 leaves no room") && msg.to_string().contains("3 special"),
        "{msg}"
    );
    // Rows pad to their bucket: a length far beyond any model's is refused before any work.
    let huge = ClassificationOptions { max_length: 10_000_000, ..o.clone() };
    let msg = prepare_classification(&tok, &[dir.join("nli.jsonl")], &[], &dir.join("huge"), &huge).err().unwrap();
    assert!(msg.to_string().contains("--max-length 10000000 must be at most 65536"), "{msg}");
    let single = ClassificationOptions { max_length: 3, ..options(3, vec![]) };
    let two = "{\"text\": \"the park is superb\", \"label\": \"pos\"}\n{\"text\": \"awful\", \"label\": \"neg\"}\n";
    std::fs::write(dir.join("one.jsonl"), two).unwrap();
    let m = prepare_classification(&tok, &[dir.join("one.jsonl")], &[], &dir.join("single"), &single).unwrap();
    assert_eq!((m.max_length, m.truncated), (3, 1), "one text: [CLS] x [SEP] fits in 3, the longer row is cut");
}

fn error_for(name: &str, body: &[u8], validation: Option<&[u8]>) -> String {
    let dir = tmp(&format!("bad-{name}"));
    std::fs::write(dir.join(name), body).unwrap();
    let validation_files = match validation {
        Some(v) => {
            let path = dir.join(format!("eval-{name}"));
            std::fs::write(&path, v).unwrap();
            vec![path]
        }
        None => vec![],
    };
    let err = prepare_classification(
        &tokenizer(),
        &[dir.join(name)],
        &validation_files,
        &dir.join("out"),
        &options(32, vec![]),
    )
    .expect_err("bad rows are refused");
    err.to_string()
}

/// A file name, its bytes, an optional validation file and the expected message.
type Case<'a> = (&'a str, Vec<u8>, Option<&'a [u8]>, &'a str);

#[test]
fn every_bad_row_class_is_an_error_naming_file_and_line() {
    let good = "{\"text\": \"a\", \"label\": \"pos\"}\n{\"text\": \"b\", \"label\": \"neg\"}\n";
    let cases: Vec<Case> = vec![
        (
            "missing.jsonl",
            format!("{good}{{\"text\": \"c\"}}\n").into_bytes(),
            None,
            "missing.jsonl:3: missing column `label` (the row has: text)",
        ),
        (
            "null.jsonl",
            format!("{good}{{\"text\": null, \"label\": \"pos\"}}\n").into_bytes(),
            None,
            "null.jsonl:3: column `text` is null",
        ),
        (
            "big.jsonl",
            format!("{good}{{\"text\": \"c\", \"label\": 99999999999999999999999}}\n").into_bytes(),
            None,
            "big.jsonl:3: column `label` is a number that is not a 64-bit integer; a label must be",
        ),
        (
            "utf8.jsonl",
            [good.as_bytes(), b"{\"text\": \"\xff\xfe\", \"label\": \"pos\"}\n"].concat(),
            None,
            "utf8.jsonl:3: invalid UTF-8",
        ),
        ("json.jsonl", format!("{good}{{\"text\": \"c\", \n").into_bytes(), None, "json.jsonl:3: not valid JSON"),
        (
            "array.jsonl",
            format!("[1, 2]\n{good}").into_bytes(),
            None,
            "array.jsonl:1: array element 1: not a JSON object",
        ),
        (
            "type.jsonl",
            format!("{good}{{\"text\": \"c\", \"label\": 0.5}}\n").into_bytes(),
            None,
            "type.jsonl:3: column `label` is a number that is not a 64-bit integer; a label must be a string, an \
             integer (of at most 64 bits) or a boolean",
        ),
        (
            "empty.jsonl",
            format!("{good}{{\"text\": \"c\", \"label\": \" \"}}\n").into_bytes(),
            None,
            "empty.jsonl:3: the label is empty",
        ),
        (
            "short.csv",
            b"text,label\na,pos\nb\nc,neg\n".to_vec(),
            None,
            "short.csv:3: missing column `label` (the row has 1 fields, the header 2)",
        ),
        ("utf8.csv", b"text,label\na,pos\n\xc3\x28,neg\n".to_vec(), None, "utf8.csv:3: invalid UTF-8 in column `text`"),
        (
            "unknown.jsonl",
            good.as_bytes().to_vec(),
            Some(b"{\"text\": \"c\", \"label\": \"pos\"}\n{\"text\": \"d\", \"label\": \"maybe\"}\n"),
            "eval-unknown.jsonl:2: label `maybe` is not one of the training labels (neg, pos)",
        ),
    ];
    for (name, body, validation, expected) in cases {
        let msg = error_for(name, &body, validation);
        assert!(msg.contains(expected), "{name}: {msg}");
        assert!(msg.contains("--skip-bad-rows"), "{name} names the way out: {msg}");
    }
    let msg = error_for("header.csv", b"sentence,label\na,pos\n", None);
    assert!(
        msg.contains("no column `text` in the header (columns: sentence, label)") && msg.contains("--text-column"),
        "{msg}"
    );
    let msg = error_for("rows.xml", b"", None);
    assert!(
        msg.contains(
            "use .jsonl (JSON Lines), .csv, .tsv (each also .gz or .zst), .parquet, a `datasets` .arrow file or .feather"
        ),
        "{msg}"
    );
    let msg = error_for("rows.parquet", b"", None);
    assert!(msg.contains("rows.parquet: not a readable Parquet file"), "{msg}");
    let msg = error_for("one.jsonl", b"{\"text\": \"a\", \"label\": \"pos\"}\n", None);
    assert!(msg.contains("1 distinct label(s)") && msg.contains("at least 2"), "{msg}");
}

#[test]
fn skip_bad_rows_skips_and_counts_each_class() {
    let dir = tmp("skip");
    let body = [
        &b"{\"text\": \"a\", \"label\": \"pos\"}\n{\"text\": \"b\", \"label\": \"neg\"}\n"[..],
        b"{\"text\": \"c\"}\n{\"text\": \"\xff\", \"label\": \"pos\"}\nnot json\n{\"text\": \"d\", \"label\": \"\"}\n",
    ]
    .concat();
    std::fs::write(dir.join("train.jsonl"), body).unwrap();
    std::fs::write(
        dir.join("eval.jsonl"),
        "{\"text\": \"e\", \"label\": \"maybe\"}\n{\"text\": \"f\", \"label\": \"pos\"}\n",
    )
    .unwrap();
    let mut o = options(32, vec![]);
    o.skip_bad_rows = true;
    let m = prepare_classification(
        &tokenizer(),
        &[dir.join("train.jsonl")],
        &[dir.join("eval.jsonl")],
        &dir.join("out"),
        &o,
    )
    .unwrap();
    assert_eq!(m.rows, 3, "two training rows and one validation row survive");
    let expected = [
        (BadRowKind::MissingColumn, 1),
        (BadRowKind::InvalidUtf8, 1),
        (BadRowKind::Malformed, 1),
        (BadRowKind::EmptyLabel, 1),
        (BadRowKind::UnknownLabel, 1),
    ];
    assert_eq!(m.skipped_rows.into_iter().collect::<Vec<_>>(), expected);
    assert_eq!(m.validation.iter().map(|s| s.records).sum::<u64>(), 1);
}

#[test]
fn batches_pad_to_their_longest_bucket_with_one_label_per_sequence() {
    let dir = tmp("batches");
    let tok = tokenizer();
    let long = "the hotel was lovely and clean and the food was superb and the park was great";
    let body: String = [("the food was awful", "neg"), (long, "pos"), ("the park is superb", "pos"), ("bad", "neg")]
        .iter()
        .map(|(t, l)| format!("{}\n", serde_json::json!({"text": t, "label": l})))
        .collect();
    std::fs::write(dir.join("rows.jsonl"), body).unwrap();
    let mut o = options(32, vec![8, 16]);
    o.num_shards = 1;
    prepare_classification(&tok, &[dir.join("rows.jsonl")], &[], &dir.join("out"), &o).unwrap();
    let data = ShardedDataset::open(&find_shards(&dir.join("out"), "train").unwrap(), CorruptPolicy::Fail).unwrap();
    let collator = ClassificationCollator { pad_id: tok.special().pad, max_length: 32 };
    let short = collator.collate_records(&data, &[0, 2], 0).unwrap();
    assert_eq!((short.batch, short.seq, short.labels.clone()), (2, 8, vec![0, 1]), "short rows stay in bucket 8");
    let mixed = collator.collate_records(&data, &[0, 1], 0).unwrap();
    assert_eq!(mixed.seq, 32, "a long row lifts the batch to its bucket");
    assert_eq!(mixed.attention_mask[..32].iter().sum::<i64>(), short.attention_mask[..8].iter().sum::<i64>());
    assert_eq!(mixed.token_type_ids.as_ref().unwrap().len(), 64);
    let mut padded = short.clone();
    padded.pad_to_rows(4, tok.special().pad as i64);
    assert_eq!((padded.batch, padded.labels.clone()), (4, vec![0, 1, -100, -100]));
    assert_eq!(padded.label_count(), 2);

    let device = Device::cpu();
    let sampler = EpochSampler::new(data.len(), 3, false, 0, 1).unwrap();
    let plan =
        LoaderPlan { batch_size: 2, prefetch: 1, start_epoch: 0, start_sample: 0, max_batches: Some(2), epochs: 1 };
    let batches: Vec<_> = DeviceLoader::new(std::sync::Arc::new(data), sampler, collator, plan, &device)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].labels.dims(), [2], "one label per sequence");
    assert_eq!(batches[0].labels.to_vec::<i64>().unwrap(), [0, 1]);
    assert_eq!(batches[0].input_ids.dims(), [2, 32]);
    assert_eq!(batches[1].input_ids.dims(), [2, 8]);
    assert_eq!(batches[0].label_count, 2);
}
