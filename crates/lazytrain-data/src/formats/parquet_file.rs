//! A Parquet file read in place, a page at a time: what the `parquet`
//! reader asks for, and no more, so memory holds pages, not the file.
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
//!   has the file's metadata, a page header is read as the crate reads it
//!   (`page_header.rs`) and refused when it declares more uncompressed bytes
//!   than its whole column chunk holds — which no valid file does — and
//!   more than [`UNCHECKED_PAGE_BYTES`]. This is the check the upstream fix
//!   (#10821) adds; it can go when a release carries it. Two read paths the
//!   text readers do not take are not covered: pages fetched whole through
//!   the page index (off by default) go unchecked, and after the crate has
//!   peeked at a header (repeated columns, skipped records) the page data it
//!   next asks for would be read as a header.
//!
//! What the reader holds: a page of each column read (and its dictionary
//! page), and the batch of rows being decoded, which may span pages.

use super::page_header::{declared_uncompressed_size, DeclaredSize};
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

/// A page may declare this many uncompressed bytes whatever its column
/// chunk says: reserving them is harmless, and some writers recorded a
/// chunk's total wrong (DuckDB before 0.6 wrote 0).
const UNCHECKED_PAGE_BYTES: u64 = 64 << 20;

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
    /// Its first byte (its dictionary page's, or its first data page's).
    start: u64,
    /// One past its last byte.
    end: u64,
    /// Its pages' uncompressed bytes in all, as the metadata declares.
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
            .map(|column| {
                // The metadata's raw values (`byte_range` panics on negative ones):
                // a chunk that cannot be placed, or declares a negative total,
                // bounds its pages by `UNCHECKED_PAGE_BYTES` alone.
                let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
                let start = u64::try_from(start).unwrap_or(0);
                let length = u64::try_from(column.compressed_size()).unwrap_or(0);
                let uncompressed = u64::try_from(column.uncompressed_size()).unwrap_or(0);
                ColumnChunkBound { start, end: start.saturating_add(length), uncompressed }
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
    /// bytes than its column chunk holds (and than [`UNCHECKED_PAGE_BYTES`]).
    /// The header is read from a window that grows until it holds the whole
    /// header, within the chunk; the bytes read are returned, for the crate
    /// to read the header from without reading them again.
    fn check_page_header(&self, start: u64) -> Result<Vec<u8>> {
        let Some(chunk) = self.chunk_at(start) else { return Ok(Vec::new()) };
        let room = chunk.end.min(self.size) - start;
        let mut window = room.min(4096);
        loop {
            let mut header = vec![0; usize::try_from(window).unwrap_or(usize::MAX)];
            if self.file.read_exact_at(&mut header, start).is_err() {
                return Ok(Vec::new());
            }
            match declared_uncompressed_size(&header) {
                DeclaredSize::Read(Some(declared)) => {
                    let declared = u64::try_from(declared).unwrap_or(0);
                    if declared <= chunk.uncompressed.max(UNCHECKED_PAGE_BYTES) {
                        return Ok(header);
                    }
                    return Err(ParquetError::General(format!(
                        "the page header at byte {start} declares {declared} uncompressed bytes, more than the {} of \
                         its whole column chunk",
                        chunk.uncompressed
                    )));
                }
                DeclaredSize::NeedMore if window < room => window = room.min(window.saturating_mul(16)),
                // The crate refuses these headers itself.
                DeclaredSize::Read(None) | DeclaredSize::NeedMore | DeclaredSize::Invalid => return Ok(header),
            }
        }
    }

    /// The error for `length` bytes at `start`, which the file does not hold.
    fn past_the_end(&self, start: u64, length: u64) -> ParquetError {
        ParquetError::EOF(match length {
            0 => format!("the file is {} bytes long, but its metadata points at byte {start}", self.size),
            _ => format!(
                "the file is {} bytes long, but its metadata points at {length} bytes from byte {start}",
                self.size
            ),
        })
    }
}

impl Length for ParquetFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for ParquetFile {
    /// The bytes the page check read, then the rest of the file.
    type T = std::io::Chain<std::io::Cursor<Vec<u8>>, BufReader<FileTail>>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        if start > self.size {
            return Err(self.past_the_end(start, 0));
        }
        let checked = self.check_page_header(start)?;
        let position = start + checked.len() as u64;
        let tail = FileTail { file: Arc::clone(&self.file), position, end: self.size };
        Ok(std::io::Cursor::new(checked).chain(BufReader::with_capacity(HEADER_READ_BYTES, tail)))
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
    fn a_valid_file_reads_whole_with_its_chunks_known() {
        let text: String = (0..20_000).map(|i| format!("w{} ", i % 977)).collect();
        let bytes = one_text_parquet(&text);
        let (_dir, file) = file_of(&bytes);
        assert_eq!(texts_of(file.clone()).unwrap(), [text], "a valid file reads whole");
        let metadata = parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&Bytes::from(bytes));
        let column = metadata.unwrap().row_group(0).column(0).clone();
        let (start, length) = column.byte_range();
        let chunk = file.chunk_at(start).unwrap();
        assert_eq!(
            (chunk.start, chunk.end, chunk.uncompressed),
            (start, start + length, column.uncompressed_size() as u64)
        );
        assert!(file.chunk_at(start + length).is_none());
    }

    /// A page header (type 0, `declared` uncompressed bytes, 1 compressed).
    fn header(declared: i32) -> Vec<u8> {
        let mut zigzag = ((declared << 1) ^ (declared >> 31)) as u32;
        let mut bytes = vec![0x15, 0x00, 0x15];
        while zigzag >= 0x80 {
            bytes.push(zigzag as u8 | 0x80);
            zigzag >>= 7;
        }
        bytes.extend([zigzag as u8, 0x15, 0x02, 0x00]);
        bytes
    }

    #[test]
    fn a_page_declaring_more_than_its_column_chunk_is_refused_before_it_is_read() {
        let checked = |declared: i32, total: u64| {
            let mut bytes = header(declared);
            bytes.resize(64, 0);
            let (_dir, file) = file_of(&bytes);
            file.chunks.set(vec![ColumnChunkBound { start: 0, end: 64, uncompressed: total }]).unwrap();
            file.get_read(0).map(drop).map_err(|e| e.to_string())
        };
        let err = checked(1 << 30, 1000).unwrap_err();
        assert!(
            err.contains("the page header at byte 0 declares 1073741824 uncompressed bytes, more than the 1000 of its"),
            "{err}"
        );
        assert!(checked(1 << 30, 0).is_err(), "a chunk total of 0 (DuckDB < 0.6) bounds pages by the floor");
        assert!(checked(10 << 20, 0).is_ok(), "pages under the floor pass whatever the chunk says");
        assert!(checked(1 << 30, 2 << 30).is_ok());
        assert!(checked(-5, 1000).is_ok(), "the crate refuses a negative size itself");
        let (_dir, file) = file_of(&header(1 << 30));
        file.chunks.set(Vec::new()).unwrap();
        assert!(file.get_read(0).is_ok(), "a header outside every chunk is the crate's to read");
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
