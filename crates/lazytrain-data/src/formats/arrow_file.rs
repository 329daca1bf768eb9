//! Arrow IPC data read a message at a time: a stream (as `datasets` writes
//! its cache's `.arrow` files) or the file format (`ARROW1` at the front:
//! Feather v2, `pyarrow.ipc.new_file`), plain or with LZ4- or
//! zstd-compressed buffers (Feather's default is LZ4).
//!
//! `arrow-ipc` decodes each message, but the framing is read here, so that
//! every length the file declares is checked before anything that size is
//! allocated: a message's metadata and body, and a file's blocks, against
//! what the file holds; a batch's compressed buffers against
//! [`MAX_BATCH_BYTES`]. The crate reserves a compressed buffer's declared
//! size before it decompresses it: a corrupt file that `tests/fuzz.rs`
//! found declared 1.4 × 10^18 bytes and aborted the process. The crate is
//! handed exactly the bytes checked here, and checks that each buffer
//! decompresses to the size it declares.

use super::io_error;
use crate::Result;
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader};
use arrow_schema::{ArrowError, SchemaRef};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

/// The most bytes that the compressed buffers of one record batch (or
/// dictionary batch) may declare, all together. A record batch is held in
/// memory whole; Feather's batches are 65 536 rows by default, a
/// `datasets` cache's 1 000.
pub(super) const MAX_BATCH_BYTES: u64 = 1 << 30;

/// The marker before a message's metadata length (absent in streams
/// written before Arrow 0.15).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// The record batches of one Arrow IPC stream or file, in order.
pub(super) struct ArrowBatches {
    file: BufReader<File>,
    /// The file's size in bytes.
    size: u64,
    decoder: FileDecoder,
    framing: Framing,
}

/// Where the next record batch comes from.
enum Framing {
    /// The next message of a stream.
    Stream,
    /// Block `next` of those a file's footer lists.
    File { blocks: Vec<Block>, next: usize },
    /// Nothing: the data ended, or the last read failed.
    Ended,
}

/// A message as the decoder reads it: its metadata length prefix, its
/// metadata and its body in one buffer, and the block that says where the
/// body starts.
struct RawMessage {
    block: Block,
    bytes: Buffer,
}

impl ArrowBatches {
    /// Open the Arrow IPC stream or file at `path`: its schema (and, for a
    /// file, its dictionaries) are read now.
    pub(super) fn open(path: &Path) -> Result<(ArrowBatches, SchemaRef)> {
        let open_error = |e: std::io::Error| io_error(path, format!("cannot read the input file: {e}"));
        let file = File::open(path).map_err(open_error)?;
        let size = file.metadata().map_err(open_error)?.len();
        let mut file = BufReader::new(file);
        let mut magic = [0u8; 6];
        let file_format = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
        file.rewind().map_err(open_error)?;
        if file_format {
            check_footer_length(path, &mut file, size)?;
            let unreadable = |e: ArrowError| io_error(path, format!("not a readable Arrow IPC file: {e}"));
            Self::open_file(file, size).map_err(unreadable)
        } else {
            let not_a_stream = |e: ArrowError| {
                io_error(
                    path,
                    format!(
                        "not an Arrow IPC stream (as `datasets` writes its .arrow files) or Arrow IPC file \
                         (Feather): {e}"
                    ),
                )
            };
            Self::open_stream(file, size).map_err(not_a_stream)
        }
    }

    /// A stream: its first message is the schema.
    fn open_stream(mut file: BufReader<File>, size: u64) -> std::result::Result<(ArrowBatches, SchemaRef), ArrowError> {
        let Some(first) = next_stream_message(&mut file, size)? else {
            return Err(ArrowError::IpcError("the stream is empty: it has no schema".into()));
        };
        let message = message_of(&first.bytes)?;
        let schema = message.header_as_schema().ok_or_else(|| {
            ArrowError::IpcError(format!("its first message is a {:?}, not the schema", message.header_type()))
        })?;
        let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(schema)?);
        let decoder = FileDecoder::new(schema.clone(), message.version());
        Ok((ArrowBatches { file, size, decoder, framing: Framing::Stream }, schema))
    }

    /// A file: its footer lists the schema, the dictionaries (read now)
    /// and the record batches.
    fn open_file(mut file: BufReader<File>, size: u64) -> std::result::Result<(ArrowBatches, SchemaRef), ArrowError> {
        let mut trailer = [0u8; 10];
        file.seek(SeekFrom::End(-10))?;
        file.read_exact(&mut trailer)?;
        // `check_footer_length` has checked this length against the file.
        let footer_len = arrow_ipc::reader::read_footer_length(trailer)?;
        let mut footer_bytes = vec![0u8; footer_len];
        file.seek(SeekFrom::End(-10 - footer_len as i64))?;
        file.read_exact(&mut footer_bytes)?;
        let footer = arrow_ipc::root_as_footer(&footer_bytes)
            .map_err(|e| ArrowError::ParseError(format!("its footer cannot be read: {e}")))?;
        let ipc_schema = footer.schema().ok_or_else(|| ArrowError::ParseError("its footer has no schema".into()))?;
        if !ipc_schema.endianness().equals_to_target_endianness() {
            return Err(ArrowError::IpcError("it was written on a machine of the other byte order".into()));
        }
        let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(ipc_schema)?);
        let blocks: Vec<Block> = footer.recordBatches().map(|b| b.iter().copied().collect()).unwrap_or_default();
        let dictionaries: Vec<Block> = footer.dictionaries().map(|b| b.iter().copied().collect()).unwrap_or_default();
        let decoder = FileDecoder::new(schema.clone(), footer.version());
        let mut batches = ArrowBatches { file, size, decoder, framing: Framing::File { blocks, next: 0 } };
        for block in dictionaries {
            let message = batches.read_block(block)?;
            batches.decode(&message, Expected::Dictionary)?;
        }
        Ok((batches, schema))
    }

    /// The next record batch, `None` at the end.
    fn next_batch(&mut self) -> std::result::Result<Option<RecordBatch>, ArrowError> {
        loop {
            let message = match &mut self.framing {
                Framing::Ended => return Ok(None),
                Framing::Stream => match next_stream_message(&mut self.file, self.size)? {
                    Some(message) => message,
                    None => return Ok(None),
                },
                Framing::File { blocks, next } => match blocks.get(*next) {
                    Some(&block) => {
                        *next += 1;
                        self.read_block(block)?
                    }
                    None => return Ok(None),
                },
            };
            let expected = match self.framing {
                Framing::Stream => Expected::Any,
                Framing::File { .. } | Framing::Ended => Expected::RecordBatch,
            };
            if let Some(batch) = self.decode(&message, expected)? {
                return Ok(Some(batch));
            }
        }
    }

    /// The message of a file's `block`, checked against the file's size.
    fn read_block(&mut self, block: Block) -> std::result::Result<RawMessage, ArrowError> {
        let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
        let total = u64::try_from(meta)
            .ok()
            .zip(u64::try_from(body).ok())
            .and_then(|(meta, body)| meta.checked_add(body))
            .filter(|&total| u64::try_from(offset).is_ok_and(|offset| total <= self.size.saturating_sub(offset)));
        let Some(total) = total else {
            return Err(ArrowError::ParseError(format!(
                "a block at byte {offset} declares {meta} + {body} bytes, more than the {}-byte file holds \
                 (cut short?)",
                self.size
            )));
        };
        let mut bytes = vec![0u8; total as usize];
        self.file.seek(SeekFrom::Start(offset as u64))?;
        self.file.read_exact(&mut bytes)?;
        Ok(RawMessage { block, bytes: Buffer::from_vec(bytes) })
    }

    /// Decode one message that may be what `expected` says: a record batch
    /// is returned, a dictionary batch joins the decoder's dictionaries.
    fn decode(&mut self, raw: &RawMessage, expected: Expected) -> std::result::Result<Option<RecordBatch>, ArrowError> {
        let message = message_of(&raw.bytes)?;
        let meta = usize::try_from(raw.block.metaDataLength()).unwrap_or(usize::MAX);
        let body = raw.bytes.get(meta..).ok_or_else(|| {
            ArrowError::ParseError(format!(
                "a message's metadata length {meta} runs past its {} bytes",
                raw.bytes.len()
            ))
        })?;
        let header = message.header_type();
        let (record_batch, dictionary) = (message.header_as_record_batch(), message.header_as_dictionary_batch());
        match (header, expected) {
            (MessageHeader::RecordBatch, Expected::Any | Expected::RecordBatch) => {
                check_compressed_sizes(record_batch, body)?;
                self.decoder.read_record_batch(&raw.block, &raw.bytes)
            }
            (MessageHeader::DictionaryBatch, Expected::Any | Expected::Dictionary) => {
                check_compressed_sizes(dictionary.and_then(|d| d.data()), body)?;
                self.decoder.read_dictionary(&raw.block, &raw.bytes).map(|()| None)
            }
            (other, _) => Err(ArrowError::IpcError(format!("an unexpected {other:?} message"))),
        }
    }
}

impl Iterator for ArrowBatches {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.next_batch();
        if !matches!(next, Ok(Some(_))) {
            self.framing = Framing::Ended;
        }
        next.transpose()
    }
}

/// What a message read from a file's block must be.
#[derive(Clone, Copy)]
enum Expected {
    /// A record batch (a stream's dictionary batches come between them).
    Any,
    RecordBatch,
    Dictionary,
}

/// The next message of a stream, read as `arrow-ipc`'s stream reader reads
/// it (a continuation marker or not, then the metadata's length; the
/// stream ends at the file's end or at a length of 0), with its lengths
/// checked against what the file holds; `None` at the stream's end.
fn next_stream_message(file: &mut BufReader<File>, size: u64) -> std::result::Result<Option<RawMessage>, ArrowError> {
    let mut word = [0u8; 4];
    match file.read_exact(&mut word) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    if word == CONTINUATION {
        file.read_exact(&mut word)?;
    }
    let meta_len = i32::from_le_bytes(word);
    if meta_len == 0 {
        return Ok(None);
    }
    let position = file.stream_position()?;
    let left = size.saturating_sub(position);
    let meta = u64::try_from(meta_len)
        .ok()
        .filter(|&meta| meta <= left)
        .ok_or_else(|| ArrowError::ParseError(too_long("a message's metadata", i64::from(meta_len), position, left)))?;
    // The decoder reads the metadata after a continuation marker and its length.
    let mut bytes = Vec::with_capacity(8 + meta as usize);
    bytes.extend_from_slice(&CONTINUATION);
    bytes.extend_from_slice(&meta_len.to_le_bytes());
    file.by_ref().take(meta).read_to_end(&mut bytes)?;
    let body = {
        let message = arrow_ipc::root_as_message(&bytes[8..])
            .map_err(|e| ArrowError::ParseError(format!("a message cannot be read: {e}")))?;
        let body = message.bodyLength();
        u64::try_from(body)
            .ok()
            .filter(|&body| body <= left - meta)
            .ok_or_else(|| ArrowError::ParseError(too_long("a message's body", body, position + meta, left - meta)))?
    };
    bytes.reserve_exact(body as usize);
    file.by_ref().take(body).read_to_end(&mut bytes)?;
    let meta_with_prefix = i32::try_from(8 + meta)
        .map_err(|_| ArrowError::ParseError(format!("a message's metadata of {meta} bytes is too long")))?;
    Ok(Some(RawMessage { block: Block::new(0, meta_with_prefix, body as i64), bytes: Buffer::from_vec(bytes) }))
}

/// The error of a length that runs past the file.
fn too_long(what: &str, declared: i64, at: u64, left: u64) -> String {
    format!("{what} at byte {at} declares {declared} bytes, but {left} are left in the file (cut short?)")
}

/// The message at the front of `bytes`, found as the decoder finds it
/// (after a continuation marker and a length, or a length alone).
fn message_of(bytes: &[u8]) -> std::result::Result<arrow_ipc::Message<'_>, ArrowError> {
    let prefix = if bytes.get(..4) == Some(&CONTINUATION[..]) { 8 } else { 4 };
    let metadata = bytes
        .get(prefix..)
        .ok_or_else(|| ArrowError::ParseError(format!("a message of {} bytes has no metadata", bytes.len())))?;
    arrow_ipc::root_as_message(metadata).map_err(|e| ArrowError::ParseError(format!("a message cannot be read: {e}")))
}

/// Refuse a batch whose compressed buffers declare more than
/// [`MAX_BATCH_BYTES`] in all. Each buffer in `body` starts with its
/// decompressed length (-1: stored plain). A buffer outside the body, or
/// too short to hold its length, is left to the decoder, which refuses it.
fn check_compressed_sizes(batch: Option<arrow_ipc::RecordBatch>, body: &[u8]) -> std::result::Result<(), ArrowError> {
    let Some(batch) = batch else { return Ok(()) };
    if batch.compression().is_none() {
        return Ok(());
    }
    let mut declared = 0u64;
    for buffer in batch.buffers().into_iter().flatten() {
        let range = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        let Some(length) = range.and_then(|range| body.get(range)).and_then(|bytes| bytes.first_chunk::<8>()) else {
            continue;
        };
        // -1 (stored plain), 0 (empty) and other negative lengths allocate nothing.
        declared = declared.saturating_add(u64::try_from(i64::from_le_bytes(*length)).unwrap_or(0));
    }
    if declared > MAX_BATCH_BYTES {
        return Err(ArrowError::IpcError(format!(
            "a batch's compressed buffers declare {declared} bytes decompressed, more than lazytrain reads in one \
             batch ({MAX_BATCH_BYTES}); if the file is sound, write it in smaller batches \
             (pyarrow.feather.write_feather(table, path, chunksize=10000))"
        )));
    }
    Ok(())
}

/// Refuse an Arrow IPC file whose trailer (a footer length, then `ARROW1`)
/// is missing or declares a footer longer than the file.
fn check_footer_length(path: &Path, file: &mut BufReader<File>, size: u64) -> Result<()> {
    /// The leading magic with its padding.
    const LEADING: u64 = 8;
    /// The footer's length and the closing magic.
    const TRAILER: u64 = 10;
    let unreadable = |detail: String| io_error(path, format!("not a readable Arrow IPC file: {detail}"));
    if size < LEADING + TRAILER {
        return Err(unreadable(format!("{size} bytes is too short to hold its footer (cut short?)")));
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.seek(SeekFrom::End(-(TRAILER as i64)))
        .and_then(|_| file.read_exact(&mut trailer))
        .map_err(|e| unreadable(e.to_string()))?;
    if &trailer[4..] != b"ARROW1" {
        return Err(unreadable("it does not end with ARROW1 (cut short?)".into()));
    }
    let footer = i32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if u64::try_from(footer).map_or(true, |footer| footer > size - LEADING - TRAILER) {
        return Err(unreadable(format!("its footer declares {footer} bytes, more than the {size}-byte file holds")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int8Type;
    use arrow_array::{ArrayRef, DictionaryArray, StringArray};
    use arrow_ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
    use arrow_ipc::CompressionType;

    /// Two batches: strings, and a dictionary column (one dictionary, as
    /// the file format requires).
    fn batches() -> Vec<RecordBatch> {
        let values: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        let batch = |texts: &[&str], keys: [i8; 3]| {
            let texts: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
            let keys = DictionaryArray::<Int8Type>::try_new(keys.into_iter().collect(), values.clone()).unwrap();
            RecordBatch::try_from_iter([("text", texts), ("label", Arc::new(keys) as ArrayRef)]).unwrap()
        };
        vec![batch(&["one", "two", "three"], [0, 1, 0]), batch(&["four", "five", "six"], [2, 2, 1])]
    }

    fn read(path: &Path) -> Result<Vec<RecordBatch>> {
        let (batches, _) = ArrowBatches::open(path)?;
        batches.map(|b| b.map_err(|e| io_error(path, e.to_string()))).collect()
    }

    fn options(compression: Option<CompressionType>, legacy: bool) -> IpcWriteOptions {
        let version = if legacy { arrow_ipc::MetadataVersion::V4 } else { arrow_ipc::MetadataVersion::V5 };
        IpcWriteOptions::try_new(8, legacy, version).unwrap().try_with_compression(compression).unwrap()
    }

    /// Streams and files, plain or compressed with either codec, and a
    /// stream in the format before Arrow 0.15 (no continuation markers),
    /// read back as written.
    #[test]
    fn streams_and_files_read_back_as_written() {
        let dir = lazytrain_core::ScratchDir::new("arrow-file-round-trip").unwrap();
        let written = batches();
        let schema = written[0].schema();
        for (compression, legacy) in [
            (None, false),
            (Some(CompressionType::LZ4_FRAME), false),
            (Some(CompressionType::ZSTD), false),
            (None, true),
        ] {
            let stream = dir.join(format!("{compression:?}-{legacy}.arrow"));
            let mut writer = StreamWriter::try_new_with_options(
                File::create(&stream).unwrap(),
                &schema,
                options(compression, legacy),
            )
            .unwrap();
            written.iter().for_each(|b| writer.write(b).unwrap());
            writer.finish().unwrap();
            assert_eq!(std::fs::read(&stream).unwrap()[..4] == CONTINUATION, !legacy, "the framing asked for");
            assert_eq!(read(&stream).unwrap(), written, "stream {compression:?}, legacy {legacy}");
            if legacy {
                continue;
            }
            let file = dir.join(format!("{compression:?}.feather"));
            let mut writer =
                FileWriter::try_new_with_options(File::create(&file).unwrap(), &schema, options(compression, false))
                    .unwrap();
            written.iter().for_each(|b| writer.write(b).unwrap());
            writer.finish().unwrap();
            assert_eq!(read(&file).unwrap(), written, "file {compression:?}");
        }
    }

    /// A file whose footer lists blocks past its end is an error naming
    /// the block, before anything that size is allocated.
    #[test]
    fn blocks_past_the_end_of_a_file_are_errors() {
        let dir = lazytrain_core::ScratchDir::new("arrow-file-blocks").unwrap();
        let written = batches();
        let mut bytes = Vec::new();
        let mut writer = FileWriter::try_new(&mut bytes, &written[0].schema()).unwrap();
        written.iter().for_each(|b| writer.write(b).unwrap());
        writer.finish().unwrap();
        drop(writer);
        // The leading magic, then the footer and trailer alone.
        let footer_len = i32::from_le_bytes(bytes[bytes.len() - 10..bytes.len() - 6].try_into().unwrap()) as usize;
        let mut cut = bytes[..8].to_vec();
        cut.extend_from_slice(&bytes[bytes.len() - 10 - footer_len..]);
        let path = dir.join("cut.feather");
        std::fs::write(&path, &cut).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(
            err.contains("declares") && err.contains(&format!("more than the {}-byte file holds", cut.len())),
            "{err}"
        );
    }
}
