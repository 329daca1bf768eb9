//! The records of a JSON input, one at a time: JSON Lines (an object a
//! line) or one JSON array of objects (what `json.dump(rows)` and pandas'
//! `to_json(orient="records")` write, and `datasets`' JSON loader reads),
//! told apart by the first character. An array is parsed an element at a
//! time, so memory holds one record, not the file.

use super::{io_error, next_line, open};
use crate::Result;
use serde::de::{Error as _, SeqAccess, Visitor};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Where a record is: its line in JSON Lines, its place in an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordPlace {
    /// Line `n` (from 1) of a JSON Lines file.
    Line(u64),
    /// Element `n` (from 1) of a JSON array.
    Element(u64),
}

impl RecordPlace {
    /// The line or element number.
    pub(crate) fn number(self) -> u64 {
        match self {
            RecordPlace::Line(n) | RecordPlace::Element(n) => n,
        }
    }
}

impl std::fmt::Display for RecordPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordPlace::Line(n) => write!(f, "line {n}"),
            RecordPlace::Element(n) => write!(f, "array element {n}"),
        }
    }
}

/// Why a line of JSON Lines is not a record (an array's bad element ends
/// the file instead: its parse cannot go on past it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BadLine {
    /// The line is not UTF-8.
    InvalidUtf8,
    /// The line is not JSON (the parser's message).
    NotJson(String),
}

/// Hand each record of the JSON input at `path` to `each`, with its place;
/// blank lines are skipped.
pub(crate) fn for_each_json_record(
    path: &Path,
    gzipped: bool,
    each: &mut dyn FnMut(RecordPlace, std::result::Result<serde_json::Value, BadLine>) -> Result<()>,
) -> Result<()> {
    let mut reader = BufReader::new(open(path, gzipped)?);
    match first_character(&mut reader, path)? {
        (Some(b'['), _) => each_array_element(reader, path, each),
        (_, blank_lines) => each_line(reader, path, gzipped, blank_lines, each),
    }
}

/// The first byte of `reader` after a byte-order mark (which editors on
/// Windows write) and white space, which are consumed (`None` when there is
/// nothing else), and the line breaks among them.
fn first_character(reader: &mut impl BufRead, path: &Path) -> Result<(Option<u8>, u64)> {
    const BYTE_ORDER_MARK: &[u8] = "\u{feff}".as_bytes();
    let cannot_read = |e: std::io::Error| io_error(path, format!("cannot read: {e}"));
    let (mut at_start, mut line_breaks) = (true, 0u64);
    loop {
        let buffer = reader.fill_buf().map_err(cannot_read)?;
        if buffer.is_empty() {
            return Ok((None, line_breaks));
        }
        if at_start && buffer.starts_with(BYTE_ORDER_MARK) {
            reader.consume(BYTE_ORDER_MARK.len());
        }
        at_start = false;
        let buffer = reader.fill_buf().map_err(cannot_read)?;
        let first = buffer.iter().position(|b| !b.is_ascii_whitespace());
        let blank = &buffer[..first.unwrap_or(buffer.len())];
        line_breaks += blank.iter().filter(|&&b| b == b'\n').count() as u64;
        let (consumed, found) = (blank.len(), first.map(|i| buffer[i]));
        reader.consume(consumed);
        if found.is_some() {
            return Ok((found, line_breaks));
        }
    }
}

/// JSON Lines: each non-blank line a record; `blank_lines` were read
/// before.
fn each_line(
    mut reader: impl BufRead,
    path: &Path,
    gzipped: bool,
    blank_lines: u64,
    each: &mut dyn FnMut(RecordPlace, std::result::Result<serde_json::Value, BadLine>) -> Result<()>,
) -> Result<()> {
    let mut raw = Vec::new();
    let mut line = blank_lines;
    while next_line(&mut reader, &mut raw, path, gzipped, line + 1)? {
        line += 1;
        let record = match std::str::from_utf8(&raw) {
            Err(_) => Err(BadLine::InvalidUtf8),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => serde_json::from_str(text).map_err(|e| BadLine::NotJson(e.to_string())),
        };
        each(RecordPlace::Line(line), record)?;
    }
    Ok(())
}

/// One JSON array: each element a record, parsed as it is reached.
fn each_array_element(
    reader: impl BufRead,
    path: &Path,
    each: &mut dyn FnMut(RecordPlace, std::result::Result<serde_json::Value, BadLine>) -> Result<()>,
) -> Result<()> {
    let mut elements = Elements { each, count: 0, failed: None };
    let mut parser = serde_json::Deserializer::from_reader(reader);
    let parsed =
        serde::Deserializer::deserialize_seq(&mut parser, ElementsVisitor(&mut elements)).and_then(|()| parser.end());
    if let Some(error) = elements.failed {
        return Err(error);
    }
    parsed.map_err(|e| {
        io_error(
            path,
            format!(
                "not a JSON array of objects, at array element {}: {e} (a JSON input holds JSON Lines, an object a \
                 line, or one array of objects)",
                elements.count + 1
            ),
        )
    })
}

/// The visitor of an array's elements: each goes to `each` as it is
/// parsed; an error of `each` stops the parse and is kept in `failed`.
struct Elements<'e> {
    each: &'e mut dyn FnMut(RecordPlace, std::result::Result<serde_json::Value, BadLine>) -> Result<()>,
    /// Elements handed on.
    count: u64,
    failed: Option<crate::DataError>,
}

/// [`Elements`] as a `serde` visitor.
struct ElementsVisitor<'v, 'e>(&'v mut Elements<'e>);

impl<'de> Visitor<'de> for ElementsVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of JSON objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(value) = seq.next_element::<serde_json::Value>()? {
            self.0.count += 1;
            if let Err(e) = (self.0.each)(RecordPlace::Element(self.0.count), Ok(value)) {
                self.0.failed = Some(e);
                return Err(A::Error::custom("stopped by the reader"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of `contents` as (place, value or bad line).
    fn records(contents: &str) -> Result<Vec<(RecordPlace, std::result::Result<serde_json::Value, BadLine>)>> {
        let dir = lazytrain_core::ScratchDir::new("json-records").unwrap();
        let path = dir.path().join("rows.json");
        std::fs::write(&path, contents).unwrap();
        let mut seen = Vec::new();
        for_each_json_record(&path, false, &mut |place, record| {
            seen.push((place, record));
            Ok(())
        })?;
        Ok(seen)
    }

    #[test]
    fn json_lines_and_arrays_give_the_same_records() {
        let lines = records("\u{feff}\n \n {\"text\": \"a\"}\n\n{\"text\": \"b\"}\nnot json\n").unwrap();
        assert_eq!(lines[0], (RecordPlace::Line(3), Ok(serde_json::json!({"text": "a"}))));
        assert_eq!(lines[1], (RecordPlace::Line(5), Ok(serde_json::json!({"text": "b"}))));
        assert!(matches!(lines[2], (RecordPlace::Line(6), Err(BadLine::NotJson(_)))));
        let array = records("\u{feff}  \n[{\"text\": \"a\"},\n {\"text\": \"b\"}, 3]\n").unwrap();
        let values: Vec<_> = array.into_iter().map(|(p, r)| (p, r.unwrap())).collect();
        assert_eq!(
            values,
            [
                (RecordPlace::Element(1), serde_json::json!({"text": "a"})),
                (RecordPlace::Element(2), serde_json::json!({"text": "b"})),
                (RecordPlace::Element(3), serde_json::json!(3)),
            ]
        );
        assert!(records("").unwrap().is_empty());
        assert!(records("[]").unwrap().is_empty());
    }

    #[test]
    fn a_broken_array_is_an_error_naming_the_element_and_a_reader_error_stops_the_parse() {
        let err = records("[{\"text\": \"a\"}, {\"text\": ]").unwrap_err().to_string();
        assert!(err.contains("rows.json") && err.contains("not a JSON array of objects, at array element 2"), "{err}");
        let err = records("[{\"text\": \"a\"}] trailing").unwrap_err().to_string();
        assert!(err.contains("at array element 2"), "{err}");
        let dir = lazytrain_core::ScratchDir::new("json-records").unwrap();
        let path = dir.path().join("rows.json");
        std::fs::write(&path, "[1, 2, 3]").unwrap();
        let mut seen = 0;
        let err = for_each_json_record(&path, false, &mut |_, _| {
            seen += 1;
            Err(crate::DataError::Invalid("no more".into()))
        });
        assert_eq!((seen, err.unwrap_err().to_string().contains("no more")), (1, true));
    }
}
