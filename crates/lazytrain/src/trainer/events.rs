//! TensorBoard event files written natively: TFRecord framing around
//! `tensorflow.Event` protos whose summaries carry `simple_value` scalars.

use crate::{Error, Result};
use lazytrain_data::protobuf::{put_bytes, put_key, put_varint, Reader, Value};
use lazytrain_data::tfrecord::{CorruptPolicy, LocalShard, RecordIndex, RecordWriter};
use std::path::{Path, PathBuf};

/// `Event { wall_time = 1 (double), step = 2 (int64), file_version = 3 | summary = 5 }`.
fn event(wall_time: f64, step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    put_key(&mut e, 1, 1);
    e.extend_from_slice(&wall_time.to_le_bytes());
    put_key(&mut e, 2, 0);
    put_varint(&mut e, step as u64);
    body(&mut e);
    e
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Appends scalar summaries to an `events.out.tfevents.*` file.
pub struct EventWriter {
    writer: RecordWriter,
    path: PathBuf,
}

impl EventWriter {
    /// Create a new event file in `dir` (starting with the `brain.Event:2` version record).
    pub fn create(dir: &Path) -> Result<EventWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Input(format!("{}: {e}", dir.display())))?;
        let wall = now();
        // Unique per writer: two runs in one second must not share a file.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = dir.join(format!("events.out.tfevents.{}.lazytrain.{}.{nanos}", wall as u64, std::process::id()));
        let mut writer = RecordWriter::create(&path)?;
        writer.write(&event(wall, 0, |e| put_bytes(e, 3, b"brain.Event:2")))?;
        writer.flush()?;
        Ok(EventWriter { writer, path })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record `value` under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        let mut v = Vec::new();
        put_bytes(&mut v, 1, tag.as_bytes());
        put_key(&mut v, 2, 5);
        v.extend_from_slice(&value.to_le_bytes());
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, &v);
        self.writer.write(&event(now(), step, |e| put_bytes(e, 5, &summary)))?;
        Ok(())
    }

    /// Make the written events visible to readers.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.writer.flush()?)
    }
}

/// One decoded scalar: `(step, tag, value)`.
pub type Scalar = (i64, String, f32);

/// Decode every scalar of an event file (checking the TFRecord framing).
pub fn read_scalars(path: &Path) -> Result<Vec<Scalar>> {
    let source = LocalShard::open(path)?;
    let index = RecordIndex::scan_source(&source, CorruptPolicy::Fail)?;
    let bad = || Error::Input(format!("{}: malformed Event record", path.display()));
    let mut out = Vec::new();
    for k in 0..index.spans.len() {
        let record = index.read_from(&source, k)?;
        let mut event = Reader::new(&record);
        let mut step = 0i64;
        while !event.done() {
            match event.field().ok_or_else(bad)? {
                (2, Value::Varint(s)) => step = s as i64,
                (5, Value::Bytes(summary)) => {
                    let mut values = Reader::new(summary);
                    while !values.done() {
                        let (_, Value::Bytes(value)) = values.field().ok_or_else(bad)? else { continue };
                        let mut v = Reader::new(value);
                        let (mut tag, mut x) = (String::new(), f32::NAN);
                        while !v.done() {
                            match v.field().ok_or_else(bad)? {
                                (1, Value::Bytes(t)) => tag = String::from_utf8_lossy(t).into_owned(),
                                (2, Value::Fixed32(bits)) => x = f32::from_bits(bits),
                                _ => {}
                            }
                        }
                        out.push((step, tag, x));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}
