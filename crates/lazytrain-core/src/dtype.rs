//! Element types and scalar literals.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
///
/// `BF16` and `F16` are storage types: elementwise math on them widens each
/// element to `f32`, computes, and rounds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit IEEE float, the default.
    F32,
    /// 64-bit IEEE float (gradient checks, reference math).
    F64,
    /// bfloat16 (8 exponent bits), used for mixed precision.
    BF16,
    /// IEEE half precision (storage only).
    F16,
    /// 64-bit signed integer (token ids, labels).
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean (results of comparisons, masks).
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 | DType::F64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for the integer types (not bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    /// The lower-case name used in messages and the IR printer.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar value stored in the IR (constants, pad values).
///
/// Floats are kept as their `f64` bit pattern so literals hash and compare
/// exactly (two NaNs with the same bits are the same literal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Literal {
    /// A floating-point value, as `f64::to_bits`.
    Float(u64),
    /// An integer or boolean value.
    Int(i64),
}

impl Literal {
    /// A literal holding `value` in the representation `dtype` uses.
    pub fn new(value: f64, dtype: DType) -> Literal {
        if dtype.is_float() {
            Literal::Float(value.to_bits())
        } else if dtype == DType::Bool {
            Literal::Int((value != 0.0) as i64)
        } else {
            Literal::Int(value as i64)
        }
    }

    /// The value as `f64`.
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(bits) => f64::from_bits(bits),
            Literal::Int(v) => v as f64,
        }
    }

    /// The value as `i64` (floats truncate toward zero).
    pub fn as_i64(self) -> i64 {
        match self {
            Literal::Float(bits) => f64::from_bits(bits) as i64,
            Literal::Int(v) => v,
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Float(bits) => write!(f, "{:?}", f64::from_bits(*bits)),
            Literal::Int(v) => write!(f, "{v}"),
        }
    }
}
