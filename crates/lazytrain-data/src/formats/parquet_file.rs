//! A Parquet file read in place, a page at a time: what the `parquet`
//! reader asks for, and no more, so memory holds one page (and the batch
//! decoded from it), not the file.
//!
//! The `parquet` crate's own reader of a `File` has two faults on corrupt
//! files that this one mends: a range is allocated whole before it is
//! checked against the file's size, and a reader at the end of the file
//! answers "no bytes" instead of an error, which the page-header decoder
//! takes for a skipped field and asks again — a header declaring billions
//! of 8-byte fields took 36 s of empty reads to fail (found by
//! `tests/fuzz.rs`). Here a range past the end is an error before anything
//! is allocated, and so is a read at the end.

use bytes::Bytes;
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::{ChunkReader, Length};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Bytes a page-header reader fetches at a time: headers are a few dozen
/// bytes, pages themselves are read by exact ranges.
const HEADER_READ_BYTES: usize = 8 * 1024;

/// An open Parquet file and its size.
pub(crate) struct ParquetFile {
    file: Arc<File>,
    size: u64,
}

impl ParquetFile {
    /// Open the file at `path`.
    pub(crate) fn open(path: &std::path::Path) -> std::io::Result<ParquetFile> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Ok(ParquetFile { file: Arc::new(file), size })
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
