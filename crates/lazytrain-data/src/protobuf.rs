//! The few protobuf wire-format pieces TFRecord payloads need
//! (`tf.train.Example`, TensorBoard's `Event`): varints, length-delimited
//! fields, and a reader over fields.

/// Append `v` as a base-128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Append a field key (`field << 3 | wire type`).
pub fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, ((field as u64) << 3) | wire as u64);
}

/// Append a length-delimited field (strings, bytes, nested messages, packed lists).
pub fn put_bytes(out: &mut Vec<u8>, field: u32, body: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// One field's payload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1 (little-endian 8 bytes).
    Fixed64(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5 (little-endian 4 bytes).
    Fixed32(u32),
}

/// Reads the fields of one message.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over an encoded message.
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, pos: 0 }
    }

    /// True when every byte has been read.
    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next varint.
    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.data.get(self.pos)?;
            self.pos += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes)
    }

    /// The next `(field number, payload)`; `None` at a malformed field.
    pub fn field(&mut self) -> Option<(u32, Value<'a>)> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().ok()?)),
            2 => {
                let n = self.varint()? as usize;
                Value::Bytes(self.take(n)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            _ => return None,
        };
        Some(((key >> 3) as u32, value))
    }
}
