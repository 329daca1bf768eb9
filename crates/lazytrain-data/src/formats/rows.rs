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

/// `path` opened for the CSV reader, which holds a record whole: reading
/// fails once more than [`MAX_LINE_BYTES`] pass without a line break (a
/// file without line breaks, or a decompression bomb, would otherwise grow
/// one record as large as itself).
pub(crate) fn open_delimited(path: &Path, compression: Compression) -> Result<LineBounded<Box<dyn std::io::Read>>> {
    Ok(LineBounded { inner: open(path, compression)?, since_break: 0 })
}

/// A reader that fails once more than [`MAX_LINE_BYTES`] pass without a
/// line break ([`open_delimited`]).
pub(crate) struct LineBounded<R> {
    inner: R,
    /// Bytes read since the last line break.
    since_break: usize,
}

impl<R: std::io::Read> std::io::Read for LineBounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.since_break = match buf[..read].iter().rposition(|&b| b == b'\n') {
            Some(last) => read - last - 1,
            None => self.since_break + read,
        };
        if self.since_break > MAX_LINE_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line longer than {} MiB; is it a text file?", MAX_LINE_BYTES >> 20),
            ));
        }
        Ok(read)
    }
}

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
        csv::ReaderBuilder::new().delimiter(delimiter).flexible(true).from_reader(open_delimited(path, compression)?);
    let hint = |e: &csv::Error| if e.is_io_error() { compression.read_error_hint() } else { "" };
    let headers =
        reader.byte_headers().map_err(|e| io_error(path, format!("cannot read the header row: {e}{}", hint(&e))))?;
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
        let record = record.map_err(|e| io_error(path, format!("malformed row: {e}{}", hint(&e))))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Read `reader` to its end a MiB at a time: the bytes, or the error.
    fn drain(mut reader: impl Read) -> std::io::Result<usize> {
        let (mut buffer, mut total) = (vec![0u8; 1 << 20], 0);
        loop {
            match reader.read(&mut buffer)? {
                0 => return Ok(total),
                read => total += read,
            }
        }
    }

    /// The CSV reader's input fails past [`MAX_LINE_BYTES`] without a line
    /// break, and only then.
    #[test]
    fn lines_longer_than_the_cap_fail_the_delimited_reader() {
        let long = std::io::repeat(b'a').take(MAX_LINE_BYTES as u64 + 1);
        let err = drain(LineBounded { inner: long, since_break: 0 }).unwrap_err();
        assert!(err.to_string().contains("a line longer than 256 MiB"), "{err}");
        let exact = std::io::repeat(b'a').take(MAX_LINE_BYTES as u64);
        assert_eq!(drain(LineBounded { inner: exact, since_break: 0 }).unwrap(), MAX_LINE_BYTES);
        let broken = std::io::repeat(b'a').take(MAX_LINE_BYTES as u64 - 1).chain(&b"\n"[..]);
        let lines = broken.chain(std::io::repeat(b'b').take(MAX_LINE_BYTES as u64));
        assert_eq!(drain(LineBounded { inner: lines, since_break: 0 }).unwrap(), 2 * MAX_LINE_BYTES);
    }
}
