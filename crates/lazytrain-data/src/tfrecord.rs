//! TFRecord files, byte for byte as TensorFlow writes them: each record is
//! `u64 length (LE) | masked CRC32C of the length | data | masked CRC32C of the data`.

use crate::{DataError, Result};
use lazytrain_storage::RangedObject;
use std::fs::File;
use std::io::{BufWriter, Write};
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
    /// `(offset, size)` of every record, for the index sidecar (kept only
    /// by writers made with [`RecordWriter::create_indexed`]).
    spans: Option<Vec<(u64, u64)>>,
    written: u64,
}

impl RecordWriter {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> Result<RecordWriter> {
        let file = File::create(path).map_err(|e| io_error(path, format!("cannot create: {e}")))?;
        Ok(RecordWriter { out: BufWriter::new(file), path: path.to_path_buf(), records: 0, spans: None, written: 0 })
    }

    /// Create (truncate) `path`, keeping each record's place for
    /// [`finish_with_index`](Self::finish_with_index).
    pub fn create_indexed(path: &Path) -> Result<RecordWriter> {
        let mut writer = RecordWriter::create(path)?;
        writer.spans = Some(Vec::new());
        Ok(writer)
    }

    /// Append one record.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let io = |e: std::io::Error| io_error(&self.path, format!("cannot write: {e}"));
        self.out.write_all(&len).map_err(io)?;
        self.out.write_all(&masked_crc32c(&len).to_le_bytes()).map_err(io)?;
        self.out.write_all(data).map_err(io)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes()).map_err(io)?;
        let size = FRAMING + data.len() as u64;
        if let Some(spans) = &mut self.spans {
            spans.push((self.written, size));
        }
        self.written += size;
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

    /// [`finish`](Self::finish), then write the index sidecar
    /// [`index_path`]`(path)`: one `offset size` line per record (NVIDIA
    /// DALI's `tfrecord2idx` format), so a reader of a bucket object can
    /// seek to any record without first reading every header.
    pub fn finish_with_index(self) -> Result<u64> {
        let index = index_path(&self.path);
        let text: String = self.spans.iter().flatten().map(|(offset, size)| format!("{offset} {size}\n")).collect();
        let records = self.finish()?;
        lazytrain_core::atomic_file::write_atomically(&index, text.as_bytes())
            .map_err(|e| io_error(&index, format!("cannot write the index: {e}")))?;
        Ok(records)
    }
}

/// Header (length + its CRC) plus the data CRC: the bytes of a record
/// besides its data.
pub const FRAMING: u64 = 16;

/// The longest record a shard may hold: a prepared block of the longest
/// block size is a few MB; a longer length field is corrupt, and reading
/// it would allocate its whole claim.
pub const MAX_RECORD_BYTES: u64 = 1 << 30;

/// The index sidecar of a shard: `train-00000-of-00002.tfrecord.idx`.
pub fn index_path(shard: &Path) -> PathBuf {
    let mut name = shard.as_os_str().to_owned();
    name.push(".idx");
    PathBuf::from(name)
}

fn io_error(path: &Path, detail: String) -> DataError {
    DataError::Io { path: path.display().to_string(), detail }
}

/// Bytes read at any offset: a local file or a bucket object.
pub trait ShardSource: Send + Sync {
    /// The file or URL, for messages.
    fn name(&self) -> String;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Fill `buf` from byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Start fetching `offset..offset + len` ahead of a read (no-op locally).
    fn prefetch(&self, offset: u64, len: u64);
}

/// A local shard file, read with positional reads (no shared cursor).
pub struct LocalShard {
    file: File,
    path: PathBuf,
    size: u64,
}

impl LocalShard {
    /// Open `path`.
    pub fn open(path: &Path) -> Result<LocalShard> {
        let file = File::open(path).map_err(|e| io_error(path, format!("cannot open: {e}")))?;
        let size = file.metadata().map_err(|e| io_error(path, e.to_string()))?.len();
        Ok(LocalShard { file, path: path.to_path_buf(), size })
    }
}

impl ShardSource for LocalShard {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| io_error(&self.path, format!("cannot read at byte {offset}: {e}")))
    }

    fn prefetch(&self, _offset: u64, _len: u64) {}
}

/// A shard in a bucket, read through [`RangedObject`]'s block cache.
pub struct RemoteShard(pub RangedObject);

impl ShardSource for RemoteShard {
    fn name(&self) -> String {
        self.0.url().to_string()
    }

    fn size(&self) -> u64 {
        self.0.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.0.read_at(offset, buf)?)
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.0.prefetch_range(offset, len);
    }
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
    /// The file or object URL.
    pub name: String,
    /// Every readable record.
    pub spans: Vec<RecordSpan>,
    /// Records skipped as corrupt (with [`CorruptPolicy::Skip`]).
    pub skipped: u64,
    /// Bytes at the end of the file after a corrupt record header (with
    /// `Skip`): whatever records they hold cannot be framed, so are lost.
    pub unframed_bytes: u64,
}

fn corrupt(name: &str, record: usize, offset: u64, what: &str) -> DataError {
    DataError::Corrupt { path: name.to_string(), record, offset, detail: what.to_string() }
}

impl RecordIndex {
    /// Scan the file `path` (see [`RecordIndex::scan_source`]).
    pub fn scan(path: &Path, policy: CorruptPolicy) -> Result<RecordIndex> {
        RecordIndex::scan_source(&LocalShard::open(path)?, policy)
    }

    /// Scan `source`, checking every header and data CRC. A truncated last
    /// record is always an error (a shard cut short by a crash must not
    /// silently lose data). A record whose data CRC fails is an error or,
    /// with [`CorruptPolicy::Skip`], skipped and counted; a header whose CRC
    /// fails is an error or, with `Skip`, ends the scan of this file (nothing
    /// after it can be framed) and is counted.
    pub fn scan_source(source: &dyn ShardSource, policy: CorruptPolicy) -> Result<RecordIndex> {
        let name = source.name();
        let size = source.size();
        let mut spans = Vec::new();
        let mut skipped = 0;
        let mut unframed_bytes = 0;
        let mut offset = 0u64;
        let mut header = [0u8; 12];
        let mut data = Vec::new();
        while offset < size {
            let record = spans.len() + skipped as usize;
            if size - offset < 12 {
                return Err(corrupt(&name, record, offset, "truncated record header (the file ends mid-record)"));
            }
            source.read_at(offset, &mut header)?;
            let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
            let stored = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
            if masked_crc32c(&len_bytes) != stored {
                match policy {
                    CorruptPolicy::Fail => return Err(corrupt(&name, record, offset, "length checksum mismatch")),
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
                return Err(corrupt(&name, record, offset, "truncated record data (the file ends mid-record)"));
            }
            if len > MAX_RECORD_BYTES {
                return Err(corrupt(
                    &name,
                    record,
                    offset,
                    &format!("a record of {len} bytes (at most {MAX_RECORD_BYTES})"),
                ));
            }
            data.resize(len as usize + 4, 0);
            source.read_at(offset + 12, &mut data)?;
            let stored = u32::from_le_bytes(data[len as usize..].try_into().expect("4 bytes"));
            if masked_crc32c(&data[..len as usize]) == stored {
                spans.push(RecordSpan { offset, len });
            } else if policy == CorruptPolicy::Fail {
                return Err(corrupt(&name, record, offset, "data checksum mismatch"));
            } else {
                skipped += 1;
            }
            offset += FRAMING + len;
        }
        Ok(RecordIndex { name, spans, skipped, unframed_bytes })
    }

    /// Build the index of `source` from its sidecar's text (see
    /// [`RecordWriter::finish_with_index`]) without reading the records;
    /// their CRCs are checked as each is read. `index_name` names the
    /// sidecar in errors.
    pub fn from_sidecar(source: &dyn ShardSource, index_name: &str, text: &str) -> Result<RecordIndex> {
        let bad = |line: usize, what: String| DataError::Io {
            path: index_name.to_string(),
            detail: format!("line {}: {what}; delete the index to have the shard scanned instead", line + 1),
        };
        let mut spans = Vec::new();
        let mut expected = 0u64;
        for (line, text) in text.lines().enumerate() {
            let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
            let (Some(Ok(offset)), Some(Ok(size)), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(bad(line, format!("expected `offset size`, found `{text}`")));
            };
            if offset != expected || size < FRAMING {
                return Err(bad(
                    line,
                    format!("record at byte {offset} of {size} bytes does not follow the previous one"),
                ));
            }
            if size - FRAMING > MAX_RECORD_BYTES {
                return Err(bad(line, format!("a record of {size} bytes (at most {MAX_RECORD_BYTES} of data)")));
            }
            spans.push(RecordSpan { offset, len: size - FRAMING });
            expected = offset
                .checked_add(size)
                .ok_or_else(|| bad(line, format!("a record of {size} bytes at byte {offset} ends past 2^64")))?;
        }
        if expected != source.size() {
            return Err(DataError::Io {
                path: index_name.to_string(),
                detail: format!(
                    "the index covers {expected} bytes but {} has {}; the shard was rewritten after its index \
                     (prepare the data again)",
                    source.name(),
                    source.size()
                ),
            });
        }
        Ok(RecordIndex { name: source.name(), spans, skipped: 0, unframed_bytes: 0 })
    }

    /// Read record `k` from `source` in one read (header, data and CRC),
    /// checking the header against the index and both CRCs.
    pub fn read_from(&self, source: &dyn ShardSource, k: usize) -> Result<Vec<u8>> {
        let span = self.spans[k];
        let mut buf = vec![0u8; (span.len + FRAMING) as usize];
        source.read_at(span.offset, &mut buf)?;
        let len_bytes: [u8; 8] = buf[..8].try_into().expect("8 bytes");
        let stored = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
        if masked_crc32c(&len_bytes) != stored || u64::from_le_bytes(len_bytes) != span.len {
            return Err(corrupt(&self.name, k, span.offset, "record header does not match the index"));
        }
        let data_end = 12 + span.len as usize;
        let stored = u32::from_le_bytes(buf[data_end..].try_into().expect("4 bytes"));
        if masked_crc32c(&buf[12..data_end]) != stored {
            return Err(corrupt(&self.name, k, span.offset, "data checksum mismatch"));
        }
        buf.truncate(data_end);
        buf.drain(..12);
        Ok(buf)
    }

    /// Start fetching record `k` (remote sources).
    pub fn prefetch(&self, source: &dyn ShardSource, k: usize) {
        let span = self.spans[k];
        source.prefetch(span.offset, span.len + FRAMING);
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
