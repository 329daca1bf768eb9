//! Columnar formats through the Arrow libraries: Parquet files (read a
//! batch of rows at a time, only the text column decoded) and Arrow IPC
//! streams (a `datasets` cache's `.arrow` files).

use super::{io_error, DocumentSink};
use crate::Result;
use arrow_array::{Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
use arrow_schema::{DataType, Schema};
use std::path::Path;

/// Rows decoded per batch.
const BATCH_ROWS: usize = 8192;

/// The bytes of the Parquet file at `path`, read whole before the reader
/// parses them: the reader decodes page headers a byte at a time, and from
/// a `File` each byte is a system call, so a corrupt header declaring
/// billions of fields took 36 s of reads to fail (found by `tests/fuzz.rs`);
/// from memory it fails at once. A text corpus's Parquet file is no larger
/// than the texts read out of it.
fn parquet_bytes(path: &Path) -> Result<bytes::Bytes> {
    std::fs::read(path).map(bytes::Bytes::from).map_err(|e| io_error(path, format!("cannot read the input file: {e}")))
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
        other => Err(io_error(path, format!("column `{column}` holds {other}, not strings (Utf8 or LargeUtf8)"))),
    }
}

/// Append column `index` of `batch` (a string array) to `docs`.
fn append_strings(path: &Path, batch: &RecordBatch, index: usize, docs: &mut dyn DocumentSink) -> Result<()> {
    let array = batch.column(index);
    let any = array.as_any();
    let mut take = |value: Option<&str>| match value {
        Some(text) => docs.push(text),
        None => {
            docs.null_row();
            Ok(())
        }
    };
    if let Some(strings) = any.downcast_ref::<StringArray>() {
        strings.iter().try_for_each(&mut take)?;
    } else if let Some(strings) = any.downcast_ref::<LargeStringArray>() {
        strings.iter().try_for_each(&mut take)?;
    } else if let Some(strings) = any.downcast_ref::<StringViewArray>() {
        strings.iter().try_for_each(&mut take)?;
    } else {
        return Err(io_error(path, format!("a batch holds {} where strings were declared", array.data_type())));
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
/// when `kind` does not allow it.
fn column_values(array: &dyn Array, kind: ColumnKind) -> std::result::Result<Vec<Option<String>>, DataType> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
    };
    let strings = |it: &mut dyn Iterator<Item = Option<&str>>| it.map(|v| v.map(str::to_string)).collect();
    let label = kind == ColumnKind::Label;
    Ok(match array.data_type() {
        DataType::Utf8 => strings(&mut array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => strings(&mut array.as_string::<i64>().iter()),
        DataType::Utf8View => strings(&mut array.as_string_view().iter()),
        DataType::Boolean if label => array.as_boolean().iter().map(|v| v.map(|b| b.to_string())).collect(),
        DataType::Int8 if label => array.as_primitive::<Int8Type>().iter().map(|v| v.map(|x| x.to_string())).collect(),
        DataType::Int16 if label => {
            array.as_primitive::<Int16Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::Int32 if label => {
            array.as_primitive::<Int32Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::Int64 if label => {
            array.as_primitive::<Int64Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::UInt8 if label => {
            array.as_primitive::<UInt8Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::UInt16 if label => {
            array.as_primitive::<UInt16Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::UInt32 if label => {
            array.as_primitive::<UInt32Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        DataType::UInt64 if label => {
            array.as_primitive::<UInt64Type>().iter().map(|v| v.map(|x| x.to_string())).collect()
        }
        other => return Err(other.clone()),
    })
}

/// Rows of the `columns` (name and kind) of a Parquet file or Arrow
/// stream, each value as text (`None` for nulls), in file order.
pub(crate) fn read_table(
    path: &Path,
    parquet: bool,
    columns: &[(&str, ColumnKind)],
) -> Result<Vec<Vec<Option<String>>>> {
    // The Arrow libraries panic on some corrupt files: an error all the same.
    crate::quiet::quietly(|| read_table_unguarded(path, parquet, columns))
        .unwrap_or_else(|m| Err(io_error(path, format!("not a readable table (the reader failed: {m})"))))
}

fn read_table_unguarded(
    path: &Path,
    parquet: bool,
    columns: &[(&str, ColumnKind)],
) -> Result<Vec<Vec<Option<String>>>> {
    let batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, String>>> = if parquet {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let file = parquet_bytes(path)?;
        let unreadable = |e: parquet::errors::ParquetError| io_error(path, format!("not a readable Parquet file: {e}"));
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(file).map_err(unreadable)?.with_batch_size(BATCH_ROWS).build();
        Box::new(reader.map_err(unreadable)?.map(|b| b.map_err(|e| format!("a row group cannot be read: {e}"))))
    } else {
        let file = std::fs::File::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(file), None)
            .map_err(|e| io_error(path, format!("not an Arrow IPC stream: {e}")))?;
        Box::new(reader.map(|b| b.map_err(|e| format!("the stream is truncated or corrupt: {e}"))))
    };
    let mut rows = Vec::new();
    for batch in batches {
        let batch = batch.map_err(|e| io_error(path, e))?;
        let schema = batch.schema();
        let mut values = Vec::with_capacity(columns.len());
        for &(name, kind) in columns {
            let Ok(index) = schema.index_of(name) else {
                let present: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(io_error(
                    path,
                    format!("no column `{name}`; the file has {}; name the right one with --text-column, --text-pair-column or --label-column", present.join(", ")),
                ));
            };
            let wanted = match kind {
                ColumnKind::Text => "strings",
                ColumnKind::Label => "strings, integers or booleans",
            };
            values.push(
                column_values(batch.column(index).as_ref(), kind)
                    .map_err(|other| io_error(path, format!("column `{name}` holds {other}, not {wanted}")))?,
            );
        }
        for row in 0..batch.num_rows() {
            rows.push(values.iter().map(|column| column[row].clone()).collect());
        }
    }
    Ok(rows)
}

/// The strings of `column` of a Parquet file.
pub(super) fn read_parquet(path: &Path, column: &str, docs: &mut dyn DocumentSink) -> Result<()> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let file = parquet_bytes(path)?;
    let unreadable = |e: parquet::errors::ParquetError| io_error(path, format!("not a readable Parquet file: {e}"));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(unreadable)?;
    let index = string_column(path, builder.schema(), column)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder.with_projection(mask).with_batch_size(BATCH_ROWS).build().map_err(unreadable)?;
    for batch in reader {
        let batch = batch.map_err(|e| io_error(path, format!("a row group cannot be read: {e}")))?;
        append_strings(path, &batch, 0, docs)?;
    }
    Ok(())
}

/// The strings of `column` of an Arrow IPC stream.
pub(super) fn read_arrow_stream(path: &Path, column: &str, docs: &mut dyn DocumentSink) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(file), None)
        .map_err(|e| io_error(path, format!("not an Arrow IPC stream (as `datasets` writes its .arrow files): {e}")))?;
    let index = string_column(path, &reader.schema(), column)?;
    for batch in reader {
        let batch = batch.map_err(|e| io_error(path, format!("the stream is truncated or corrupt: {e}")))?;
        append_strings(path, &batch, index, docs)?;
    }
    Ok(())
}
