//! Columnar formats through the Arrow libraries: Parquet files (read a
//! batch of rows at a time, only the text column decoded) and Arrow IPC
//! streams (a `datasets` cache's `.arrow` files).

use super::{io_error, Documents};
use crate::Result;
use arrow_array::{Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
use arrow_schema::{DataType, Schema};
use std::path::Path;

/// Rows decoded per batch.
const BATCH_ROWS: usize = 8192;

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
fn append_strings(path: &Path, batch: &RecordBatch, index: usize, docs: &mut Documents) -> Result<()> {
    let array = batch.column(index);
    let any = array.as_any();
    let mut take = |value: Option<&str>| match value {
        Some(text) => docs.push(text),
        None => docs.null_rows += 1,
    };
    if let Some(strings) = any.downcast_ref::<StringArray>() {
        strings.iter().for_each(&mut take);
    } else if let Some(strings) = any.downcast_ref::<LargeStringArray>() {
        strings.iter().for_each(&mut take);
    } else if let Some(strings) = any.downcast_ref::<StringViewArray>() {
        strings.iter().for_each(&mut take);
    } else {
        return Err(io_error(path, format!("a batch holds {} where strings were declared", array.data_type())));
    }
    Ok(())
}

/// The strings of `column` of a Parquet file.
pub(super) fn read_parquet(path: &Path, column: &str, docs: &mut Documents) -> Result<()> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let file = std::fs::File::open(path).map_err(|e| io_error(path, format!("cannot open the input file: {e}")))?;
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
pub(super) fn read_arrow_stream(path: &Path, column: &str, docs: &mut Documents) -> Result<()> {
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
