//! Arrow IPC data read a message at a time: a stream (as `datasets` writes
//! its cache's `.arrow` files) or the file format (`ARROW1` at the front:
//! Feather v2, `pyarrow.ipc.new_file`), plain or with LZ4- or
//! zstd-compressed buffers (Feather's default is LZ4).
//!
//! `arrow-ipc` decodes each message, but the framing is read here, so that
//! every length the file declares is checked before anything that size is
//! allocated: a message's metadata and body, and a file's blocks (which
//! must lie between its magic and its footer without overlapping), against
//! what the file holds; a batch's compressed buffers, and the dictionaries
//! kept between batches, against [`MAX_BATCH_BYTES`]. The crate reserves a
//! compressed buffer's declared size before it decompresses it: a corrupt
//! file that `tests/fuzz.rs` found declared 1.4 × 10^18 bytes and aborted
//! the process. The crate is handed exactly the bytes checked here, and
//! checks that each buffer decompresses to the size it declares.

use super::io_error;
use crate::Result;
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::{ArrowError, SchemaRef};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

/// The most bytes that the compressed buffers of one record batch may
/// declare, all together, and that the dictionaries kept between batches
/// may hold. A record batch is held in memory whole; Feather's batches are
/// 65 536 rows by default, a `datasets` cache's 1 000.
pub(super) const MAX_BATCH_BYTES: u64 = 1 << 30;

/// The marker before a message's metadata length (absent in streams
/// written before Arrow 0.15).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// A batch, or the dictionaries, larger than [`MAX_BATCH_BYTES`]: a sound
/// file may hold one, so the error says how to write it in smaller batches
/// rather than calling the file corrupt.
#[derive(Debug)]
pub(super) struct BatchTooLarge {
    /// What is too large: "a batch's compressed buffers", "the dictionaries".
    what: &'static str,
    /// Its size in bytes, decompressed.
    bytes: u64,
}

impl std::fmt::Display for BatchTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} declare {} bytes decompressed, more than lazytrain holds at once ({MAX_BATCH_BYTES}); if the file is \
             sound, write it in smaller batches (pyarrow: `max_chunksize=` when writing a table, `chunksize=` for \
             Feather; `datasets`: `writer_batch_size=`)",
            self.what, self.bytes
        )
    }
}

impl std::error::Error for BatchTooLarge {}

impl BatchTooLarge {
    /// The error `arrow_batches` yields for it.
    fn into_arrow(self) -> ArrowError {
        ArrowError::ExternalError(Box::new(self))
    }
}

/// The record batches of one Arrow IPC stream or file, in order.
pub(super) struct ArrowBatches {
    file: BufReader<File>,
    /// The file's size in bytes.
    size: u64,
    decoder: FileDecoder,
    framing: Framing,
    /// The bytes each dictionary (by id) holds decompressed, as declared.
    dictionary_bytes: HashMap<i64, u64>,
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

    /// The batches of `file` (`size` bytes), decoded by `decoder`, the next
    /// one where `framing` says.
    fn new(file: BufReader<File>, size: u64, decoder: FileDecoder, framing: Framing) -> ArrowBatches {
        ArrowBatches { file, size, decoder, framing, dictionary_bytes: HashMap::new() }
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
        // As `arrow-ipc`'s stream reader, each message is read at its own
        // metadata version (V1 turns off the decoder's check that they agree).
        let decoder = FileDecoder::new(schema.clone(), MetadataVersion::V1);
        Ok((ArrowBatches::new(file, size, decoder, Framing::Stream), schema))
    }

    /// A file: its footer lists the schema, the dictionaries (read now)
    /// and the record batches.
    fn open_file(mut file: BufReader<File>, size: u64) -> std::result::Result<(ArrowBatches, SchemaRef), ArrowError> {
        let footer_len = footer_length(&mut file, size)?;
        let mut footer_bytes = vec![0u8; footer_len as usize];
        file.seek(SeekFrom::Start(size - TRAILER - footer_len))?;
        file.read_exact(&mut footer_bytes)?;
        let footer = arrow_ipc::root_as_footer(&footer_bytes)
            .map_err(|e| ArrowError::ParseError(format!("its footer cannot be read: {e}")))?;
        let ipc_schema = footer.schema().ok_or_else(|| ArrowError::ParseError("its footer has no schema".into()))?;
        if !ipc_schema.endianness().equals_to_target_endianness() {
            return Err(ArrowError::IpcError("it was written on a machine of the other byte order".into()));
        }
        let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(ipc_schema)?);
        let blocks: Vec<Block> = footer
            .recordBatches()
            .ok_or_else(|| ArrowError::ParseError("its footer lists no record batches".into()))?
            .iter()
            .copied()
            .collect();
        let dictionaries: Vec<Block> = footer.dictionaries().map(|b| b.iter().copied().collect()).unwrap_or_default();
        check_block_layout(&blocks, &dictionaries, size - TRAILER - footer_len)?;
        let decoder = FileDecoder::new(schema.clone(), footer.version());
        let mut batches = ArrowBatches::new(file, size, decoder, Framing::File { blocks, next: 0 });
        for block in dictionaries {
            let message = batches.read_block(block)?;
            batches.decode(&message, Expected::Dictionary)?;
        }
        Ok((batches, schema))
    }

    /// The next record batch, `None` at the end.
    fn next_batch(&mut self) -> std::result::Result<Option<RecordBatch>, ArrowError> {
        loop {
            let (message, expected) = match &mut self.framing {
                Framing::Ended => return Ok(None),
                Framing::Stream => match next_stream_message(&mut self.file, self.size)? {
                    Some(message) => (message, Expected::Any),
                    None => return Ok(None),
                },
                Framing::File { blocks, next } => match blocks.get(*next) {
                    Some(&block) => {
                        *next += 1;
                        (self.read_block(block)?, Expected::RecordBatch)
                    }
                    None => return Ok(None),
                },
            };
            match self.decode(&message, expected)? {
                Decoded::Batch(batch) => return Ok(Some(batch)),
                Decoded::Dictionary => {}
                Decoded::End => return Ok(None),
            }
        }
    }

    /// The message of a file's `block` (already checked to lie inside the
    /// file by [`check_block_layout`]).
    fn read_block(&mut self, block: Block) -> std::result::Result<RawMessage, ArrowError> {
        let (offset, meta, body) = (block.offset() as u64, block.metaDataLength() as u64, block.bodyLength() as u64);
        let mut bytes = vec![0u8; (meta + body) as usize];
        self.file.seek(SeekFrom::Start(offset))?;
        self.file.read_exact(&mut bytes)?;
        Ok(RawMessage { block, bytes: Buffer::from_vec(bytes) })
    }

    /// Decode one message that may be what `expected` says: a record batch
    /// is returned, a dictionary batch joins the decoder's dictionaries.
    fn decode(&mut self, raw: &RawMessage, expected: Expected) -> std::result::Result<Decoded, ArrowError> {
        let message = message_of(&raw.bytes)?;
        let meta = usize::try_from(raw.block.metaDataLength()).unwrap_or(usize::MAX);
        let body = raw.bytes.get(meta..).ok_or_else(|| {
            ArrowError::ParseError(format!(
                "a message's metadata length {meta} runs past its {} bytes",
                raw.bytes.len()
            ))
        })?;
        let header = message.header_type();
        match (header, expected) {
            (MessageHeader::RecordBatch, Expected::Any | Expected::RecordBatch) => {
                let batch = message.header_as_record_batch();
                let declared = compressed_sizes(batch, body)?;
                if declared > MAX_BATCH_BYTES {
                    let what = "a batch's compressed buffers";
                    return Err(BatchTooLarge { what, bytes: declared }.into_arrow());
                }
                let batch = self.decoder.read_record_batch(&raw.block, &raw.bytes)?;
                Ok(batch.map_or(Decoded::End, Decoded::Batch))
            }
            (MessageHeader::DictionaryBatch, Expected::Any | Expected::Dictionary) => {
                let dictionary = message.header_as_dictionary_batch();
                let declared = compressed_sizes(dictionary.and_then(|d| d.data()), body)?.max(body.len() as u64);
                let (id, delta) = dictionary.map_or((0, false), |d| (d.id(), d.isDelta()));
                hold_dictionary(&mut self.dictionary_bytes, id, delta, declared)?;
                self.decoder.read_dictionary(&raw.block, &raw.bytes)?;
                Ok(Decoded::Dictionary)
            }
            // `arrow-ipc`'s file reader ends at a message without a header.
            (MessageHeader::NONE, Expected::RecordBatch) => Ok(Decoded::End),
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

/// What a message may be where it is read.
#[derive(Clone, Copy)]
enum Expected {
    /// A record batch or a dictionary batch (a stream's messages).
    Any,
    /// A record batch (a file's record batch blocks).
    RecordBatch,
    /// A dictionary batch (a file's dictionary blocks).
    Dictionary,
}

/// What a decoded message gave.
enum Decoded {
    /// A record batch.
    Batch(RecordBatch),
    /// A dictionary, now kept by the decoder.
    Dictionary,
    /// Nothing more: the data ends here.
    End,
}

/// Count a dictionary batch of `bytes` for dictionary `id` in `held` (the
/// bytes each dictionary holds): a delta adds to the dictionary, another
/// batch replaces it. An error once all of them together would hold more
/// than [`MAX_BATCH_BYTES`].
fn hold_dictionary(
    held: &mut HashMap<i64, u64>,
    id: i64,
    delta: bool,
    bytes: u64,
) -> std::result::Result<(), ArrowError> {
    let dictionary = held.entry(id).or_default();
    *dictionary = if delta { dictionary.saturating_add(bytes) } else { bytes };
    let all = held.values().fold(0u64, |all, &bytes| all.saturating_add(bytes));
    match all > MAX_BATCH_BYTES {
        true => Err(BatchTooLarge { what: "the dictionaries", bytes: all }.into_arrow()),
        false => Ok(()),
    }
}

/// The footer's length and the closing magic.
const TRAILER: u64 = 10;

/// The length of an Arrow IPC file's footer, from its trailer (a footer
/// length, then `ARROW1`), checked against the file: `arrow-ipc` allocates
/// the declared length before it reads (the fuzzer's file asked for
/// 1.36 GB).
fn footer_length(file: &mut BufReader<File>, size: u64) -> std::result::Result<u64, ArrowError> {
    /// The leading magic with its padding.
    const LEADING: u64 = 8;
    if size < LEADING + TRAILER {
        return Err(ArrowError::ParseError(format!("{size} bytes is too short to hold its footer (cut short?)")));
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.seek(SeekFrom::Start(size - TRAILER))?;
    file.read_exact(&mut trailer)?;
    if &trailer[4..] != b"ARROW1" {
        return Err(ArrowError::ParseError("it does not end with ARROW1 (cut short?)".into()));
    }
    let footer = i32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    u64::try_from(footer).ok().filter(|&footer| footer <= size - LEADING - TRAILER).ok_or_else(|| {
        ArrowError::ParseError(format!("its footer declares {footer} bytes, more than the {size}-byte file holds"))
    })
}

/// Check that a file's blocks lie between its leading magic and its footer
/// (at `data_end`) without overlapping: each is then read once, and no
/// more bytes are read than the file holds.
fn check_block_layout(blocks: &[Block], dictionaries: &[Block], data_end: u64) -> std::result::Result<(), ArrowError> {
    let mut spans = Vec::with_capacity(blocks.len() + dictionaries.len());
    for block in blocks.iter().chain(dictionaries) {
        let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
        let span = u64::try_from(offset)
            .ok()
            .zip(u64::try_from(meta).ok())
            .zip(u64::try_from(body).ok())
            .and_then(|((offset, meta), body)| Some((offset, offset.checked_add(meta)?.checked_add(body)?)));
        match span {
            Some((start, end)) if start >= 8 && end <= data_end => spans.push((start, end)),
            _ => {
                return Err(ArrowError::ParseError(format!(
                    "a block at byte {offset} of {meta} + {body} bytes lies outside the file's {data_end} bytes of \
                     data (cut short?)"
                )))
            }
        }
    }
    spans.sort_unstable();
    match spans.windows(2).find(|pair| pair[1].0 < pair[0].1) {
        Some(pair) => Err(ArrowError::ParseError(format!(
            "its blocks at bytes {} and {} overlap (a corrupt footer)",
            pair[0].0, pair[1].0
        ))),
        None => Ok(()),
    }
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
    let continued = word == CONTINUATION;
    if continued {
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
    // The message's prefix as the stream has it (a continuation marker and
    // the length, or the length alone), so the body keeps its alignment.
    let mut bytes = Vec::with_capacity(8 + meta as usize);
    if continued {
        bytes.extend_from_slice(&CONTINUATION);
    }
    bytes.extend_from_slice(&meta_len.to_le_bytes());
    let prefix = bytes.len() as u64;
    read_exactly(file, meta, &mut bytes)?;
    let body = {
        let message = arrow_ipc::root_as_message(&bytes[prefix as usize..])
            .map_err(|e| ArrowError::ParseError(format!("a message cannot be read: {e}")))?;
        let body = message.bodyLength();
        u64::try_from(body)
            .ok()
            .filter(|&body| body <= left - meta)
            .ok_or_else(|| ArrowError::ParseError(too_long("a message's body", body, position + meta, left - meta)))?
    };
    bytes.reserve_exact(body as usize);
    read_exactly(file, body, &mut bytes)?;
    let meta_with_prefix = i32::try_from(prefix + meta)
        .map_err(|_| ArrowError::ParseError(format!("a message's metadata of {meta} bytes is too long")))?;
    Ok(Some(RawMessage { block: Block::new(0, meta_with_prefix, body as i64), bytes: Buffer::from_vec(bytes) }))
}

/// Append `len` bytes of `file` to `bytes` (growing it as they arrive):
/// an error if the file ends first (it shrank while being read).
fn read_exactly(file: &mut BufReader<File>, len: u64, bytes: &mut Vec<u8>) -> std::result::Result<(), ArrowError> {
    let read = file.by_ref().take(len).read_to_end(bytes)?;
    match read as u64 == len {
        true => Ok(()),
        false => Err(ArrowError::ParseError(format!("the file ended after {read} of {len} bytes (did it change?)"))),
    }
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

/// The bytes that a batch's compressed buffers in `body` declare they
/// decompress to, all together (0 for a batch stored plain): each buffer
/// starts with its decompressed length (-1: that buffer is stored plain).
/// A buffer outside the body is an error (the decoder would panic); one too
/// short to hold its length is left to the decoder, which refuses it.
fn compressed_sizes(batch: Option<arrow_ipc::RecordBatch>, body: &[u8]) -> std::result::Result<u64, ArrowError> {
    let Some(batch) = batch else { return Ok(0) };
    let compressed = batch.compression().is_some();
    let mut declared = 0u64;
    for buffer in batch.buffers().into_iter().flatten() {
        let range = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        let Some(bytes) = range.and_then(|range| body.get(range)) else {
            return Err(ArrowError::ParseError(format!(
                "a buffer at byte {} of {} bytes lies outside its message's {}-byte body",
                buffer.offset(),
                buffer.length(),
                body.len()
            )));
        };
        // -1 (stored plain), 0 (empty) and other negative lengths allocate nothing.
        if let Some(length) = bytes.first_chunk::<8>().filter(|_| compressed) {
            declared = declared.saturating_add(u64::try_from(i64::from_le_bytes(*length)).unwrap_or(0));
        }
    }
    Ok(declared)
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

    /// Blocks must lie between the leading magic and the footer without
    /// overlapping (a footer listing one block a million times would read
    /// it a million times).
    #[test]
    fn blocks_inside_the_data_and_apart() {
        let layout = |blocks: &[(i64, i32, i64)]| {
            let blocks: Vec<Block> =
                blocks.iter().map(|&(offset, meta, body)| Block::new(offset, meta, body)).collect();
            check_block_layout(&blocks[1..], &blocks[..1], 1000).map_err(|e| e.to_string())
        };
        assert_eq!(layout(&[(8, 100, 100), (208, 100, 0), (308, 100, 592)]), Ok(()));
        let err = layout(&[(8, 100, 100), (208, 100, 0), (208, 100, 0)]).unwrap_err();
        assert!(err.contains("its blocks at bytes 208 and 208 overlap"), "{err}");
        assert!(layout(&[(8, 100, 100), (150, 10, 10)]).unwrap_err().contains("overlap"));
        for outside in [(0, 8, 8), (900, 50, 51), (-1, 8, 8), (8, -8, 8), (8, 8, i64::MAX)] {
            let err = layout(&[outside]).unwrap_err();
            assert!(err.contains("lies outside the file's 1000 bytes of data"), "{outside:?}: {err}");
        }
    }

    /// Dictionaries are counted as they are kept: a delta adds, a
    /// replacement replaces, and together they stay within the budget.
    #[test]
    fn dictionaries_are_held_within_the_budget() {
        let mut held = HashMap::new();
        let half = MAX_BATCH_BYTES / 2;
        hold_dictionary(&mut held, 0, false, half).unwrap();
        hold_dictionary(&mut held, 0, false, half).unwrap();
        hold_dictionary(&mut held, 1, false, half).unwrap();
        let err = hold_dictionary(&mut held, 0, true, 1).unwrap_err().to_string();
        assert!(err.contains(&format!("the dictionaries declare {} bytes decompressed", MAX_BATCH_BYTES + 1)), "{err}");
        let mut held = HashMap::new();
        for _ in 0..3 {
            hold_dictionary(&mut held, 7, true, MAX_BATCH_BYTES / 3).unwrap();
        }
        assert!(hold_dictionary(&mut held, 7, true, MAX_BATCH_BYTES / 3).is_err(), "deltas add up");
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
        assert!(err.contains("cut.feather") && err.contains("lies outside the file's"), "{err}");
    }
}
