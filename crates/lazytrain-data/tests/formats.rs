//! Input formats: one corpus written as text, JSON Lines, CSV, Parquet
//! (snappy and zstd, several row groups) and a `datasets` Arrow stream by
//! `tests/fixtures/formats/gen_formats.py` gives the same documents, the same
//! tokenizer and byte-identical shards; bad files are errors naming the
//! file and the problem.

use lazytrain_data::formats::{InputFormat, TextSource, MAX_LINE_BYTES};
use lazytrain_data::prepare::{prepare, prepare_with_validation, PrepareOptions};
use lazytrain_data::text::{read_all_documents, read_documents};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats").join(name)
}

/// A fresh scratch folder, removed when the test passes.
fn tmp(name: &str) -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new(&format!("formats-{name}")).unwrap()
}

const CORPUS: [&str; 14] = [
    "corpus.txt",
    "corpus.jsonl",
    "corpus-array.json",
    "corpus.csv",
    "corpus-snappy.parquet",
    "corpus-zstd.parquet",
    "corpus-gzip.parquet",
    "corpus-lz4.parquet",
    "corpus.arrow",
    "corpus.feather",
    "corpus-file.arrow",
    "corpus-lz4.feather",
    "corpus-lz4-dictionary.feather",
    "corpus-zstd.arrow",
];

fn texts(name: &str) -> Vec<String> {
    read_documents(&fixture(name), &TextSource::default()).unwrap().texts
}

fn error(path: &Path, source: &TextSource) -> String {
    read_documents(path, source).unwrap_err().to_string()
}

#[test]
fn every_format_gives_the_same_documents_tokenizer_and_shards() {
    let reference = texts("corpus.txt");
    assert_eq!(reference.len(), 150);
    assert!(reference.iter().any(|t| t.contains("naïve")), "non-ASCII text survives");
    // Byte-level BPE: the `tokenizers` trainer is deterministic for it (its
    // WordPiece and Unigram trainers break ties in hash-map order, which
    // changes from run to run even on one file).
    let train = |docs: &[String]| train_tokenizer(docs, SubwordModel::Bpe, 300, TokenizerStyle::Roberta).unwrap();
    let tokenizer = train(&reference);
    let vocabulary = tokenizer.inner().to_string(false).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 2,
        validation_fraction: 0.1,
        seed: 3,
        progress: false,
        ..Default::default()
    };
    let shards = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "tfrecord"))
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect();
        files.sort();
        files
    };
    let expected = shards(&{
        let out = tmp("shards-txt");
        prepare(&tokenizer, &reference, &out, &options).unwrap();
        out
    });
    assert_eq!(expected.len(), 3, "two train shards and a validation shard");
    for name in CORPUS {
        let docs = texts(name);
        assert_eq!(docs, reference, "{name}");
        assert_eq!(train(&docs).inner().to_string(false).unwrap(), vocabulary, "{name}: the same tokenizer");
        let out = tmp(&format!("shards-{name}"));
        prepare(&tokenizer, &docs, &out, &options).unwrap();
        assert_eq!(shards(&out), expected, "{name}: byte-identical shards");
    }
}

#[test]
fn gzip_format_override_and_several_files() {
    use std::io::Write;
    let dir = tmp("gzip");
    let gz = dir.join("corpus.jsonl.gz");
    let mut encoder = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    encoder.write_all(&std::fs::read(fixture("corpus.jsonl")).unwrap()).unwrap();
    encoder.finish().unwrap();
    assert_eq!(read_documents(&gz, &TextSource::default()).unwrap().texts, texts("corpus.txt"));
    // A JSON Lines file named .txt, read as what it is.
    let renamed = dir.join("rows.txt");
    std::fs::copy(fixture("corpus.jsonl"), &renamed).unwrap();
    let as_json = TextSource { format: Some(InputFormat::JsonLines), ..TextSource::default() };
    assert_eq!(read_documents(&renamed, &as_json).unwrap().texts, texts("corpus.txt"));
    let both = read_all_documents(&[fixture("corpus.arrow"), fixture("corpus-zstd.parquet")], &TextSource::default());
    assert_eq!(both.unwrap().texts.len(), 300);
    assert!(InputFormat::parse("xml").unwrap_err().to_string().contains("choose txt, jsonl"));
}

/// Zstandard-compressed JSON Lines (as `zstd` writes them, the way The
/// Pile and SlimPajama ship) read like the plain file, in one frame or
/// several (files concatenated, or written by parallel compressors).
#[test]
fn zstd_files_of_one_frame_or_several() {
    let reference = texts("corpus.txt");
    assert_eq!(texts("corpus.jsonl.zst"), reference, "the zstd command's file");
    let plain = std::fs::read(fixture("corpus.jsonl")).unwrap();
    let half = plain[..plain.len() / 2].iter().rposition(|&b| b == b'\n').unwrap() + 1;
    let mut frames = zstd::encode_all(&plain[..half], 1).unwrap();
    frames.extend(zstd::encode_all(&plain[half..], 19).unwrap());
    let dir = tmp("zstd");
    let path = dir.join("frames.jsonl.zst");
    std::fs::write(&path, frames).unwrap();
    assert_eq!(read_documents(&path, &TextSource::default()).unwrap().texts, reference, "two frames");
}

#[test]
fn null_rows_are_skipped_and_counted() {
    // A CSV row too short to have the text column counts as a null.
    let dir = tmp("short-rows");
    let csv = dir.join("short.csv");
    std::fs::write(&csv, "id,text\n1\n2,c d\n").unwrap();
    let docs = read_documents(&csv, &TextSource::default()).unwrap();
    assert_eq!((docs.texts, docs.null_rows), (vec!["c d".to_string()], 1));
    // A byte-order mark before the first JSON line is not part of it.
    let bom = dir.join("bom.jsonl");
    std::fs::write(&bom, "\u{feff}{\"text\": \"first\"}\n{\"text\": \"second\"}\n").unwrap();
    assert_eq!(read_documents(&bom, &TextSource::default()).unwrap().texts, ["first", "second"]);
    // A JSON array's records are named by their place in it.
    let array = dir.join("array.json");
    std::fs::write(&array, "[{\"text\": \"a b\"}, {\"text\": null}, 7]").unwrap();
    let err = error(&array, &TextSource::default());
    assert!(err.contains("array.json: array element 3: expected a JSON object, got a number"), "{err}");
    std::fs::write(&array, "[{\"text\": \"a b\"}, {\"text\": null}, {\"text\": \"c\"}]").unwrap();
    let docs = read_documents(&array, &TextSource::default()).unwrap();
    assert_eq!((docs.texts, docs.null_rows), (vec!["a b".to_string(), "c".into()], 1));
    std::fs::write(&array, "[{\"text\": \"a b\"}, {\"text\": \"c\"").unwrap();
    let err = error(&array, &TextSource::default());
    assert!(err.contains("not a JSON array of objects, at array element 2"), "{err}");
    let empty = dir.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let err = error(&empty, &TextSource::default());
    assert!(err.contains("no header row (is the file empty?)"), "{err}");
    let docs = read_documents(&fixture("nulls.parquet"), &TextSource::default()).unwrap();
    assert_eq!((docs.texts, docs.null_rows), (vec!["first".to_string(), "second".into()], 2));
}

#[test]
fn bad_files_are_errors_naming_the_file_and_the_problem() {
    let source = TextSource::default();
    let err = error(&fixture("numbers.parquet"), &source);
    assert!(err.contains("numbers.parquet") && err.contains("column `text` holds Int64, not strings"), "{err}");
    let body = TextSource { text_column: "body".into(), ..TextSource::default() };
    for name in ["corpus-snappy.parquet", "corpus.arrow"] {
        let err = error(&fixture(name), &body);
        assert!(err.contains("no column `body`; the file has id, text; pass --text-column NAME"), "{name}: {err}");
    }
    let dir = tmp("bad");
    // The error of a file `name` holding `bytes`.
    let error_of = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        error(&path, &source)
    };
    // A Parquet file cut short loses its footer.
    let bytes = std::fs::read(fixture("corpus-snappy.parquet")).unwrap();
    let err = error_of("cut.parquet", &bytes[..bytes.len() - 100]);
    assert!(err.contains("cut.parquet") && err.contains("not a readable Parquet file"), "{err}");
    // Garbage where the footer should be.
    let mut footer = bytes.clone();
    let n = footer.len();
    footer[n - 12..n - 4].fill(0xAB);
    assert!(error_of("garbled.parquet", &footer).contains("not a readable Parquet file"));
    // An Arrow stream cut in the middle of its batches, and one cut in its schema.
    let stream = std::fs::read(fixture("corpus.arrow")).unwrap();
    let err = error_of("half.arrow", &stream[..stream.len() / 2]);
    assert!(err.contains("half.arrow") && err.contains("truncated or corrupt"), "{err}");
    let err = error_of("head.arrow", &stream[..40]);
    assert!(err.contains("not an Arrow IPC stream"), "{err}");
    // An Arrow IPC file (Feather) cut before its footer.
    let feather = std::fs::read(fixture("corpus.feather")).unwrap();
    let err = error_of("cut.feather", &feather[..feather.len() - 100]);
    assert!(err.contains("cut.feather") && err.contains("not a readable Arrow IPC file"), "{err}");
    // An Arrow IPC file whose trailer declares a footer longer than the file
    // (the fuzzer's: `arrow-ipc` would allocate it first).
    let mut long_footer = feather.clone();
    let at = long_footer.len() - 10;
    long_footer[at..at + 4].copy_from_slice(&1_359_827_307i32.to_le_bytes());
    let err = error_of("long-footer.feather", &long_footer);
    assert!(err.contains("its footer declares 1359827307 bytes, more than the"), "{err}");
    // A Parquet codec that is not built in names itself and the ones that are.
    let err = error(&fixture("corpus-brotli.parquet"), &source);
    assert!(
        err.contains("corpus-brotli.parquet")
            && err.contains("its pages are compressed with brotli")
            && err.contains("snappy, zstd, gzip or LZ4"),
        "{err}"
    );
    // A compressed buffer that declares more than a batch may hold is
    // refused before `arrow-ipc` reserves it; one that declares a wrong
    // size is refused by the crate after decompressing.
    let zstd = std::fs::read(fixture("corpus-zstd.arrow")).unwrap();
    let lengths = compressed_buffer_lengths(&zstd);
    assert!(lengths.len() >= 8, "several batches of compressed buffers");
    let with_length = |declared: i64| {
        let mut bytes = zstd.clone();
        bytes[lengths[3]..lengths[3] + 8].copy_from_slice(&declared.to_le_bytes());
        bytes
    };
    let err = error_of("huge.arrow", &with_length(1 << 60));
    assert!(
        err.contains("huge.arrow")
            && err.contains("a batch's compressed buffers declare")
            && err.contains("more than lazytrain holds at once (1073741824)")
            && err.contains("writer_batch_size=")
            && !err.contains("corrupt"),
        "{err}"
    );
    let actual = i64::from_le_bytes(zstd[lengths[3]..lengths[3] + 8].try_into().unwrap());
    let err = error_of("wrong-size.arrow", &with_length(actual + 1));
    assert!(err.contains("wrong-size.arrow") && err.contains("truncated or corrupt"), "{err}");
    // A compressed stream cut inside a batch's body.
    let err = error_of("cut-zstd.arrow", &zstd[..zstd.len() - 200]);
    assert!(err.contains("a message's body at byte") && err.contains("(cut short?)"), "{err}");
    // A Parquet file is not an Arrow stream.
    let wrong = TextSource { format: Some(InputFormat::Arrow), ..TextSource::default() };
    assert!(error(&fixture("corpus-zstd.parquet"), &wrong).contains("not an Arrow IPC stream"));
    for (name, contents) in [("empty.txt", &b""[..]), ("empty.jsonl", b"\n\n"), ("empty.parquet", b"")] {
        let err = error_of(name, contents);
        assert!(err.contains(name) && (err.contains("no text") || err.contains("not a readable")), "{err}");
    }
    let err = error_of("invalid.txt", b"fine\n\xff\xfe\n");
    assert!(err.contains("line 2"), "{err}");
    assert!(
        error_of("corpus.parquet.gz", &bytes).contains("Parquet or Arrow files compressed whole (gzip) are not read")
    );
    assert!(
        error_of("corpus.arrow.zstd", &bytes).contains("Parquet or Arrow files compressed whole (zstd) are not read")
    );
    // Text lines keep CRLF files' documents the same as LF files'.
    let crlf = dir.join("crlf.txt");
    std::fs::write(&crlf, "one line\r\ntwo lines\r\n").unwrap();
    assert_eq!(read_documents(&crlf, &source).unwrap().texts, ["one line", "two lines"]);
    // A folder is named as one; garbage in a .gz is not called "not UTF-8".
    let err = error(&dir, &source);
    assert!(err.contains("is a folder; give the files in it"), "{err}");
    let bad_gz = dir.join("bad.txt.gz");
    std::fs::write(&bad_gz, b"not gzip at all").unwrap();
    assert!(
        error(&bad_gz, &source).contains("(is it a complete gzip file of UTF-8 text?)"),
        "{}",
        error(&bad_gz, &source)
    );
    let bad_zst = dir.join("bad.jsonl.zst");
    std::fs::write(&bad_zst, b"not zstd at all").unwrap();
    let err = error(&bad_zst, &source);
    assert!(err.contains("cannot read") && err.contains("(is it a complete zstd file of UTF-8 text?"), "{err}");
    // A file without line breaks (sparse here, as /dev/zero or binary data
    // would be) is refused at the line cap, not read into one allocation.
    let sparse = dir.join("sparse.txt");
    std::fs::File::create(&sparse).unwrap().set_len(MAX_LINE_BYTES as u64 + 4096).unwrap();
    let err = error(&sparse, &source);
    assert!(err.contains("line 1 is longer than 256 MiB; is it a text file?"), "{err}");
}

#[test]
fn validation_files_become_the_validation_split() {
    let train = texts("corpus.txt");
    let held_out: Vec<String> = texts("corpus.jsonl").into_iter().take(40).collect();
    let tokenizer = train_tokenizer(&train, SubwordModel::WordPiece, 200, TokenizerStyle::Bert).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 1,
        validation_fraction: 0.0,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    let out = tmp("validation-files");
    let manifest = prepare_with_validation(&tokenizer, &train, &held_out, &out, &options).unwrap();
    let tokens: usize = held_out.iter().map(|t| tokenizer.encode(t, true).unwrap().len()).sum();
    let validation: u64 = manifest.validation.iter().map(|s| s.records).sum();
    assert_eq!(validation as usize, tokens / 16, "exactly the held-out text's blocks");
    let train_tokens: usize = train.iter().map(|t| tokenizer.encode(t, true).unwrap().len()).sum();
    assert_eq!(manifest.train_records() as usize, train_tokens / 16, "every training block is trained on");
    let err = prepare_with_validation(&tokenizer, &train, &["tiny".into()], &tmp("too-small"), &options);
    assert!(err.unwrap_err().to_string().contains("the validation files have"), "a held-out text shorter than a block");
}

/// `prepare-classification` reads labelled Parquet files and `datasets`
/// Arrow streams as it reads JSON Lines: the same shards and labels; a
/// ClassLabel column gives integer labels.
#[test]
fn labelled_tables_prepare_like_json_lines() {
    use lazytrain_data::classification::{prepare_classification, ClassificationOptions, Columns, LabelOrder};
    let texts = texts("corpus.txt");
    let tokenizer = train_tokenizer(&texts, SubwordModel::Bpe, 300, TokenizerStyle::Roberta).unwrap();
    let options = ClassificationOptions {
        columns: Columns { text: "text".into(), text_pair: None, label: "label".into() },
        max_length: 16,
        buckets: vec![8, 16],
        label_order: LabelOrder::Sorted,
        num_shards: 2,
        validation_fraction: 0.1,
        seed: 1,
        skip_bad_rows: false,
        progress: false,
    };
    let prepared_from = |path: &Path| {
        let out = tmp(&format!("labelled-{}", path.file_name().unwrap().to_string_lossy()));
        let manifest = prepare_classification(&tokenizer, &[path.to_path_buf()], &[], &out, &options).unwrap();
        let mut shards: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "tfrecord"))
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect();
        shards.sort();
        (manifest.labels, manifest.rows, shards)
    };
    let prepared = |name: &str| prepared_from(&fixture(name));
    let reference = prepared("labelled.jsonl");
    assert_eq!(reference.0, ["negative", "positive"]);
    assert_eq!(reference.1, 150);
    for name in ["labelled-array.json", "labelled.parquet", "labelled.arrow", "labelled-lz4.feather"] {
        assert_eq!(prepared(name), reference, "{name}");
    }
    // Dictionary-encoded strings (a pandas category, pyarrow's
    // `dictionary_encode`) read as their values.
    let encoded = tmp("dictionary-encoded");
    let (parquet, arrow) = dictionary_encoded(&fixture("labelled.parquet"), &encoded);
    assert_eq!(prepared_from(&parquet), reference, "dictionary-encoded Parquet");
    assert_eq!(prepared_from(&arrow), reference, "dictionary-encoded Arrow stream");
    let text_only = read_documents(&parquet, &TextSource::default()).unwrap().texts;
    assert_eq!(text_only, read_documents(&fixture("labelled.parquet"), &TextSource::default()).unwrap().texts);
    let (labels, rows, _) = prepared("classlabel.arrow");
    assert_eq!((labels, rows), (vec!["0".to_string(), "1".into()], 150), "ClassLabel integers are the labels");
    let wrong =
        ClassificationOptions { columns: Columns { label: "stars".into(), ..options.columns.clone() }, ..options };
    let err = prepare_classification(&tokenizer, &[fixture("labelled.parquet")], &[], &tmp("wrong"), &wrong);
    let err = err.unwrap_err().to_string();
    assert!(err.contains("no column `stars`; the file has text, label"), "{err}");
}

/// The Parquet file `from` with every string column dictionary-encoded,
/// written into `dir` as Parquet and as an Arrow IPC stream.
fn dictionary_encoded(from: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, DictionaryArray, RecordBatch};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(from).unwrap()).unwrap().build().unwrap();
    let batches: Vec<RecordBatch> = reader
        .map(|batch| {
            let batch = batch.unwrap();
            let schema = batch.schema();
            let columns = schema.fields().iter().zip(batch.columns()).map(|(field, column)| {
                let encoded: ArrayRef = match column.as_string_opt::<i32>() {
                    Some(strings) => std::sync::Arc::new(strings.iter().collect::<DictionaryArray<Int32Type>>()),
                    None => column.clone(),
                };
                (field.name().clone(), encoded)
            });
            RecordBatch::try_from_iter(columns).unwrap()
        })
        .collect();
    let schema = batches[0].schema();
    assert!(schema.fields().iter().any(|f| matches!(f.data_type(), arrow_schema::DataType::Dictionary(..))));
    let (parquet, arrow) = (dir.join("dictionary.parquet"), dir.join("dictionary.arrow"));
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&parquet).unwrap(), schema.clone(), None).unwrap();
    let mut stream = arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&arrow).unwrap(), &schema).unwrap();
    for batch in &batches {
        writer.write(batch).unwrap();
        stream.write(batch).unwrap();
    }
    writer.close().unwrap();
    stream.finish().unwrap();
    (parquet, arrow)
}

/// A corrupt Parquet file the fuzzer found, on which the `parquet` crate
/// divides by zero, is an error naming the file.
#[test]
fn a_parquet_file_that_panics_the_reader_is_an_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-tables/divide-by-zero.parquet");
    let err = error(&path, &TextSource::default());
    assert!(err.contains("divide-by-zero.parquet") && err.contains("not a readable Parquet file"), "{err}");
}

/// A corrupt page header the fuzzer found, declaring a field of billions
/// of elements, is an error naming the file, and no hang: through the
/// `parquet` crate's reader of a `File`, which answers a read at the end of
/// the file with no bytes and no error, it took 36 s of empty reads; read
/// whole into memory 1.5 s; now, a read at the end being an error, at once
/// (the bound is a hang guard for slow machines, not a speed goal).
#[test]
fn a_parquet_page_header_declaring_billions_of_fields_fails_without_hanging() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-tables/huge-skip-in-a-page-header.parquet");
    let start = std::time::Instant::now();
    let err = error(&path, &TextSource::default());
    assert!(err.contains("huge-skip-in-a-page-header.parquet") && err.contains("a row group cannot be read"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(20), "took {:?}", start.elapsed());
}

/// A page header the fuzzer found, declaring an uncompressed page of
/// 1.15 GB in a file of 4.7 kB, is an error naming the file before the
/// `parquet` crate reserves that size (apache/arrow-rs#10734).
#[test]
fn a_parquet_page_larger_than_its_column_chunk_is_an_error_not_an_allocation() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-tables/oversized-page.parquet");
    let err = error(&path, &TextSource::default());
    assert!(
        err.contains("oversized-page.parquet")
            && err.contains("declares 1147689350 uncompressed bytes, more than the 1296 of its whole column chunk"),
        "{err}"
    );
}

/// Where each compressed buffer of an Arrow IPC stream's record batches
/// keeps its decompressed length (the buffer's first 8 bytes), in order.
fn compressed_buffer_lengths(stream: &[u8]) -> Vec<usize> {
    let mut lengths = Vec::new();
    let mut at = 0;
    while at + 8 <= stream.len() {
        assert_eq!(stream[at..at + 4], [0xff; 4], "pyarrow writes continuation markers");
        let meta = i32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        if meta == 0 {
            break;
        }
        let message = arrow_ipc::root_as_message(&stream[at + 8..at + 8 + meta]).unwrap();
        let body = at + 8 + meta;
        if let Some(batch) = message.header_as_record_batch().filter(|b| b.compression().is_some()) {
            let buffers = batch.buffers().unwrap().iter().filter(|b| b.length() >= 8);
            lengths.extend(buffers.map(|b| body + b.offset() as usize));
        }
        at = body + message.bodyLength() as usize;
    }
    lengths
}
