//! `tf.train.Example` protos with int64 features, encoded and decoded by
//! hand (the format is small: a map from names to `Int64List`s).

use crate::{DataError, Result};

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len_delimited(out: &mut Vec<u8>, field: u32, body: &[u8]) {
    put_varint(out, ((field << 3) | 2) as u64);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// Encode an `Example` whose features are int64 lists, in the given order.
pub fn encode_int64_example(features: &[(&str, &[i64])]) -> Vec<u8> {
    let mut map = Vec::new();
    for (name, values) in features {
        let mut packed = Vec::new();
        for &v in *values {
            put_varint(&mut packed, v as u64);
        }
        let mut list = Vec::new();
        put_len_delimited(&mut list, 1, &packed);
        let mut feature = Vec::new();
        put_len_delimited(&mut feature, 3, &list);
        let mut entry = Vec::new();
        put_len_delimited(&mut entry, 1, name.as_bytes());
        put_len_delimited(&mut entry, 2, &feature);
        put_len_delimited(&mut map, 1, &entry);
    }
    let mut example = Vec::new();
    put_len_delimited(&mut example, 1, &map);
    example
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn varint(&mut self) -> Option<u64> {
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

    /// The next `(field, wire type, payload)`; varint payloads come back as
    /// their bytes' value in `.3`.
    fn field(&mut self) -> Option<(u32, u8, &'a [u8], u64)> {
        let key = self.varint()?;
        let (field, wire) = ((key >> 3) as u32, (key & 7) as u8);
        match wire {
            0 => Some((field, wire, &[], self.varint()?)),
            2 => {
                let len = self.varint()? as usize;
                let body = self.data.get(self.pos..self.pos.checked_add(len)?)?;
                self.pos += len;
                Some((field, wire, body, 0))
            }
            1 => {
                self.pos += 8;
                Some((field, wire, &[], 0))
            }
            5 => {
                self.pos += 4;
                Some((field, wire, &[], 0))
            }
            _ => None,
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

fn malformed(what: &str) -> DataError {
    DataError::Invalid(format!("malformed tf.train.Example: {what}"))
}

fn int64_list(body: &[u8]) -> Result<Vec<i64>> {
    let mut values = Vec::new();
    let mut c = Cursor { data: body, pos: 0 };
    while !c.done() {
        match c.field().ok_or_else(|| malformed("bad Int64List"))? {
            (1, 2, packed, _) => {
                let mut p = Cursor { data: packed, pos: 0 };
                while !p.done() {
                    values.push(p.varint().ok_or_else(|| malformed("bad packed varint"))? as i64);
                }
            }
            (1, 0, _, v) => values.push(v as i64),
            _ => {}
        }
    }
    Ok(values)
}

/// Decode the int64 features of an `Example` (other kinds are ignored).
pub fn decode_int64_example(data: &[u8]) -> Result<Vec<(String, Vec<i64>)>> {
    let mut out = Vec::new();
    let mut example = Cursor { data, pos: 0 };
    while !example.done() {
        let (field, _, features, _) = example.field().ok_or_else(|| malformed("bad Example"))?;
        if field != 1 {
            continue;
        }
        let mut map = Cursor { data: features, pos: 0 };
        while !map.done() {
            let (_, _, entry, _) = map.field().ok_or_else(|| malformed("bad Features"))?;
            let mut e = Cursor { data: entry, pos: 0 };
            let (mut name, mut values) = (None, None);
            while !e.done() {
                match e.field().ok_or_else(|| malformed("bad feature entry"))? {
                    (1, 2, key, _) => name = Some(String::from_utf8_lossy(key).into_owned()),
                    (2, 2, feature, _) => {
                        let mut f = Cursor { data: feature, pos: 0 };
                        while !f.done() {
                            if let (3, 2, list, _) = f.field().ok_or_else(|| malformed("bad Feature"))? {
                                values = Some(int64_list(list)?);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let (Some(n), Some(v)) = (name, values) {
                out.push((n, v));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_negative_and_large_values() {
        let ids = [101i64, 7, -100, i64::MAX, 0];
        let mask = [1i64, 1, 0];
        let bytes = encode_int64_example(&[("input_ids", &ids), ("attention_mask", &mask)]);
        let decoded = decode_int64_example(&bytes).unwrap();
        assert_eq!(
            decoded,
            vec![("input_ids".to_string(), ids.to_vec()), ("attention_mask".to_string(), mask.to_vec())]
        );
    }

    #[test]
    fn matches_the_protobuf_wire_bytes() {
        // Example{features{feature{key:"a" value{int64_list{value:[1, 300]}}}}} as protobuf serialises it.
        let bytes = encode_int64_example(&[("a", &[1, 300])]);
        let expected = [0x0a, 0x0e, 0x0a, 0x0c, 0x0a, 0x01, b'a', 0x12, 0x07, 0x1a, 0x05, 0x0a, 0x03, 0x01, 0xac, 0x02];
        assert_eq!(bytes, expected);
        assert!(decode_int64_example(&[0x0a, 0x05, 0x0a]).is_err());
    }
}
