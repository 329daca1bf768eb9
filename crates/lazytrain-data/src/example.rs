//! `tf.train.Example` protos with int64 features, encoded and decoded by
//! hand (the format is small: a map from names to `Int64List`s).

use crate::protobuf::{put_bytes, put_varint, Reader, Value};
use crate::{DataError, Result};

/// Encode an `Example` whose features are int64 lists, in the given order.
pub fn encode_int64_example(features: &[(&str, &[i64])]) -> Vec<u8> {
    let mut map = Vec::new();
    for (name, values) in features {
        let mut packed = Vec::new();
        for &v in *values {
            put_varint(&mut packed, v as u64);
        }
        let mut list = Vec::new();
        put_bytes(&mut list, 1, &packed);
        let mut feature = Vec::new();
        put_bytes(&mut feature, 3, &list);
        let mut entry = Vec::new();
        put_bytes(&mut entry, 1, name.as_bytes());
        put_bytes(&mut entry, 2, &feature);
        put_bytes(&mut map, 1, &entry);
    }
    let mut example = Vec::new();
    put_bytes(&mut example, 1, &map);
    example
}

fn malformed(what: &str) -> DataError {
    DataError::Invalid(format!("malformed tf.train.Example: {what}"))
}

/// The fields of `data`, failing on a malformed one.
fn fields<'a>(data: &'a [u8], what: &'static str) -> impl Iterator<Item = Result<(u32, Value<'a>)>> + 'a {
    let mut reader = Reader::new(data);
    std::iter::from_fn(move || (!reader.done()).then(|| reader.field().ok_or_else(|| malformed(what))))
}

fn int64_list(body: &[u8]) -> Result<Vec<i64>> {
    let mut values = Vec::new();
    for field in fields(body, "bad Int64List") {
        match field? {
            (1, Value::Bytes(packed)) => {
                let mut p = Reader::new(packed);
                while !p.done() {
                    values.push(p.varint().ok_or_else(|| malformed("bad packed varint"))? as i64);
                }
            }
            (1, Value::Varint(v)) => values.push(v as i64),
            _ => {}
        }
    }
    Ok(values)
}

/// Decode the int64 features of an `Example` (other kinds are ignored).
pub fn decode_int64_example(data: &[u8]) -> Result<Vec<(String, Vec<i64>)>> {
    let mut out = Vec::new();
    for field in fields(data, "bad Example") {
        let (1, Value::Bytes(features)) = field? else { continue };
        for entry in fields(features, "bad Features") {
            let (_, Value::Bytes(entry)) = entry? else { continue };
            let (mut name, mut values) = (None, None);
            for part in fields(entry, "bad feature entry") {
                match part? {
                    (1, Value::Bytes(key)) => name = Some(String::from_utf8_lossy(key).into_owned()),
                    (2, Value::Bytes(feature)) => {
                        for kind in fields(feature, "bad Feature") {
                            if let (3, Value::Bytes(list)) = kind? {
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
