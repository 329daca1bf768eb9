//! Columnar formats through the Arrow libraries: Parquet files (read a
//! batch of rows at a time, only the text column decoded) and Arrow IPC
//! data (a `datasets` cache's `.arrow` streams, Feather and IPC files).

use super::arrow_file::{ArrowBatches, BatchTooLarge};
use super::parquet_file::ParquetFile;
use super::{io_error, DocumentSink};
use crate::Result;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::Path;

/// Rows decoded per batch.
const BATCH_ROWS: usize = 8192;

/// A reader builder of the Parquet file at `path`, read in place a page at
/// a time, each page header checked against its column chunk.
fn parquet_builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<ParquetFile>> {
    let file = ParquetFile::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone()).map_err(|e| unreadable_parquet(path, e))?;
    file.check_pages_against(builder.metadata());
    Ok(builder)
}

/// The batches of the Parquet file at `path`, decoded only in the columns
/// `pick` chooses from its schema.
fn parquet_batches(path: &Path, pick: impl FnOnce(&Schema) -> Result<Vec<usize>>) -> Result<BatchReader> {
    let builder = parquet_builder(path)?;
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), pick(builder.schema())?);
    let builder = builder.with_projection(mask).with_batch_size(BATCH_ROWS);
    Ok(Box::new(builder.build().map_err(|e| unreadable_parquet(path, e))?))
}

/// The error of a Parquet file the reader refused.
fn unreadable_parquet(path: &Path, e: parquet::errors::ParquetError) -> crate::DataError {
    io_error(path, format!("not a readable Parquet file: {e}"))
}

/// The codec a `parquet` error says is not built in (`brotli`, say).
fn missing_parquet_codec(message: &str) -> Option<&str> {
    let (_, after) = message.split_once("Disabled feature at compile time: ")?;
    Some(after.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or(after))
}

/// The index of `column` in `schema`, which must hold strings.
fn string_column(path: &Path, schema: &Schema, column: &str) -> Result<usize> {
    let Some((index, field)) = schema.column_with_name(column) else {
        let present: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(io_error(
            path,
            format!("no column `{column}`; the file has {}; pass --text-column NAME", present.join(", ")),
        ));
    };
    match field.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(index),
        DataType::Dictionary(_, values)
            if matches!(**values, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) =>
        {
            Ok(index)
        }
        other => Err(io_error(
            path,
            format!("column `{column}` holds {other}, not strings (Utf8, LargeUtf8 or a dictionary of them)"),
        )),
    }
}

/// Column `index` of `batch` (a string array) as owned texts, `None` for
/// nulls.
fn strings_of(path: &Path, batch: &RecordBatch, index: usize) -> Result<Vec<Option<String>>> {
    column_values(batch.column(index).as_ref(), ColumnKind::Text)
        .map_err(|other| io_error(path, format!("a batch holds {other} where strings were declared")))
}

/// Run `f`, a call into the Arrow libraries, which panic on some corrupt
/// files: a panic is an error naming the file (`what` it then is). Only
/// the reading is guarded; what is read is handed on outside, so a panic
/// where it goes is not mistaken for a corrupt file.
fn guarded<T>(path: &Path, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::quiet::quietly(f).unwrap_or_else(|m| Err(io_error(path, format!("{what} (the reader failed: {m})"))))
}

/// The record batches of a Parquet file or an Arrow IPC stream.
type BatchReader = Box<dyn Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>>>;

/// The next batch of `reader` (guarded); `None` at the end. `batch_error`
/// prefixes a batch's read error.
fn next_batch(path: &Path, what: &str, batch_error: &str, reader: &mut BatchReader) -> Result<Option<RecordBatch>> {
    guarded(path, what, || match reader.next() {
        None => Ok(None),
        Some(Err(e)) => Err(arrow_read_error(path, batch_error, &e)),
        Some(Ok(batch)) => Ok(Some(batch)),
    })
}

/// The most bytes of owned text (counting [`ROW_BYTES`] a row besides its
/// text) that one slice of a batch is turned into at a time. A batch
/// decoded from a few kilobytes may stand for far more text than it holds:
/// dictionary keys repeating a long value, string views of one value,
/// zstd-compressed offsets of millions of empty rows.
const SLICE_BYTES: usize = 64 << 20;
/// What a row's owned value costs besides its text.
const ROW_BYTES: usize = 32;

/// The rows of `batch`, in ranges whose values in `columns` take at most
/// [`SLICE_BYTES`] as owned text (a row larger than that alone); guarded,
/// as it reads the batch's offsets and keys.
fn slices(path: &Path, what: &str, batch: &RecordBatch, columns: &[usize]) -> Result<Vec<std::ops::Range<usize>>> {
    guarded(path, what, || {
        let sizes: Vec<_> = columns.iter().map(|&c| text_bytes(batch.column(c).as_ref())).collect();
        let mut slices = Vec::new();
        let (mut start, mut bytes) = (0, 0usize);
        for row in 0..batch.num_rows() {
            let row_bytes = sizes.iter().fold(ROW_BYTES, |all, size| all.saturating_add(size(row)));
            if row > start && bytes.saturating_add(row_bytes) > SLICE_BYTES {
                slices.push(start..row);
                (start, bytes) = (row, 0);
            }
            bytes = bytes.saturating_add(row_bytes);
        }
        if start < batch.num_rows() {
            slices.push(start..batch.num_rows());
        }
        Ok(slices)
    })
}

/// The bytes of text of each row of `array` as a function of the row: a
/// string's length, a dictionary key's value's, 0 for other values (a
/// label's digits fit in [`ROW_BYTES`]).
fn text_bytes(array: &dyn Array) -> Box<dyn Fn(usize) -> usize + '_> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
    };
    match array.data_type() {
        DataType::Utf8 => {
            let strings = array.as_string::<i32>();
            Box::new(move |row| strings.value_length(row) as usize)
        }
        DataType::LargeUtf8 => {
            let strings = array.as_string::<i64>();
            Box::new(move |row| strings.value_length(row) as usize)
        }
        DataType::Utf8View => {
            let views = array.as_string_view().views();
            // A view's low 32 bits are its length.
            Box::new(move |row| views[row] as u32 as usize)
        }
        DataType::Dictionary(key, _) => {
            let dictionary = array.as_any_dictionary();
            let (keys, values) = (dictionary.keys(), text_bytes(dictionary.values().as_ref()));
            let key: Box<dyn Fn(usize) -> usize> = match key.as_ref() {
                DataType::Int8 => Box::new(|row| keys.as_primitive::<Int8Type>().value(row) as usize),
                DataType::Int16 => Box::new(|row| keys.as_primitive::<Int16Type>().value(row) as usize),
                DataType::Int32 => Box::new(|row| keys.as_primitive::<Int32Type>().value(row) as usize),
                DataType::Int64 => Box::new(|row| keys.as_primitive::<Int64Type>().value(row) as usize),
                DataType::UInt8 => Box::new(|row| keys.as_primitive::<UInt8Type>().value(row) as usize),
                DataType::UInt16 => Box::new(|row| keys.as_primitive::<UInt16Type>().value(row) as usize),
                DataType::UInt32 => Box::new(|row| keys.as_primitive::<UInt32Type>().value(row) as usize),
                DataType::UInt64 => Box::new(|row| keys.as_primitive::<UInt64Type>().value(row) as usize),
                // Arrow's dictionary keys are integers; `column_values` refuses the rest.
                _ => Box::new(|_| 0),
            };
            let len = dictionary.values().len();
            Box::new(move |row| match keys.is_valid(row) {
                true => Some(key(row)).filter(|&k| k < len).map_or(0, &values),
                false => 0,
            })
        }
        // Labels' integers and booleans, and the types `column_values` refuses.
        _ => Box::new(|_| 0),
    }
}

/// The error of Arrow data that cannot be read: a codec that is not built
/// in says so, and how to rewrite the file; anything else follows
/// `context`.
fn arrow_read_error(path: &Path, context: &str, e: &arrow_schema::ArrowError) -> crate::DataError {
    if let arrow_schema::ArrowError::ExternalError(inner) = e {
        if let Some(too_large) = inner.downcast_ref::<BatchTooLarge>() {
            // A sound file may hold one: not "truncated or corrupt".
            return io_error(path, too_large.to_string());
        }
    }
    let message = e.to_string();
    match missing_parquet_codec(&message) {
        Some(codec) => io_error(
            path,
            format!(
                "its pages are compressed with {codec}, which lazytrain does not read; rewrite it with snappy, zstd, \
                 gzip or LZ4 (pyarrow.parquet.write_table(table, path, compression=\"zstd\"))"
            ),
        ),
        None => io_error(path, format!("{context}: {message}")),
    }
}

/// Hand every text of column `index` of `reader`'s batches to `docs`, a
/// slice of rows at a time.
fn feed_texts(
    path: &Path,
    (what, batch_error): (&str, &str),
    mut reader: BatchReader,
    index: usize,
    docs: &mut dyn DocumentSink,
) -> Result<()> {
    while let Some(batch) = next_batch(path, what, batch_error, &mut reader)? {
        for rows in slices(path, what, &batch, &[index])? {
            let slice = batch.slice(rows.start, rows.len());
            for text in guarded(path, what, || strings_of(path, &slice, index))? {
                match text {
                    Some(text) => docs.push(&text)?,
                    None => docs.null_row(),
                }
            }
        }
    }
    Ok(())
}

/// What a column of a labelled table may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ColumnKind {
    /// Strings only (a text).
    Text,
    /// Strings, integers or booleans, read as their text (a label).
    Label,
}

/// The values of `array` as text (nulls as `None`), or the type it holds
/// when `kind` does not allow it. A dictionary-encoded column (a pandas
/// category, pyarrow's `dictionary_encode`) gives the values of its keys.
fn column_values(array: &dyn Array, kind: ColumnKind) -> std::result::Result<Vec<Option<String>>, DataType> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
    };
    if let DataType::Dictionary(_, value_type) = array.data_type() {
        if !holds_text(value_type, kind) {
            // Refused before `take`, which would copy a value per key.
            return Err(array.data_type().clone());
        }
        let dictionary = array.as_any_dictionary();
        let looked_up = arrow_select::take::take(dictionary.values().as_ref(), dictionary.keys(), None)
            .map_err(|_| array.data_type().clone())?;
        return column_values(looked_up.as_ref(), kind).map_err(|_| array.data_type().clone());
    }
    if !holds_text(array.data_type(), kind) {
        return Err(array.data_type().clone());
    }
    let strings = |it: &mut dyn Iterator<Item = Option<&str>>| it.map(|v| v.map(str::to_string)).collect();
    Ok(match array.data_type() {
        DataType::Utf8 => strings(&mut array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => strings(&mut array.as_string::<i64>().iter()),
        DataType::Utf8View => strings(&mut array.as_string_view().iter()),
        DataType::Boolean => array.as_boolean().iter().map(|v| v.map(|b| b.to_string())).collect(),
        DataType::Int8 => array.as_primitive::<Int8Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::Int16 => array.as_primitive::<Int16Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::Int32 => array.as_primitive::<Int32Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::Int64 => array.as_primitive::<Int64Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        // `holds_text` admits no other type.
        other => return Err(other.clone()),
    })
}

/// Whether values of `data_type` are read as a column of `kind`: strings,
/// and for labels integers and booleans too.
fn holds_text(data_type: &DataType, kind: ColumnKind) -> bool {
    let label = kind == ColumnKind::Label;
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => label,
        _ => false,
    }
}

/// Hand each row of the `columns` (name and kind) of a Parquet file or
/// Arrow IPC data to `each`, every value as text (`None` for nulls), in file
/// order, a batch of rows read at a time.
pub(crate) fn for_each_table_row(
    path: &Path,
    parquet: bool,
    columns: &[(&str, ColumnKind)],
    each: &mut dyn FnMut(Vec<Option<String>>) -> Result<()>,
) -> Result<()> {
    let what = "not a readable table";
    let (mut reader, batch_error): (BatchReader, &str) = guarded(path, what, || {
        Ok(if parquet {
            (parquet_batches(path, |schema| column_indices(path, schema, columns))?, "a row group cannot be read")
        } else {
            (arrow_ipc_batches(path)?.0, "the Arrow data is truncated or corrupt")
        })
    })?;
    while let Some(batch) = next_batch(path, what, batch_error, &mut reader)? {
        let indices = column_indices(path, &batch.schema(), columns)?;
        for rows in slices(path, what, &batch, &indices)? {
            let slice = batch.slice(rows.start, rows.len());
            guarded(path, what, || table_rows(path, &slice, columns, &indices))?
                .into_iter()
                .try_for_each(&mut *each)?;
        }
    }
    Ok(())
}

/// The index in `schema` of each of the `columns`.
fn column_indices(path: &Path, schema: &Schema, columns: &[(&str, ColumnKind)]) -> Result<Vec<usize>> {
    let index_of = |name: &str| {
        schema.index_of(name).map_err(|_| {
            let present: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            io_error(
                path,
                format!(
                    "no column `{name}`; the file has {}; name the right one with --text-column, --text-pair-column \
                     or --label-column",
                    present.join(", ")
                ),
            )
        })
    };
    columns.iter().map(|&(name, _)| index_of(name)).collect()
}

/// The rows of the `columns` of `batch` (at `indices`), every value as text.
fn table_rows(
    path: &Path,
    batch: &RecordBatch,
    columns: &[(&str, ColumnKind)],
    indices: &[usize],
) -> Result<Vec<Vec<Option<String>>>> {
    let mut values = Vec::with_capacity(columns.len());
    for (&(name, kind), &index) in columns.iter().zip(indices) {
        let wanted = match kind {
            ColumnKind::Text => "strings",
            ColumnKind::Label => "strings, integers or booleans",
        };
        values.push(
            column_values(batch.column(index).as_ref(), kind)
                .map_err(|other| io_error(path, format!("column `{name}` holds {other}, not {wanted}")))?,
        );
    }
    let mut columns: Vec<_> = values.into_iter().map(Vec::into_iter).collect();
    Ok((0..batch.num_rows()).map(|_| columns.iter_mut().map(|c| c.next().flatten()).collect()).collect())
}

/// The strings of `column` of a Parquet file.
pub(super) fn read_parquet(path: &Path, column: &str, docs: &mut dyn DocumentSink) -> Result<()> {
    let what = "not a readable Parquet file";
    let reader =
        guarded(path, what, || parquet_batches(path, |schema| Ok(vec![string_column(path, schema, column)?])))?;
    feed_texts(path, (what, "a row group cannot be read"), reader, 0, docs)
}

/// The record batches of the Arrow IPC data at `path` and their schema
/// ([`ArrowBatches`]: a stream or a file, plain or compressed).
fn arrow_ipc_batches(path: &Path) -> Result<(BatchReader, arrow_schema::SchemaRef)> {
    let (batches, schema) = ArrowBatches::open(path)?;
    Ok((Box::new(batches), schema))
}

/// The strings of `column` of an Arrow IPC stream or file.
pub(super) fn read_arrow(path: &Path, column: &str, docs: &mut dyn DocumentSink) -> Result<()> {
    let what = "the Arrow data is truncated or corrupt";
    let (reader, index) = guarded(path, what, || {
        let (reader, schema) = arrow_ipc_batches(path)?;
        Ok((reader, string_column(path, &schema, column)?))
    })?;
    feed_texts(path, (what, what), reader, index, docs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::{Int64Type, UInt8Type};
    use arrow_array::{DictionaryArray, Int64Array, StringArray};
    use std::sync::Arc;

    /// Rows whose owned text would exceed the slice budget are split into
    /// slices, whatever stands for the text: dictionary keys repeating one
    /// long value, string views of it, or millions of empty rows.
    #[test]
    fn batches_are_turned_into_text_a_bounded_slice_at_a_time() {
        let long = "x".repeat(1 << 20);
        let keys = arrow_array::Int32Array::from(vec![0; 200]);
        let dictionary = DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec![long.as_str()]))).unwrap();
        let views: arrow_array::StringViewArray = std::iter::repeat_n(Some(long.as_str()), 200).collect();
        let empty = StringArray::from(vec![""; 5_000_000]);
        let path = Path::new("batch.arrow");
        for (name, column, most_rows) in [
            ("dictionary", Arc::new(dictionary) as arrow_array::ArrayRef, SLICE_BYTES / ((1 << 20) + ROW_BYTES)),
            ("views", Arc::new(views), SLICE_BYTES / ((1 << 20) + ROW_BYTES)),
            ("empty rows", Arc::new(empty), SLICE_BYTES / ROW_BYTES),
        ] {
            let rows = column.len();
            let batch = RecordBatch::try_from_iter([("text", column)]).unwrap();
            let slices = slices(path, "unreadable", &batch, &[0]).unwrap();
            assert!(slices.len() > 1, "{name}: {slices:?}");
            assert!(slices.iter().all(|s| s.len() <= most_rows), "{name}: {slices:?}");
            assert_eq!(slices.iter().map(|s| s.len()).sum::<usize>(), rows, "{name}: every row once");
            assert!(slices.windows(2).all(|pair| pair[0].end == pair[1].start), "{name}: in order");
        }
        let texts = strings_of(
            path,
            &RecordBatch::try_from_iter([("t", Arc::new(StringArray::from(vec!["a"])) as _)]).unwrap(),
            0,
        );
        assert_eq!(texts.unwrap(), [Some("a".to_string())]);
    }

    #[test]
    fn dictionary_columns_give_the_values_of_their_keys() {
        let texts: DictionaryArray<UInt8Type> = [Some("b"), None, Some("a"), Some("b")].into_iter().collect();
        assert_eq!(
            column_values(&texts, ColumnKind::Text).unwrap(),
            [Some("b".to_string()), None, Some("a".into()), Some("b".into())]
        );
        let keys = arrow_array::Int8Array::from(vec![Some(1), Some(0), None]);
        let labels = DictionaryArray::try_new(keys, Arc::new(Int64Array::from(vec![7, 3]))).unwrap();
        assert_eq!(column_values(&labels, ColumnKind::Label).unwrap(), [Some("3".to_string()), Some("7".into()), None]);
        let err = column_values(&labels, ColumnKind::Text).unwrap_err();
        assert_eq!(err.to_string(), "Dictionary(Int8, Int64)", "a text column names the dictionary's type");
        let strings: DictionaryArray<Int64Type> =
            DictionaryArray::try_new(Int64Array::from(vec![0]), Arc::new(StringArray::from(vec!["x"]))).unwrap();
        assert_eq!(column_values(&strings, ColumnKind::Text).unwrap(), [Some("x".to_string())]);
    }
}
