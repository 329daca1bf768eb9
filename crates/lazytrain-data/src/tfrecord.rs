//! TFRecord files, byte for byte as TensorFlow writes them: each record is
//! `u64 length (LE) | masked CRC32C of the length | data | masked CRC32C of the data`.

use crate::{DataError, Result};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MASK_DELTA: u32 = 0xa282_ead8;

/// TensorFlow's masked CRC32C: rotate right by 15 and add a constant, so a
/// CRC of data that itself holds CRCs is not degenerate.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

/// Mask a CRC32C value.
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Undo [`mask`].
pub fn unmask(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

/// Appends records to a TFRecord file.
pub struct RecordWriter {
    out: BufWriter<File>,
    path: PathBuf,
    records: u64,
}

impl RecordWriter {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> Result<RecordWriter> {
        let file = File::create(path).map_err(|e| io_error(path, format!("cannot create: {e}")))?;
        Ok(RecordWriter { out: BufWriter::new(file), path: path.to_path_buf(), records: 0 })
    }

    /// Append one record.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let io = |e: std::io::Error| io_error(&self.path, format!("cannot write: {e}"));
        self.out.write_all(&len).map_err(io)?;
        self.out.write_all(&masked_crc32c(&len).to_le_bytes()).map_err(io)?;
        self.out.write_all(data).map_err(io)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes()).map_err(io)?;
        self.records += 1;
        Ok(())
    }

    /// Push buffered records to the file (readers such as TensorBoard see them).
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| io_error(&self.path, format!("cannot flush: {e}")))
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flush and fsync.
    pub fn finish(self) -> Result<u64> {
        let path = self.path.clone();
        let file = self.out.into_inner().map_err(|e| io_error(&path, format!("cannot flush: {e}")))?;
        file.sync_all().map_err(|e| io_error(&path, format!("cannot sync: {e}")))?;
        Ok(self.records)
    }
}

fn io_error(path: &Path, detail: String) -> DataError {
    DataError::Io { path: path.display().to_string(), detail }
}

/// Where a record's data lies in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordSpan {
    /// Byte offset of the record header.
    pub offset: u64,
    /// Data length.
    pub len: u64,
}

/// What to do with a record whose checksum fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorruptPolicy {
    /// Fail with an error naming the file, record and byte offset.
    Fail,
    /// Skip it and count it.
    Skip,
}

/// An index of the records of one file: scanning reads every header (and
/// checks its CRC) so later reads can seek straight to record `k`.
#[derive(Clone, Debug)]
pub struct RecordIndex {
    /// The file.
    pub path: PathBuf,
    /// Every readable record.
    pub spans: Vec<RecordSpan>,
    /// Records skipped as corrupt (with [`CorruptPolicy::Skip`]).
    pub skipped: u64,
    /// Bytes at the end of the file after a corrupt record header (with
    /// `Skip`): whatever records they hold cannot be framed, so are lost.
    pub unframed_bytes: u64,
}

fn corrupt(path: &Path, record: usize, offset: u64, what: &str) -> DataError {
    DataError::Corrupt { path: path.display().to_string(), record, offset, detail: what.to_string() }
}

impl RecordIndex {
    /// Scan `path`, checking every header and data CRC. A truncated last
    /// record is always an error (a shard cut short by a crash must not
    /// silently lose data). A record whose data CRC fails is an error or,
    /// with [`CorruptPolicy::Skip`], skipped and counted; a header whose CRC
    /// fails is an error or, with `Skip`, ends the scan of this file (nothing
    /// after it can be framed) and is counted.
    pub fn scan(path: &Path, policy: CorruptPolicy) -> Result<RecordIndex> {
        let mut file = File::open(path).map_err(|e| io_error(path, format!("cannot open: {e}")))?;
        let size = file.metadata().map_err(|e| io_error(path, e.to_string()))?.len();
        let mut spans = Vec::new();
        let mut skipped = 0;
        let mut unframed_bytes = 0;
        let mut offset = 0u64;
        let mut header = [0u8; 12];
        let mut data = Vec::new();
        while offset < size {
            let record = spans.len() + skipped as usize;
            if size - offset < 12 {
                return Err(corrupt(path, record, offset, "truncated record header (the file ends mid-record)"));
            }
            file.seek(SeekFrom::Start(offset)).map_err(|e| io_error(path, e.to_string()))?;
            file.read_exact(&mut header).map_err(|e| io_error(path, e.to_string()))?;
            let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
            let stored = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
            if masked_crc32c(&len_bytes) != stored {
                match policy {
                    CorruptPolicy::Fail => return Err(corrupt(path, record, offset, "length checksum mismatch")),
                    CorruptPolicy::Skip => {
                        skipped += 1;
                        unframed_bytes = size - offset;
                        break;
                    }
                }
            }
            let len = u64::from_le_bytes(len_bytes);
            // `len` comes from the file: compare without overflowing.
            let room = size - offset - 12;
            if room < 4 || len > room - 4 {
                return Err(corrupt(path, record, offset, "truncated record data (the file ends mid-record)"));
            }
            data.resize(len as usize + 4, 0);
            file.read_exact(&mut data).map_err(|e| io_error(path, e.to_string()))?;
            let stored = u32::from_le_bytes(data[len as usize..].try_into().expect("4 bytes"));
            if masked_crc32c(&data[..len as usize]) == stored {
                spans.push(RecordSpan { offset, len });
            } else if policy == CorruptPolicy::Fail {
                return Err(corrupt(path, record, offset, "data checksum mismatch"));
            } else {
                skipped += 1;
            }
            offset += 12 + len + 4;
        }
        Ok(RecordIndex { path: path.to_path_buf(), spans, skipped, unframed_bytes })
    }

    /// Read record `k`, checking its data CRC.
    pub fn read(&self, file: &mut File, k: usize) -> Result<Vec<u8>> {
        let span = self.spans[k];
        let mut buf = vec![0u8; span.len as usize + 4];
        file.seek(SeekFrom::Start(span.offset + 12)).map_err(|e| io_error(&self.path, e.to_string()))?;
        file.read_exact(&mut buf).map_err(|e| io_error(&self.path, format!("cannot read record {k}: {e}")))?;
        let stored = u32::from_le_bytes(buf[span.len as usize..].try_into().expect("4 bytes"));
        buf.truncate(span.len as usize);
        if masked_crc32c(&buf) != stored {
            return Err(corrupt(&self.path, k, span.offset, "data checksum mismatch"));
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The standard CRC32C results from TensorFlow's crc32c_test.cc (RFC 3720).
    #[test]
    fn crc32c_standard_results() {
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c::crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c::crc32c(&ascending), 0x46dd_794e);
        let descending: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c::crc32c(&descending), 0x113f_db5c);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    // TensorFlow's Mask test: masking changes the value, unmasking restores it.
    #[test]
    fn mask_round_trips() {
        let crc = crc32c::crc32c(b"foo");
        assert_ne!(crc, mask(crc));
        assert_ne!(crc, mask(mask(crc)));
        assert_eq!(crc, unmask(mask(crc)));
        assert_eq!(crc, unmask(unmask(mask(mask(crc)))));
        assert_eq!(mask(0), MASK_DELTA);
    }
}
