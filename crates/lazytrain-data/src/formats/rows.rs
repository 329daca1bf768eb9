//! Line-oriented formats: plain text, JSON Lines, CSV and TSV (each
//! optionally compressed whole: gzip or zstd).

use super::{io_error, open, Compression, DocumentSink};
use crate::Result;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The longest line the line-oriented readers take, in bytes: a document
/// per line is never this long, while a file without line breaks (binary
/// data, a sparse or endless file) would otherwise be read into one
/// allocation as large as itself.
pub const MAX_LINE_BYTES: usize = 256 << 20;

/// Read the next line of `reader` (with its line break) into `raw`: false at
/// the end of the input. `line` is its number, for errors.
pub(crate) fn next_line(
    reader: &mut impl BufRead,
    raw: &mut Vec<u8>,
    path: &Path,
    compression: Compression,
    line: u64,
) -> Result<bool> {
    raw.clear();
    let hint = compression.read_error_hint();
    let read = std::io::Read::take(&mut *reader, MAX_LINE_BYTES as u64 + 1)
        .read_until(b'\n', raw)
        .map_err(|e| io_error(path, format!("line {line}: cannot read: {e}{hint}")))?;
    if raw.len() > MAX_LINE_BYTES {
        return Err(io_error(
            path,
            format!(
                "line {line} is longer than {} MiB; is it a text file? (the line-oriented formats read a document a line)",
                MAX_LINE_BYTES >> 20
            ),
        ));
    }
    Ok(read > 0)
}

/// Every non-blank line is one document.
pub(super) fn read_lines(path: &Path, compression: Compression, docs: &mut dyn DocumentSink) -> Result<()> {
    let mut reader = BufReader::new(open(path, compression)?);
    let mut raw = Vec::new();
    let mut line = 0u64;
    while next_line(&mut reader, &mut raw, path, compression, line + 1)? {
        line += 1;
        let text = std::str::from_utf8(&raw)
            .map_err(|_| io_error(path, format!("line {line}: invalid UTF-8 (is it UTF-8 text?)")))?;
        docs.push(text.strip_suffix('\n').map_or(text, |t| t.strip_suffix('\r').unwrap_or(t)))?;
    }
    Ok(())
}

/// The JSON type name of `value`, for errors.
pub(crate) fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Field `column` of every JSON object (JSON Lines or one array of them;
/// null values skipped and counted).
pub(super) fn read_json_lines(
    path: &Path,
    compression: Compression,
    column: &str,
    docs: &mut dyn DocumentSink,
) -> Result<()> {
    super::for_each_json_record(path, compression, &mut |place, record| {
        let bad = |detail: String| io_error(path, format!("{place}: {detail}"));
        let value = record.map_err(|e| match e {
            super::BadLine::InvalidUtf8 => bad("invalid UTF-8".into()),
            super::BadLine::NotJson(e) => bad(format!("not a JSON object: {e}")),
        })?;
        let serde_json::Value::Object(fields) = value else {
            return Err(bad(format!("expected a JSON object, got {}", json_type(&value))));
        };
        match fields.get(column) {
            Some(serde_json::Value::String(s)) => docs.push(s),
            Some(serde_json::Value::Null) => {
                docs.null_row();
                Ok(())
            }
            Some(other) => Err(bad(format!("field `{column}` is {}, not a string", json_type(other)))),
            None => {
                let present: Vec<&str> = fields.keys().map(String::as_str).collect();
                Err(bad(format!(
                    "no field `{column}`; the row has {}; pass --text-column NAME",
                    if present.is_empty() { "no fields".to_string() } else { present.join(", ") }
                )))
            }
        }
    })
}

/// Column `column` (by its header) of a CSV or TSV file.
pub(super) fn read_delimited(
    path: &Path,
    compression: Compression,
    delimiter: u8,
    column: &str,
    docs: &mut dyn DocumentSink,
) -> Result<()> {
    let mut reader =
        csv::ReaderBuilder::new().delimiter(delimiter).flexible(true).from_reader(open(path, compression)?);
    let headers = reader.byte_headers().map_err(|e| io_error(path, format!("cannot read the header row: {e}")))?;
    let names: Vec<String> = headers.iter().map(|h| String::from_utf8_lossy(h).trim().to_string()).collect();
    if names.iter().all(String::is_empty) {
        return Err(io_error(path, "no header row (is the file empty?); the first row must name the columns"));
    }
    let Some(index) = names.iter().position(|n| n == column) else {
        return Err(io_error(
            path,
            format!("no column `{column}`; the header has {}; pass --text-column NAME", names.join(", ")),
        ));
    };
    for record in reader.byte_records() {
        let record = record.map_err(|e| io_error(path, format!("malformed row: {e}")))?;
        let line = record.position().map_or(0, |p| p.line());
        // A row too short to have the column is skipped and counted, as a null is.
        let Some(field) = record.get(index) else {
            docs.null_row();
            continue;
        };
        let text = std::str::from_utf8(field).map_err(|_| io_error(path, format!("line {line}: invalid UTF-8")))?;
        docs.push(text)?;
    }
    Ok(())
}
