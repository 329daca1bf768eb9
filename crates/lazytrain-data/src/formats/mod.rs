//! The file formats text comes in: plain text (one document per line),
//! JSON Lines, CSV/TSV, Parquet (the Hub's dataset format) and the Arrow IPC
//! streams of a `datasets` cache. Each yields the strings of one column
//! (plain text: its lines), with null rows skipped and counted.

mod arrow_file;
mod columnar;
mod page_header;
mod parquet_file;
pub(crate) use columnar::{for_each_table_row, ColumnKind};
mod json_records;
pub(crate) use json_records::{for_each_json_record, BadLine, RecordPlace};
mod rows;
pub use rows::MAX_LINE_BYTES;
pub(crate) use rows::{json_type, next_line, open_delimited};

use crate::{DataError, Result};
use std::io::Read;
use std::path::Path;

/// A text file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// One document per non-blank line (`.txt`, anything unrecognised).
    Text,
    /// One JSON object per line (`.jsonl`, `.json`, `.ndjson`).
    JsonLines,
    /// Comma-separated with a header row (`.csv`).
    Csv,
    /// Tab-separated with a header row (`.tsv`).
    Tsv,
    /// Apache Parquet (`.parquet`): string columns (Utf8, LargeUtf8,
    /// Utf8View, or a dictionary of them), read in place a page at a time.
    Parquet,
    /// Arrow IPC data: a stream (`.arrow`), as `datasets` writes its cache
    /// files, or the file format (Feather v2, `.feather`), plain or with
    /// LZ4 or zstd compressed buffers.
    Arrow,
}

impl InputFormat {
    /// Parse a `--format` value.
    pub fn parse(name: &str) -> Result<InputFormat> {
        Ok(match name {
            "txt" | "text" => InputFormat::Text,
            "jsonl" | "json" | "ndjson" => InputFormat::JsonLines,
            "csv" => InputFormat::Csv,
            "tsv" => InputFormat::Tsv,
            "parquet" => InputFormat::Parquet,
            "arrow" | "feather" => InputFormat::Arrow,
            other => {
                return Err(DataError::Invalid(format!(
                    "unknown input format `{other}`; choose txt, jsonl, csv, tsv, parquet or arrow"
                )))
            }
        })
    }

    /// The format a file's extension names (after a `.gz` or `.zst`), plain
    /// text when the extension is none of the others; and how the whole
    /// file is compressed.
    pub fn detect(path: &Path) -> (InputFormat, Compression) {
        let (compression, extension) = Compression::of_path(path);
        let format = match extension.as_str() {
            "jsonl" | "json" | "ndjson" => InputFormat::JsonLines,
            "csv" => InputFormat::Csv,
            "tsv" | "tab" => InputFormat::Tsv,
            "parquet" => InputFormat::Parquet,
            "arrow" | "feather" => InputFormat::Arrow,
            _ => InputFormat::Text,
        };
        (format, compression)
    }
}

/// How a whole file of a line format is compressed, by its last extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Stored as it is.
    None,
    /// gzip (`.gz`), one member or several (as `pigz` and concatenated
    /// files have them).
    Gzip,
    /// Zstandard (`.zst`, `.zstd`), one frame or several: how The Pile,
    /// SlimPajama and RedPajama ship their JSON Lines.
    Zstd,
}

impl Compression {
    /// The compression that the last extension of `path`'s name names, and
    /// the extension before it (lower case, empty when there is none).
    pub fn of_path(path: &Path) -> (Compression, String) {
        let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        let (compression, stem) =
            [(".gz", Compression::Gzip), (".zst", Compression::Zstd), (".zstd", Compression::Zstd)]
                .into_iter()
                .find_map(|(suffix, compression)| Some((compression, name.strip_suffix(suffix)?)))
                .unwrap_or((Compression::None, &name));
        (compression, stem.rsplit_once('.').map_or("", |(_, extension)| extension).to_string())
    }

    /// What an error reading a line adds: whether the file may be cut short.
    pub(crate) fn read_error_hint(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => " (is it a complete gzip file of UTF-8 text?)",
            Compression::Zstd => {
                " (is it a complete zstd file of UTF-8 text? one compressed with `zstd --long` above 27 needs \
                 decompressing first)"
            }
        }
    }

    /// The error of a columnar file compressed whole: it compresses its own
    /// pages or buffers.
    pub(crate) fn refuse_columnar(self, path: &Path) -> Result<()> {
        let codec = match self {
            Compression::None => return Ok(()),
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        };
        Err(io_error(
            path,
            format!(
                "Parquet or Arrow files compressed whole ({codec}) are not read; they compress their own pages \
                 (snappy, zstd, LZ4), so decompress the file first"
            ),
        ))
    }
}

/// Which strings to take from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextSource {
    /// The format (`None`: from the extension).
    pub format: Option<InputFormat>,
    /// The column (or JSON field) holding the text; plain text ignores it.
    pub text_column: String,
}

impl Default for TextSource {
    /// Format from the extension, column `text` (the `datasets` convention).
    fn default() -> TextSource {
        TextSource { format: None, text_column: "text".into() }
    }
}

/// Where the readers put what they read, document by document: collected
/// ([`Documents`]) or tokenized and written as it comes (`prepare`).
pub trait DocumentSink {
    /// Take one document: a non-blank text, trimmed.
    fn document(&mut self, text: &str) -> Result<()>;
    /// Count a row whose text is null, or (CSV, TSV) missing from a short row.
    fn null_row(&mut self);
    /// The documents and null rows taken so far.
    fn counts(&self) -> (u64, u64);
    /// Take `text` trimmed, unless it is blank.
    fn push(&mut self, text: &str) -> Result<()> {
        match text.trim() {
            "" => Ok(()),
            trimmed => self.document(trimmed),
        }
    }
}

/// The documents read from files: every non-blank text, trimmed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Documents {
    /// The texts in file order.
    pub texts: Vec<String>,
    /// Rows whose text was null, or (CSV, TSV) missing from a short row: skipped.
    pub null_rows: u64,
}

impl DocumentSink for Documents {
    fn document(&mut self, text: &str) -> Result<()> {
        self.texts.push(text.to_string());
        Ok(())
    }

    fn null_row(&mut self) {
        self.null_rows += 1;
    }

    fn counts(&self) -> (u64, u64) {
        (self.texts.len() as u64, self.null_rows)
    }
}

/// An I/O error about `path`.
pub(crate) fn io_error(path: &Path, detail: impl Into<String>) -> DataError {
    DataError::Io { path: path.display().to_string(), detail: detail.into() }
}

/// Open `path`, decompressing it as `compression` says.
pub(crate) fn open(path: &Path, compression: Compression) -> Result<Box<dyn Read>> {
    if path.is_dir() {
        return Err(io_error(path, "is a folder; give the files in it (--files accepts several)"));
    }
    let file = std::fs::File::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
    Ok(match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(file)
                .map_err(|e| io_error(path, format!("cannot start decompressing it: {e}")))?,
        ),
    })
}

/// Give the documents of one file to `docs`.
pub fn read_into(path: &Path, source: &TextSource, docs: &mut dyn DocumentSink) -> Result<()> {
    let (detected, compression) = InputFormat::detect(path);
    let format = source.format.unwrap_or(detected);
    let column = source.text_column.as_str();
    let before = docs.counts();
    match format {
        InputFormat::Text => rows::read_lines(path, compression, docs)?,
        InputFormat::JsonLines => rows::read_json_lines(path, compression, column, docs)?,
        InputFormat::Csv => rows::read_delimited(path, compression, b',', column, docs)?,
        InputFormat::Tsv => rows::read_delimited(path, compression, b'\t', column, docs)?,
        InputFormat::Parquet => {
            compression.refuse_columnar(path)?;
            columnar::read_parquet(path, column, docs)?
        }
        InputFormat::Arrow => {
            compression.refuse_columnar(path)?;
            columnar::read_arrow(path, column, docs)?
        }
    }
    let after = docs.counts();
    if after.0 == before.0 {
        let nulls = after.1 - before.1;
        return Err(io_error(
            path,
            match nulls {
                0 => "the input file has no text (every row is blank)".to_string(),
                n => format!("the input file has no text ({n} null rows, every other row blank)"),
            },
        ));
    }
    Ok(())
}
