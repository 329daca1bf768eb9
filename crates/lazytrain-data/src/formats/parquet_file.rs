//! A Parquet file read in place, a page at a time: what the `parquet`
//! reader asks for, and no more, so memory holds one page (and the batch
//! decoded from it), not the file.
//!
//! The `parquet` crate's own reader of a `File` has faults on corrupt files
//! that this one mends:
//! - a range is allocated whole before it is checked against the file's
//!   size; here a range past the end is an error before anything is
//!   allocated;
//! - a reader at the end of the file answers "no bytes" instead of an
//!   error, which the page-header decoder takes for a skipped field and asks
//!   again: a header declaring billions of 8-byte fields took 36 s of empty
//!   reads to fail (found by `tests/fuzz.rs`); here a read at the end is an
//!   error;
//! - a page header's uncompressed size is reserved whole before it is
//!   checked (apache/arrow-rs#10734, found by the same fuzzer: 1.15 GB for a
//!   file of a few kilobytes, and on a machine without memory overcommit an
//!   abort, not an error). Here, once [`ParquetFile::check_pages_against`]
//!   has the file's metadata, a page header that declares more uncompressed
//!   bytes than its whole column chunk holds — which no valid file does —
//!   is an error before the page is read. This is the check the upstream
//!   fix (#10821) adds; it can go when a release carries it.

use bytes::Bytes;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

/// Bytes a page-header reader fetches at a time: headers are a few dozen
/// bytes, pages themselves are read by exact ranges.
const HEADER_READ_BYTES: usize = 8 * 1024;

/// An open Parquet file and its size; clones share the file and the page
/// checks.
#[derive(Clone)]
pub(crate) struct ParquetFile {
    file: Arc<File>,
    size: u64,
    /// The column chunks page headers are checked against, once known.
    chunks: Arc<OnceLock<Vec<ColumnChunkBound>>>,
}

/// A column chunk's bytes in the file and the uncompressed bytes of all its
/// pages (headers included), from the file's metadata.
#[derive(Clone, Copy, Debug)]
struct ColumnChunkBound {
    start: u64,
    end: u64,
    uncompressed: u64,
}

impl ParquetFile {
    /// Open the file at `path`.
    pub(crate) fn open(path: &std::path::Path) -> std::io::Result<ParquetFile> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Ok(ParquetFile { file: Arc::new(file), size, chunks: Arc::default() })
    }

    /// From now on, check each page header read against its column chunk in
    /// `metadata` (this file's): a page cannot hold more uncompressed bytes
    /// than its whole chunk.
    pub(crate) fn check_pages_against(&self, metadata: &ParquetMetaData) {
        let mut chunks: Vec<ColumnChunkBound> = metadata
            .row_groups()
            .iter()
            .flat_map(|group| group.columns())
            .filter_map(|column| {
                let (start, length) = column.byte_range();
                let uncompressed = u64::try_from(column.uncompressed_size()).ok()?;
                Some(ColumnChunkBound { start, end: start.checked_add(length)?, uncompressed })
            })
            .collect();
        chunks.sort_by_key(|c| c.start);
        // A second call (a file read twice) finds the same chunks.
        let _ = self.chunks.set(chunks);
    }

    /// The column chunk holding byte `offset`, when the chunks are known.
    fn chunk_at(&self, offset: u64) -> Option<ColumnChunkBound> {
        let chunks = self.chunks.get()?;
        let after = chunks.partition_point(|c| c.start <= offset);
        chunks[..after].last().copied().filter(|c| offset < c.end)
    }

    /// Refuse the page header at `start` when it declares more uncompressed
    /// bytes than its column chunk holds.
    fn check_page_header(&self, start: u64) -> Result<()> {
        let Some(chunk) = self.chunk_at(start) else { return Ok(()) };
        let tail = FileTail { file: Arc::clone(&self.file), position: start, end: self.size };
        match declared_uncompressed_size(&mut BufReader::with_capacity(64, tail)) {
            Some(declared) if declared > chunk.uncompressed => Err(ParquetError::General(format!(
                "the page header at byte {start} declares {declared} uncompressed bytes, more than the {} of its \
                 whole column chunk",
                chunk.uncompressed
            ))),
            _ => Ok(()),
        }
    }

    /// The error for `length` bytes at `start`, which the file does not hold.
    fn past_the_end(&self, start: u64, length: u64) -> ParquetError {
        ParquetError::EOF(format!(
            "the file is {} bytes long, but its metadata points at {length} bytes from byte {start}",
            self.size
        ))
    }
}

impl Length for ParquetFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for ParquetFile {
    type T = BufReader<FileTail>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        if start > self.size {
            return Err(self.past_the_end(start, 0));
        }
        self.check_page_header(start)?;
        let tail = FileTail { file: Arc::clone(&self.file), position: start, end: self.size };
        Ok(BufReader::with_capacity(HEADER_READ_BYTES, tail))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let end = start.checked_add(length as u64).filter(|&end| end <= self.size);
        if end.is_none() {
            return Err(self.past_the_end(start, length as u64));
        }
        let mut buffer = vec![0; length];
        self.file.read_exact_at(&mut buffer, start)?;
        Ok(buffer.into())
    }
}

/// The `uncompressed_page_size` a page header (Thrift compact encoding) at
/// the front of `header` declares, decoded as the `parquet` crate decodes
/// it (a varint of any length, cut to an `i32`), when the header opens, as
/// writers write it, with its fields 1 (the page type) and 2 (that size),
/// both `i32`; `None` otherwise (the crate then decodes it as ever) or when
/// the size is negative (which the crate refuses).
fn declared_uncompressed_size(header: &mut dyn Read) -> Option<u64> {
    /// A field header: the field id one past the last, type `i32`.
    const NEXT_I32_FIELD: u8 = 0x15;
    fn byte(header: &mut dyn Read) -> Option<u8> {
        let mut b = [0u8];
        header.read_exact(&mut b).ok().map(|()| b[0])
    }
    fn zigzag_varint(header: &mut dyn Read) -> Option<i64> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let b = byte(header)?;
            value |= u64::from(b & 0x7f).wrapping_shl(shift);
            if b & 0x80 == 0 {
                return Some((value >> 1) as i64 ^ -((value & 1) as i64));
            }
            shift = shift.wrapping_add(7);
        }
    }
    (byte(header)? == NEXT_I32_FIELD).then_some(())?;
    zigzag_varint(header)?;
    (byte(header)? == NEXT_I32_FIELD).then_some(())?;
    u64::try_from(zigzag_varint(header)? as i32).ok()
}

/// The file from a position to its end, read with positioned reads (so
/// readers of one file do not share a cursor); a read at the end is an
/// error, not an empty answer.
pub(crate) struct FileTail {
    file: Arc<File>,
    position: u64,
    end: u64,
}

impl Read for FileTail {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let left = self.end - self.position;
        if left == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "a page header runs past the end of the file",
            ));
        }
        let wanted = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = self.file.read_at(&mut buf[..wanted], self.position)?;
        if read == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file became shorter while read"));
        }
        self.position += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> (lazytrain_core::ScratchDir, ParquetFile) {
        let dir = lazytrain_core::ScratchDir::new("parquet-file").unwrap();
        let path = dir.path().join("f.parquet");
        std::fs::write(&path, bytes).unwrap();
        let file = ParquetFile::open(&path).unwrap();
        (dir, file)
    }

    /// A Snappy-compressed Parquet file of one row holding `text`.
    fn one_text_parquet(text: &str) -> Vec<u8> {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use parquet::arrow::ArrowWriter;
        use parquet::basic::Compression;
        use parquet::file::properties::WriterProperties;
        let column: ArrayRef = Arc::new(StringArray::from(vec![text]));
        let batch = RecordBatch::try_from_iter([("text", column)]).unwrap();
        let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut bytes = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        bytes
    }

    /// The texts of the Parquet file `file`, read as `read_parquet` does.
    fn texts_of(file: ParquetFile) -> Result<Vec<String>> {
        use arrow_array::cast::AsArray;
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone())?;
        file.check_pages_against(builder.metadata());
        let mut texts = Vec::new();
        for batch in builder.build()? {
            let batch = batch.map_err(|e| ParquetError::General(e.to_string()))?;
            texts.extend(batch.column(0).as_string::<i32>().iter().map(|t| t.unwrap().to_string()));
        }
        Ok(texts)
    }

    #[test]
    fn a_page_declaring_more_than_its_column_chunk_is_refused_before_it_is_read() {
        let text: String = (0..20_000).map(|i| format!("w{} ", i % 977)).collect();
        let bytes = one_text_parquet(&text);
        let (_dir, file) = file_of(&bytes);
        assert_eq!(texts_of(file).unwrap(), [text], "a valid file reads whole");

        let metadata =
            parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&Bytes::from(bytes.clone()));
        let chunk = metadata.unwrap().row_group(0).column(0).clone();
        let start = chunk.byte_range().0 as usize;
        let declared = declared_uncompressed_size(&mut &bytes[start..]).unwrap();
        assert!(declared < chunk.uncompressed_size() as u64);
        // The size is the 3-byte varint after the page type's; make it 2^20 - 1.
        assert_eq!((bytes[start], bytes[start + 2]), (0x15, 0x15), "a header as writers write it");
        assert!(bytes[start + 3] & 0x80 != 0 && bytes[start + 4] & 0x80 != 0 && bytes[start + 5] & 0x80 == 0);
        let mut corrupt = bytes;
        corrupt[start + 3..start + 6].copy_from_slice(&[0xfe, 0xff, 0x7f]);
        let (_dir, file) = file_of(&corrupt);
        let err = texts_of(file).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "the page header at byte {start} declares 1048575 uncompressed bytes, more than the {}",
                chunk.uncompressed_size()
            )),
            "{err}"
        );
    }

    #[test]
    fn declared_page_sizes_are_read_only_from_headers_in_writers_field_order() {
        let declared = |header: &[u8]| declared_uncompressed_size(&mut &header[..]);
        assert_eq!(declared(&[0x15, 0x00, 0x15, 0xfe, 0xff, 0x7f, 0x15]), Some(1_048_575));
        assert_eq!(declared(&[0x15, 0x04, 0x15, 0x02]), Some(1));
        assert_eq!(declared(&[0x15, 0x00, 0x15, 0x01]), None, "negative");
        assert_eq!(declared(&[0x25, 0x00, 0x15, 0x02]), None, "field 2 first");
        assert_eq!(declared(&[0x15, 0x00, 0x15, 0xff]), None, "cut varint");
        // The fuzzer's header: a six-byte varint, which the `parquet` crate
        // reads whole and cuts to an `i32`.
        assert_eq!(declared(&[0x15, 0x04, 0x15, 0x8c, 0xe6, 0xc2, 0xc6, 0xc8, 0x12, 0x15]), Some(1_147_689_350));
    }

    #[test]
    fn ranges_inside_the_file_are_read_and_ranges_past_its_end_are_refused() {
        let (_dir, file) = file_of(b"0123456789");
        assert_eq!(file.len(), 10);
        assert_eq!(&file.get_bytes(2, 5).unwrap()[..], b"23456");
        assert_eq!(&file.get_bytes(0, 10).unwrap()[..], b"0123456789");
        let err = file.get_bytes(8, usize::MAX / 2).unwrap_err().to_string();
        assert!(err.contains("the file is 10 bytes long"), "{err}");
        assert!(file.get_bytes(u64::MAX, 2).is_err());
        assert!(file.get_read(11).is_err());
    }

    #[test]
    fn a_reader_gives_the_tail_of_the_file_then_an_error_not_an_empty_read() {
        let (_dir, file) = file_of(b"0123456789");
        let mut reader = file.get_read(6).unwrap();
        let mut tail = [0u8; 4];
        reader.read_exact(&mut tail).unwrap();
        assert_eq!(&tail, b"6789");
        let err = reader.read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut two = file.get_read(0).unwrap();
        let mut one = file.get_read(5).unwrap();
        let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
        one.read_exact(&mut b).unwrap();
        two.read_exact(&mut a).unwrap();
        assert_eq!((&a, &b), (b"01", b"56"), "readers of one file keep their own positions");
    }
}
