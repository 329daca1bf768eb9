//! Line-oriented formats: plain text, JSON Lines, CSV and TSV (each
//! optionally gzipped).

use super::{io_error, open, Documents};
use crate::Result;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Every non-blank line is one document.
pub(super) fn read_lines(path: &Path, gzipped: bool, docs: &mut Documents) -> Result<()> {
    for (n, line) in BufReader::new(open(path, gzipped)?).lines().enumerate() {
        let line = line.map_err(|e| io_error(path, format!("line {}: {e} (is it UTF-8 text?)", n + 1)))?;
        docs.push(&line);
    }
    Ok(())
}

/// The JSON type name of `value`, for errors.
fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Field `column` of every JSON object line (null values skipped and counted).
pub(super) fn read_json_lines(path: &Path, gzipped: bool, column: &str, docs: &mut Documents) -> Result<()> {
    let mut reader = BufReader::new(open(path, gzipped)?);
    let mut raw = Vec::new();
    let mut line = 0u64;
    loop {
        raw.clear();
        let read = reader.read_until(b'\n', &mut raw).map_err(|e| io_error(path, format!("cannot read: {e}")))?;
        if read == 0 {
            return Ok(());
        }
        line += 1;
        let bad = |detail: String| io_error(path, format!("line {line}: {detail}"));
        let text = std::str::from_utf8(&raw).map_err(|_| bad("invalid UTF-8".into()))?;
        if text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let serde_json::Value::Object(fields) = value else {
            return Err(bad(format!("expected a JSON object, got {}", json_type(&value))));
        };
        match fields.get(column) {
            Some(serde_json::Value::String(s)) => docs.push(s),
            Some(serde_json::Value::Null) => docs.null_rows += 1,
            Some(other) => {
                return Err(bad(format!("field `{column}` is {}, not a string", json_type(other))));
            }
            None => {
                let present: Vec<&str> = fields.keys().map(String::as_str).collect();
                return Err(bad(format!(
                    "no field `{column}`; the row has {}; pass --text-column NAME",
                    if present.is_empty() { "no fields".to_string() } else { present.join(", ") }
                )));
            }
        }
    }
}

/// Column `column` (by its header) of a CSV or TSV file.
pub(super) fn read_delimited(
    path: &Path,
    gzipped: bool,
    delimiter: u8,
    column: &str,
    docs: &mut Documents,
) -> Result<()> {
    let mut reader = csv::ReaderBuilder::new().delimiter(delimiter).flexible(true).from_reader(open(path, gzipped)?);
    let headers = reader.byte_headers().map_err(|e| io_error(path, format!("cannot read the header row: {e}")))?;
    let names: Vec<String> = headers.iter().map(|h| String::from_utf8_lossy(h).trim().to_string()).collect();
    let Some(index) = names.iter().position(|n| n == column) else {
        return Err(io_error(
            path,
            format!("no column `{column}`; the header has {}; pass --text-column NAME", names.join(", ")),
        ));
    };
    for record in reader.byte_records() {
        let record = record.map_err(|e| io_error(path, format!("malformed row: {e}")))?;
        let line = record.position().map_or(0, |p| p.line());
        let field = record.get(index).unwrap_or_default();
        let text = std::str::from_utf8(field).map_err(|_| io_error(path, format!("line {line}: invalid UTF-8")))?;
        docs.push(text);
    }
    Ok(())
}
