//! The records of a JSON input, one at a time: JSON Lines (an object a
//! line) or one JSON array of objects (what `json.dump(rows)` and pandas'
//! `to_json(orient="records")` write, and `datasets`' JSON loader reads),
//! told apart by the first character. An array is parsed an element at a
//! time, so memory holds one record, not the file.

use super::{io_error, next_line, open, Compression, MAX_LINE_BYTES};
use crate::Result;
use serde::de::{Error as _, SeqAccess, Visitor};
use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::rc::Rc;

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

/// What takes each record: its place, and its value or why its line is not
/// one.
pub(crate) type RecordSink<'a> =
    dyn FnMut(RecordPlace, std::result::Result<serde_json::Value, BadLine>) -> Result<()> + 'a;

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
pub(crate) fn for_each_json_record(path: &Path, compression: Compression, each: &mut RecordSink<'_>) -> Result<()> {
    let mut reader = BufReader::new(open(path, compression)?);
    match first_character(&mut reader, path, compression)? {
        (Some(b'['), _) => each_array_element(reader, path, MAX_LINE_BYTES, each),
        (_, blank_lines) => each_line(reader, path, compression, blank_lines, each),
    }
}

/// The first byte of `reader` after a byte-order mark (which editors on
/// Windows write) and white space, which are consumed (`None` when there is
/// nothing else), and the line breaks among them.
fn first_character(reader: &mut impl BufRead, path: &Path, compression: Compression) -> Result<(Option<u8>, u64)> {
    const BYTE_ORDER_MARK: &[u8] = "\u{feff}".as_bytes();
    let cannot_read = |e: std::io::Error| io_error(path, format!("cannot read: {e}{}", compression.read_error_hint()));
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
    compression: Compression,
    blank_lines: u64,
    each: &mut RecordSink<'_>,
) -> Result<()> {
    let mut raw = Vec::new();
    let mut line = blank_lines;
    while next_line(&mut reader, &mut raw, path, compression, line + 1)? {
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

/// One JSON array: each element a record, parsed as it is reached; an
/// element longer than `max_element_bytes` ([`MAX_LINE_BYTES`], the line
/// formats' bound) is an error, not an allocation as large as the file.
fn each_array_element(
    reader: impl BufRead,
    path: &Path,
    max_element_bytes: usize,
    each: &mut RecordSink<'_>,
) -> Result<()> {
    let element_bytes = Rc::new(Cell::new(0));
    let reader = ElementBytes { inner: reader, count: Rc::clone(&element_bytes), max: max_element_bytes };
    let mut elements = Elements { each, count: 0, finished: false, failed: None, element_bytes };
    let mut parser = serde_json::Deserializer::from_reader(reader);
    let parsed =
        serde::Deserializer::deserialize_seq(&mut parser, ElementsVisitor(&mut elements)).and_then(|()| parser.end());
    if let Some(error) = elements.failed {
        return Err(error);
    }
    parsed.map_err(|e| {
        let place = match elements.finished {
            true => format!("after the array's {} elements", elements.count),
            false if elements.element_bytes.get() > max_element_bytes => {
                return io_error(
                    path,
                    format!(
                        "array element {} is longer than {} MiB; is it a JSON file?",
                        elements.count + 1,
                        max_element_bytes >> 20
                    ),
                )
            }
            false => format!("at array element {}", elements.count + 1),
        };
        io_error(
            path,
            format!(
                "not a JSON array of objects, {place}: {e} (a JSON input holds JSON Lines, an object a line, or one \
                 array of objects; JSON Lines of arrays are not read)"
            ),
        )
    })
}

/// A reader that counts the bytes of the element being parsed, and fails
/// once they pass `max` (`serde_json` reads one byte ahead at most, so the
/// count is the element's).
struct ElementBytes<R> {
    inner: R,
    /// Bytes since the last element was handed on (reset by [`Elements`]).
    count: Rc<Cell<usize>>,
    /// The longest element.
    max: usize,
}

impl<R: std::io::Read> std::io::Read for ElementBytes<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.count.get() > self.max {
            return Err(std::io::Error::other("the element is too long"));
        }
        let read = self.inner.read(buf)?;
        self.count.set(self.count.get() + read);
        Ok(read)
    }
}

/// The visitor of an array's elements: each goes to `each` as it is
/// parsed; an error of `each` stops the parse and is kept in `failed`.
struct Elements<'e> {
    /// Where each element goes.
    each: &'e mut RecordSink<'e>,
    /// Elements handed on.
    count: u64,
    /// Whether the array's closing bracket was read.
    finished: bool,
    /// The error of `each` that stopped the parse.
    failed: Option<crate::DataError>,
    /// Bytes read since the last element was handed on.
    element_bytes: Rc<Cell<usize>>,
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
            self.0.element_bytes.set(0);
            if let Err(e) = (self.0.each)(RecordPlace::Element(self.0.count), Ok(value)) {
                self.0.failed = Some(e);
                return Err(A::Error::custom("stopped by the reader"));
            }
        }
        self.0.finished = true;
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
        for_each_json_record(&path, Compression::None, &mut |place, record| {
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
    fn an_array_element_longer_than_a_line_may_be_is_an_error_not_an_allocation() {
        let long: String = std::iter::repeat_n('a', 3 << 20).collect();
        let array = format!("[{{\"text\": \"short\"}}, {{\"text\": \"{long}\"}}]");
        let mut seen = 0;
        let mut count = |_: RecordPlace, _: std::result::Result<serde_json::Value, BadLine>| {
            seen += 1;
            Ok(())
        };
        let err = each_array_element(array.as_bytes(), Path::new("long.json"), 2 << 20, &mut count);
        let err = err.unwrap_err().to_string();
        assert!(err.contains("long.json") && err.contains("array element 2 is longer than 2 MiB"), "{err}");
        assert_eq!(seen, 1);
        assert!(each_array_element(array.as_bytes(), Path::new("long.json"), 4 << 20, &mut |_, _| Ok(())).is_ok());
    }

    #[test]
    fn a_broken_array_is_an_error_naming_the_element_and_a_reader_error_stops_the_parse() {
        let err = records("[{\"text\": \"a\"}, {\"text\": ]").unwrap_err().to_string();
        assert!(err.contains("rows.json") && err.contains("not a JSON array of objects, at array element 2"), "{err}");
        let err = records("[{\"text\": \"a\"}] trailing").unwrap_err().to_string();
        assert!(err.contains("after the array's 1 elements: trailing characters"), "{err}");
        let err = records("[{\"text\": \"a\"}]\n[{\"text\": \"b\"}]\n").unwrap_err().to_string();
        assert!(
            err.contains("after the array's 1 elements") && err.contains("JSON Lines of arrays are not read"),
            "{err}"
        );
        let dir = lazytrain_core::ScratchDir::new("json-records").unwrap();
        let path = dir.path().join("rows.json");
        std::fs::write(&path, "[1, 2, 3]").unwrap();
        let mut seen = 0;
        let err = for_each_json_record(&path, Compression::None, &mut |_, _| {
            seen += 1;
            Err(crate::DataError::Invalid("no more".into()))
        });
        assert_eq!((seen, err.unwrap_err().to_string().contains("no more")), (1, true));
    }
}
