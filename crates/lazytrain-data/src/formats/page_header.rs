//! The uncompressed size a Parquet page header declares, read from its
//! Thrift compact encoding the way the `parquet` crate reads it (so that a
//! size the crate would trust is seen here first): fields by short or long
//! id, fields 1 to 4 read as `i32` varints whatever type they declare
//! (varints of any length, cut to an `i32`), fields 5 to 8 as structs, any
//! other field skipped by its type, the last field 2 winning.

/// What reading a page header's declared size came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeclaredSize {
    /// The header, read to its end, declares this size (`None`: no field 2).
    Read(Option<i32>),
    /// The header runs past the bytes given: read more.
    NeedMore,
    /// The header cannot be read (the crate refuses it too).
    Invalid,
}

/// The uncompressed page size the header at the front of `bytes` declares.
pub(crate) fn declared_uncompressed_size(bytes: &[u8]) -> DeclaredSize {
    let mut header = HeaderBytes { bytes, at: 0 };
    match header.page_header() {
        Ok(size) => DeclaredSize::Read(size),
        Err(Stop::NeedMore) => DeclaredSize::NeedMore,
        Err(Stop::Invalid) => DeclaredSize::Invalid,
    }
}

/// Why a walk over a header stopped early.
enum Stop {
    /// It ran past the bytes given.
    NeedMore,
    /// The bytes are not a header the crate reads.
    Invalid,
}

/// How deep the crate skips nested values.
const SKIP_DEPTH: u8 = 64;

/// Compact-protocol type ids.
mod field_type {
    pub(super) const STOP: u8 = 0;
    pub(super) const BOOLEAN_TRUE: u8 = 1;
    pub(super) const BOOLEAN_FALSE: u8 = 2;
    pub(super) const BYTE: u8 = 3;
    pub(super) const I16: u8 = 4;
    pub(super) const I32: u8 = 5;
    pub(super) const I64: u8 = 6;
    pub(super) const DOUBLE: u8 = 7;
    pub(super) const BINARY: u8 = 8;
    pub(super) const LIST: u8 = 9;
    pub(super) const SET: u8 = 10;
    pub(super) const MAP: u8 = 11;
    pub(super) const STRUCT: u8 = 12;
    pub(super) const UUID: u8 = 13;
}

/// A header's bytes and the position reached in them.
struct HeaderBytes<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl HeaderBytes<'_> {
    fn byte(&mut self) -> Result<u8, Stop> {
        let b = *self.bytes.get(self.at).ok_or(Stop::NeedMore)?;
        self.at += 1;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), Stop> {
        let end = usize::try_from(n).ok().and_then(|n| self.at.checked_add(n)).ok_or(Stop::NeedMore)?;
        if end > self.bytes.len() {
            return Err(Stop::NeedMore);
        }
        self.at = end;
        Ok(())
    }

    /// An unsigned varint, of any length as the crate reads it.
    fn varint(&mut self) -> Result<u64, Stop> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f).wrapping_shl(shift);
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift = shift.wrapping_add(7);
        }
    }

    fn zigzag(&mut self) -> Result<i64, Stop> {
        let value = self.varint()?;
        Ok((value >> 1) as i64 ^ -((value & 1) as i64))
    }

    /// The fields of a page header, to its stop byte.
    fn page_header(&mut self) -> Result<Option<i32>, Stop> {
        let (mut last_id, mut size) = (0i16, None);
        while let Some((id, kind)) = self.field(last_id)? {
            match id {
                2 => size = Some(self.zigzag()? as i32),
                1 | 3 | 4 => {
                    self.varint()?;
                }
                5..=8 => self.skip_value(field_type::STRUCT, SKIP_DEPTH)?,
                _ => self.skip_value(kind, SKIP_DEPTH)?,
            }
            last_id = id;
        }
        Ok(size)
    }

    /// The next field's id and type, `None` at the struct's stop byte.
    fn field(&mut self, last_id: i16) -> Result<Option<(i16, u8)>, Stop> {
        let b = self.byte()?;
        let kind = b & 0x0f;
        if kind == field_type::STOP {
            return Ok(None);
        }
        if kind > field_type::UUID {
            return Err(Stop::Invalid);
        }
        let id = match b >> 4 {
            0 => self.zigzag()? as i16,
            delta => last_id.checked_add(i16::from(delta)).ok_or(Stop::Invalid)?,
        };
        Ok(Some((id, kind)))
    }

    /// Skip a value of type `kind` as the crate's skipper does.
    fn skip_value(&mut self, kind: u8, depth: u8) -> Result<(), Stop> {
        use field_type::*;
        if depth == 0 {
            return Err(Stop::Invalid);
        }
        match kind {
            BOOLEAN_TRUE | BOOLEAN_FALSE => Ok(()),
            BYTE => self.skip(1),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.skip(8),
            UUID => self.skip(16),
            BINARY => {
                let len = self.varint()?;
                self.skip(len)
            }
            STRUCT => {
                let mut last_id = 0;
                while let Some((id, kind)) = self.field(last_id)? {
                    self.skip_value(kind, depth - 1)?;
                    last_id = id;
                }
                Ok(())
            }
            LIST | SET => {
                let header = self.byte()?;
                if header == 0 {
                    return Ok(());
                }
                let element = element_type(header & 0x0f)?;
                let count = match header >> 4 {
                    15 => i32::try_from(self.varint()?).map_err(|_| Stop::Invalid)?,
                    n => i32::from(n),
                };
                // Booleans take no bytes to the crate's skipper: a list of
                // billions of them is skipped at once, not one at a time.
                if element == BOOLEAN_TRUE {
                    return Ok(());
                }
                (0..count).try_for_each(|_| self.skip_value(element, depth - 1))
            }
            MAP => {
                let count = i32::try_from(self.varint()?).map_err(|_| Stop::Invalid)?;
                if count <= 0 {
                    return Ok(());
                }
                let kinds = self.byte()?;
                let (key, value) = (element_type(kinds >> 4)?, element_type(kinds & 0x0f)?);
                if (key, value) == (BOOLEAN_TRUE, BOOLEAN_TRUE) {
                    return Ok(());
                }
                (0..count).try_for_each(|_| {
                    self.skip_value(key, depth - 1)?;
                    self.skip_value(value, depth - 1)
                })
            }
            _ => Err(Stop::Invalid),
        }
    }
}

/// The type of a list's, set's or map's elements from its 4-bit code, as
/// the crate maps it (booleans coded 1 or 2).
fn element_type(code: u8) -> Result<u8, Stop> {
    use field_type::*;
    match code {
        BOOLEAN_TRUE | BOOLEAN_FALSE => Ok(BOOLEAN_TRUE),
        BYTE..=UUID => Ok(code),
        _ => Err(Stop::Invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(bytes: &[u8]) -> DeclaredSize {
        declared_uncompressed_size(bytes)
    }

    #[test]
    fn the_size_is_read_as_writers_write_it_and_in_every_form_the_crate_accepts() {
        // type 0, size 2^20 - 1, compressed 1, then a data page header struct.
        let canonical = [0x15, 0x00, 0x15, 0xfe, 0xff, 0x7f, 0x15, 0x02, 0x2c, 0x15, 0x02, 0x00, 0x00];
        assert_eq!(declared(&canonical), DeclaredSize::Read(Some(1_048_575)));
        // Field 2 declared as an i64: the crate reads it as an i32 all the same.
        assert_eq!(declared(&[0x15, 0x00, 0x16, 0x04, 0x00]), DeclaredSize::Read(Some(2)));
        // Long-form field ids (a type byte, then the id as a zigzag varint).
        assert_eq!(declared(&[0x05, 0x02, 0x00, 0x05, 0x04, 0x06, 0x00]), DeclaredSize::Read(Some(3)));
        // A second field 2, after a struct with a binary and a list in it: the last wins.
        let twice = [
            0x25, 0x02, // field 2: 1
            0x3c, 0x18, 0x03, b'a', b'b', b'c', 0x19, 0x35, 0x02, 0x04, 0x06, 0x00, // field 5: struct
            0x05, 0x04, 0x80, 0x80, 0x80, 0x80, 0x08, // field 2 (long form): 2^30
            0x00,
        ];
        assert_eq!(declared(&twice), DeclaredSize::Read(Some(1 << 30)));
        // The fuzzer's header: a six-byte varint, which the crate cuts to an i32.
        let fuzzed = [0x15, 0x04, 0x15, 0x8c, 0xe6, 0xc2, 0xc6, 0xc8, 0x12, 0x00];
        assert_eq!(declared(&fuzzed), DeclaredSize::Read(Some(1_147_689_350)));
        assert_eq!(declared(&[0x15, 0x00, 0x00]), DeclaredSize::Read(None));
    }

    #[test]
    fn a_header_cut_short_needs_more_bytes_and_a_broken_one_is_invalid() {
        assert_eq!(declared(&[0x15, 0x00, 0x15, 0xff]), DeclaredSize::NeedMore);
        assert_eq!(declared(&[0x15, 0x00, 0x18, 0x7f, 0x00]), DeclaredSize::Read(Some(-64)), "a binary read as an i32");
        assert_eq!(declared(&[0x15, 0x00, 0x88, 0x7f]), DeclaredSize::NeedMore, "field 9: a binary of 127 bytes");
        assert_eq!(declared(&[0x1e, 0x00]), DeclaredSize::Invalid, "type 14");
        // A list of 2^31 - 1 booleans in field 9 is skipped at once.
        let booleans = [0x15, 0x00, 0x89, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x05, 0x04, 0x04, 0x00];
        assert_eq!(declared(&booleans), DeclaredSize::Read(Some(2)));
        let deep: Vec<u8> = std::iter::repeat_n(0x1c, 70).collect();
        assert_eq!(declared(&[&[0x9c][..], &deep].concat()), DeclaredSize::Invalid, "nested past the skip depth");
    }
}
