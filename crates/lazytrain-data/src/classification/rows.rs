//! Labelled rows from JSON Lines, CSV and TSV files, with every bad row
//! either refused (file and line named) or skipped and counted.

use crate::formats::{BadLine, Compression, RecordPlace};
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// Which columns hold the text, the optional second text and the label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Columns {
    /// The text column.
    pub text: String,
    /// The second text of a pair task (e.g. NLI's hypothesis), if any.
    pub text_pair: Option<String>,
    /// The label column (strings, integers or booleans).
    pub label: String,
}

/// One labelled example and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelledRow {
    /// The text.
    pub text: String,
    /// The second text, for pair tasks.
    pub text_pair: Option<String>,
    /// The label as written in the file.
    pub label: String,
    /// 1-based line of the row in its file.
    pub line: u64,
}

/// Why a row could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadRowKind {
    /// A required column is absent (or null) in the row.
    MissingColumn,
    /// The row is not valid UTF-8.
    InvalidUtf8,
    /// The row does not parse (not a JSON object, a label of the wrong type).
    Malformed,
    /// The label is empty.
    EmptyLabel,
    /// An evaluation row whose label the training data does not have.
    UnknownLabel,
}

/// Skipped bad rows by reason.
pub type BadRowCounts = BTreeMap<BadRowKind, u64>;

/// Refuses or counts bad rows of one file.
pub(crate) struct RowPolicy<'a> {
    /// The file.
    pub path: &'a Path,
    /// Skip and count instead of failing.
    pub skip: bool,
    /// The counts.
    pub counts: &'a mut BadRowCounts,
}

impl RowPolicy<'_> {
    /// A bad row at `line`: an error, or counted when skipping.
    pub fn reject(&mut self, kind: BadRowKind, line: u64, detail: String) -> Result<()> {
        if self.skip {
            *self.counts.entry(kind).or_default() += 1;
            Ok(())
        } else {
            Err(DataError::BadRow { path: self.path.display().to_string(), line, detail })
        }
    }
}

/// Read the labelled rows of a `.jsonl`/`.json` (JSON Lines, or one JSON array of objects), `.csv`,
/// `.tsv` (each also compressed whole: `.jsonl.gz`, `.jsonl.zst`), `.parquet`, `datasets` `.arrow` or
/// `.feather` file (row numbers stand in for lines in the columnar ones). Bad rows are
/// errors naming the file and line, or, with `skip_bad`, skipped and counted
/// in `counts`.
pub fn read_labelled_file(
    path: &Path,
    columns: &Columns,
    skip_bad: bool,
    counts: &mut BadRowCounts,
) -> Result<Vec<LabelledRow>> {
    let mut rows = Vec::new();
    for_each_labelled_row(path, columns, skip_bad, counts, &mut |row| {
        rows.push(row);
        Ok(())
    })?;
    Ok(rows)
}

/// [`read_labelled_file`] a row at a time: each good row is handed to
/// `each` as it is read, so memory holds a line (a batch of a columnar
/// file's rows), not the file.
pub fn for_each_labelled_row(
    path: &Path,
    columns: &Columns,
    skip_bad: bool,
    counts: &mut BadRowCounts,
    each: &mut dyn FnMut(LabelledRow) -> Result<()>,
) -> Result<()> {
    let (compression, extension) = Compression::of_path(path);
    let mut rows = Rows { policy: RowPolicy { path, skip: skip_bad, counts }, each };
    match extension.as_str() {
        "jsonl" | "json" | "ndjson" => read_json_lines(path, compression, columns, &mut rows),
        "csv" => read_delimited(path, compression, b',', columns, &mut rows),
        "tsv" | "tab" => read_delimited(path, compression, b'\t', columns, &mut rows),
        "parquet" => compression.refuse_columnar(path).and_then(|()| read_columnar(path, true, columns, &mut rows)),
        "arrow" | "feather" => {
            compression.refuse_columnar(path).and_then(|()| read_columnar(path, false, columns, &mut rows))
        }
        other => Err(DataError::Io {
            path: path.display().to_string(),
            detail: format!(
                "unknown labelled-data format `.{other}`; use .jsonl (JSON Lines), .csv, .tsv (each also .gz or \
                 .zst), .parquet, a `datasets` .arrow file or .feather"
            ),
        }),
    }
}

/// Where a reader's rows go: bad ones to the policy, good ones to `each`.
struct Rows<'a, 'c> {
    policy: RowPolicy<'a>,
    each: &'c mut dyn FnMut(LabelledRow) -> Result<()>,
}

impl Rows<'_, '_> {
    /// A bad row at `line`: an error, or counted when skipping.
    fn reject(&mut self, kind: BadRowKind, line: u64, detail: String) -> Result<()> {
        self.policy.reject(kind, line, detail)
    }

    /// Hand on `row`, unless its label is empty.
    fn push(&mut self, row: LabelledRow) -> Result<()> {
        if row.label.trim().is_empty() {
            return self.reject(BadRowKind::EmptyLabel, row.line, "the label is empty".into());
        }
        (self.each)(row)
    }
}

/// What kind of JSON value `value` is, for errors: the text reader's
/// [`json_type`](crate::formats::json_type), with a number that is not a
/// 64-bit integer (no label) told from one that is.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        serde_json::Value::Number(_) => "a number that is not a 64-bit integer",
        other => crate::formats::json_type(other),
    }
}

/// A JSON value as label text: strings as they are, integers and booleans
/// in their JSON spelling.
fn label_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// The labelled rows of JSON Lines or one JSON array of objects (an
/// element's number stands in for its line).
fn read_json_lines(path: &Path, compression: Compression, columns: &Columns, policy: &mut Rows) -> Result<()> {
    crate::formats::for_each_json_record(path, compression, &mut |place, record| {
        let line = place.number();
        // An array element's number stands in for a line; the detail says which it is.
        let at = |detail: String| match place {
            RecordPlace::Line(_) => detail,
            RecordPlace::Element(n) => format!("array element {n}: {detail}"),
        };
        let object = match record {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(_) => return policy.reject(BadRowKind::Malformed, line, at("not a JSON object".into())),
            Err(BadLine::InvalidUtf8) => {
                return policy.reject(BadRowKind::InvalidUtf8, line, at("invalid UTF-8".into()))
            }
            Err(BadLine::NotJson(e)) => {
                return policy.reject(BadRowKind::Malformed, line, at(format!("not valid JSON ({e})")));
            }
        };
        let present = |name: &str| object.get(name).filter(|v| !v.is_null());
        let mut missing = vec![columns.text.as_str(), columns.label.as_str()];
        missing.extend(columns.text_pair.as_deref());
        missing.retain(|name| present(name).is_none());
        if !missing.is_empty() {
            let (null, absent): (Vec<&str>, Vec<&str>) = missing.iter().partition(|name| object.contains_key(**name));
            let have: Vec<&str> = object.keys().map(String::as_str).collect();
            let detail = match absent.is_empty() {
                true => format!("column `{}` is null", null.join("`, `")),
                false => format!("missing column `{}` (the row has: {})", absent.join("`, `"), have.join(", ")),
            };
            return policy.reject(BadRowKind::MissingColumn, line, at(detail));
        }
        let string = |name: &str| present(name).and_then(|v| v.as_str()).map(str::to_string);
        let Some(text) = string(&columns.text) else {
            let value = present(&columns.text).map_or("null", json_kind);
            let detail = format!("column `{}` is {value}, not a string", columns.text);
            return policy.reject(BadRowKind::Malformed, line, at(detail));
        };
        let Some(label) = present(&columns.label).and_then(label_text) else {
            let value = present(&columns.label).map_or("null", json_kind);
            let detail = format!(
                "column `{}` is {value}; a label must be a string, an integer (of at most 64 bits) or a boolean",
                columns.label
            );
            return policy.reject(BadRowKind::Malformed, line, at(detail));
        };
        let text_pair = match &columns.text_pair {
            Some(name) => match string(name) {
                Some(pair) => Some(pair),
                None => {
                    return policy.reject(BadRowKind::Malformed, line, at(format!("column `{name}` must be a string")))
                }
            },
            None => None,
        };
        policy.push(LabelledRow { text, text_pair, label, line })
    })
}

fn read_delimited(
    path: &Path,
    compression: Compression,
    delimiter: u8,
    columns: &Columns,
    policy: &mut Rows,
) -> Result<()> {
    let io = |detail: String| DataError::Io { path: path.display().to_string(), detail };
    let file = crate::formats::open_delimited(path, compression)?;
    let mut reader = csv::ReaderBuilder::new().delimiter(delimiter).flexible(true).from_reader(file);
    let hint = |e: &csv::Error| if e.is_io_error() { compression.read_error_hint() } else { "" };
    let header: Vec<String> = reader
        .byte_headers()
        .map_err(|e| io(format!("cannot read the header: {e}{}", hint(&e))))?
        .iter()
        .map(|h| String::from_utf8_lossy(h).trim().to_string())
        .collect();
    let find = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| {
            io(format!(
                "no column `{name}` in the header (columns: {}); name the right one with --text-column, --text-pair-column or --label-column",
                header.join(", ")
            ))
        })
    };
    let text_at = find(&columns.text)?;
    let label_at = find(&columns.label)?;
    let pair_at = columns.text_pair.as_deref().map(find).transpose()?;
    let mut record = csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(io(format!("cannot parse the file: {e}{}", hint(&e)))),
        }
        let line = record.position().map_or(0, |p| p.line());
        let field = |at: usize| record.get(at).map(|bytes| std::str::from_utf8(bytes).map(str::to_string));
        let mut wanted = vec![(columns.text.as_str(), text_at), (columns.label.as_str(), label_at)];
        if let (Some(name), Some(at)) = (columns.text_pair.as_deref(), pair_at) {
            wanted.push((name, at));
        }
        let mut values = Vec::with_capacity(wanted.len());
        let mut bad = None;
        for (name, at) in wanted {
            match field(at) {
                None => {
                    bad = Some((
                        BadRowKind::MissingColumn,
                        format!(
                            "missing column `{name}` (the row has {} fields, the header {})",
                            record.len(),
                            header.len()
                        ),
                    ));
                    break;
                }
                Some(Err(_)) => {
                    bad = Some((BadRowKind::InvalidUtf8, format!("invalid UTF-8 in column `{name}`")));
                    break;
                }
                Some(Ok(value)) => values.push(value),
            }
        }
        if let Some((kind, detail)) = bad {
            policy.reject(kind, line, detail)?;
            continue;
        }
        let mut values = values.into_iter();
        let (text, label) = (values.next().unwrap_or_default(), values.next().unwrap_or_default());
        policy.push(LabelledRow { text, text_pair: values.next(), label, line })?;
    }
    Ok(())
}

/// Rows of a Parquet file or Arrow stream: text (and pair) columns of
/// strings, a label column of strings, integers (a `datasets` ClassLabel)
/// or booleans; a null is a missing value.
fn read_columnar(path: &Path, parquet: bool, columns: &Columns, policy: &mut Rows) -> Result<()> {
    use crate::formats::{for_each_table_row, ColumnKind};
    let mut wanted = vec![(columns.text.as_str(), ColumnKind::Text), (columns.label.as_str(), ColumnKind::Label)];
    wanted.extend(columns.text_pair.as_deref().map(|name| (name, ColumnKind::Text)));
    let mut line = 0;
    for_each_table_row(path, parquet, &wanted, &mut |values| {
        line += 1;
        let missing: Vec<&str> =
            wanted.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|((n, _), _)| *n).collect();
        if !missing.is_empty() {
            return policy.reject(
                BadRowKind::MissingColumn,
                line,
                format!("row {line}: `{}` is null", missing.join("`, `")),
            );
        }
        let mut values = values.into_iter().flatten();
        let (text, label) = (values.next().unwrap_or_default(), values.next().unwrap_or_default());
        policy.push(LabelledRow { text, text_pair: values.next(), label, line })
    })
}

/// How label ids are assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabelOrder {
    /// In the order labels first appear in the training files.
    FirstSeen,
    /// Sorted: numerically when every label is an integer, else by text.
    Sorted,
}

impl LabelOrder {
    /// Parse `first-seen` or `sorted`.
    pub fn parse(text: &str) -> Result<LabelOrder> {
        match text {
            "first-seen" => Ok(LabelOrder::FirstSeen),
            "sorted" => Ok(LabelOrder::Sorted),
            other => Err(DataError::Invalid(format!("label order `{other}`; choose first-seen or sorted"))),
        }
    }
}

/// The label names of the training rows, in id order.
pub fn label_names(rows: &[LabelledRow], order: LabelOrder) -> Vec<String> {
    let mut seen = LabelsSeen::default();
    for row in rows {
        seen.add(&row.label);
    }
    seen.in_order(order)
}

/// The label names of rows as they are read, each once.
#[derive(Default)]
pub(crate) struct LabelsSeen {
    /// In the order they first appear.
    names: Vec<String>,
    known: HashSet<String>,
}

impl LabelsSeen {
    /// Note `label`.
    pub(crate) fn add(&mut self, label: &str) {
        if !self.known.contains(label) {
            self.known.insert(label.to_string());
            self.names.push(label.to_string());
        }
    }

    /// The names in id order.
    pub(crate) fn in_order(self, order: LabelOrder) -> Vec<String> {
        let mut names = self.names;
        if order == LabelOrder::Sorted {
            let numbers: Option<Vec<i64>> = names.iter().map(|n| n.trim().parse().ok()).collect();
            match numbers {
                Some(_) => names.sort_by_key(|n| n.trim().parse::<i64>().unwrap_or_default()),
                None => names.sort(),
            }
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: &str) -> LabelledRow {
        LabelledRow { text: "t".into(), text_pair: None, label: label.into(), line: 1 }
    }

    #[test]
    fn label_orders() {
        let rows: Vec<_> = ["pos", "neg", "10", "pos"].iter().map(|l| row(l)).collect();
        assert_eq!(label_names(&rows, LabelOrder::FirstSeen), ["pos", "neg", "10"]);
        assert_eq!(label_names(&rows, LabelOrder::Sorted), ["10", "neg", "pos"]);
        let numeric: Vec<_> = ["10", "9", "2"].iter().map(|l| row(l)).collect();
        assert_eq!(label_names(&numeric, LabelOrder::Sorted), ["2", "9", "10"], "integers sort as numbers");
        assert!(LabelOrder::parse("alphabetical").unwrap_err().to_string().contains("first-seen or sorted"));
    }

    /// Line formats compressed whole (gzip, zstd) read as the other
    /// commands read them; compressed columnar files are named.
    #[test]
    fn compressed_labelled_files_read_like_plain_ones() {
        use std::io::Write;
        let dir = lazytrain_core::ScratchDir::new("labelled-compressed").unwrap();
        let columns = Columns { text: "text".into(), text_pair: None, label: "label".into() };
        let read = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            let compressed = match name.rsplit_once('.').unwrap().1 {
                "gz" => {
                    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    gz.write_all(bytes).unwrap();
                    gz.finish().unwrap()
                }
                "zst" => zstd::encode_all(bytes, 3).unwrap(),
                other => unreachable!("no test file ends with .{other}"),
            };
            std::fs::write(&path, compressed).unwrap();
            read_labelled_file(&path, &columns, false, &mut BadRowCounts::new())
        };
        for suffix in ["gz", "zst"] {
            let jsonl = read(
                &format!("rows.jsonl.{suffix}"),
                b"{\"text\": \"a b\", \"label\": \"x\"}\n{\"text\": \"c\", \"label\": 2}\n",
            );
            let labels: Vec<String> = jsonl.unwrap().into_iter().map(|r| r.label).collect();
            assert_eq!(labels, ["x", "2"], "{suffix}");
            let csv = read(&format!("rows.csv.{suffix}"), b"text,label\na b,x\nc,y\n").unwrap();
            assert_eq!(csv.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(), ["a b", "c"], "{suffix}");
            let err = read(&format!("rows.parquet.{suffix}"), b"PAR1").err().unwrap().to_string();
            assert!(err.contains("Parquet or Arrow files compressed whole") && err.contains("are not read"), "{err}");
        }
    }
}
