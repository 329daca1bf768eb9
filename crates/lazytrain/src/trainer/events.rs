//! TensorBoard event files written natively: TFRecord framing around
//! `tensorflow.Event` protos whose summaries carry `simple_value` scalars.

use crate::{Error, Result};
use lazytrain_data::tfrecord::{CorruptPolicy, RecordIndex, RecordWriter};
use std::path::{Path, PathBuf};

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, body: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// `Event { wall_time = 1 (double), step = 2 (int64), file_version = 3 | summary = 5 }`.
fn event(wall_time: f64, step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    varint(&mut e, (1 << 3) | 1);
    e.extend_from_slice(&wall_time.to_le_bytes());
    varint(&mut e, 2 << 3);
    varint(&mut e, step as u64);
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
        writer.write(&event(wall, 0, |e| bytes_field(e, 3, b"brain.Event:2")))?;
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
        bytes_field(&mut v, 1, tag.as_bytes());
        varint(&mut v, (2 << 3) | 5);
        v.extend_from_slice(&value.to_le_bytes());
        let mut summary = Vec::new();
        bytes_field(&mut summary, 1, &v);
        self.writer.write(&event(now(), step, |e| bytes_field(e, 5, &summary)))?;
        Ok(())
    }

    /// Make the written events visible to readers.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.writer.flush()?)
    }
}

/// One decoded scalar: `(step, tag, value)`.
pub type Scalar = (i64, String, f32);

struct Cursor<'a>(&'a [u8], usize);

impl Cursor<'_> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.0.get(self.1)?;
            self.1 += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.0.get(self.1..self.1 + n)?;
        self.1 += n;
        Some(s)
    }

    /// `(field, wire type, bytes or fixed value)`.
    fn field(&mut self) -> Option<(u64, u64, Vec<u8>)> {
        let key = self.varint()?;
        let wire = key & 7;
        let payload = match wire {
            0 => self.varint()?.to_le_bytes().to_vec(),
            1 => self.take(8)?.to_vec(),
            2 => {
                let n = self.varint()? as usize;
                self.take(n)?.to_vec()
            }
            5 => self.take(4)?.to_vec(),
            _ => return None,
        };
        Some((key >> 3, wire, payload))
    }

    fn done(&self) -> bool {
        self.1 >= self.0.len()
    }
}

/// Decode every scalar of an event file (checking the TFRecord framing).
pub fn read_scalars(path: &Path) -> Result<Vec<Scalar>> {
    let index = RecordIndex::scan(path, CorruptPolicy::Fail)?;
    let mut file = std::fs::File::open(path).map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    let bad = || Error::Input(format!("{}: malformed Event record", path.display()));
    let mut out = Vec::new();
    for k in 0..index.spans.len() {
        let record = index.read(&mut file, k)?;
        let mut c = Cursor(&record, 0);
        let mut step = 0i64;
        while !c.done() {
            let (field, _, payload) = c.field().ok_or_else(bad)?;
            match field {
                2 => step = u64::from_le_bytes(payload[..8].try_into().map_err(|_| bad())?) as i64,
                5 => {
                    let mut summary = Cursor(&payload, 0);
                    while !summary.done() {
                        let (_, _, value) = summary.field().ok_or_else(bad)?;
                        let mut v = Cursor(&value, 0);
                        let (mut tag, mut x) = (String::new(), f32::NAN);
                        while !v.done() {
                            match v.field().ok_or_else(bad)? {
                                (1, 2, t) => tag = String::from_utf8_lossy(&t).into_owned(),
                                (2, 5, f) => x = f32::from_le_bytes(f[..4].try_into().map_err(|_| bad())?),
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
