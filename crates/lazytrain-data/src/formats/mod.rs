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
pub(crate) use rows::{json_type, next_line};

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

    /// The format a file's extension names (after a `.gz`), plain text when
    /// the extension is none of the others; and whether it is gzipped.
    pub fn detect(path: &Path) -> (InputFormat, bool) {
        let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        let (stem, gzipped) = match name.strip_suffix(".gz") {
            Some(stem) => (stem.to_string(), true),
            None => (name, false),
        };
        let format = match stem.rsplit_once('.').map(|(_, ext)| ext) {
            Some("jsonl" | "json" | "ndjson") => InputFormat::JsonLines,
            Some("csv") => InputFormat::Csv,
            Some("tsv" | "tab") => InputFormat::Tsv,
            Some("parquet") => InputFormat::Parquet,
            Some("arrow" | "feather") => InputFormat::Arrow,
            _ => InputFormat::Text,
        };
        (format, gzipped)
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

/// Open `path`, decompressing it when `gzipped`.
pub(crate) fn open(path: &Path, gzipped: bool) -> Result<Box<dyn Read>> {
    if path.is_dir() {
        return Err(io_error(path, "is a folder; give the files in it (--files accepts several)"));
    }
    let file = std::fs::File::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
    Ok(match gzipped {
        true => Box::new(flate2::read::MultiGzDecoder::new(file)),
        false => Box::new(file),
    })
}

/// Give the documents of one file to `docs`.
pub fn read_into(path: &Path, source: &TextSource, docs: &mut dyn DocumentSink) -> Result<()> {
    let (detected, gzipped) = InputFormat::detect(path);
    let format = source.format.unwrap_or(detected);
    let column = source.text_column.as_str();
    let before = docs.counts();
    match format {
        InputFormat::Text => rows::read_lines(path, gzipped, docs)?,
        InputFormat::JsonLines => rows::read_json_lines(path, gzipped, column, docs)?,
        InputFormat::Csv => rows::read_delimited(path, gzipped, b',', column, docs)?,
        InputFormat::Tsv => rows::read_delimited(path, gzipped, b'\t', column, docs)?,
        InputFormat::Parquet | InputFormat::Arrow if gzipped => {
            return Err(io_error(
                path,
                "gzipped Parquet or Arrow files are not read; they compress internally (snappy, zstd), so \
                 decompress the .gz first",
            ))
        }
        InputFormat::Parquet => columnar::read_parquet(path, column, docs)?,
        InputFormat::Arrow => columnar::read_arrow(path, column, docs)?,
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
