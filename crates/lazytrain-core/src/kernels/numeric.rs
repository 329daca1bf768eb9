//! Element traits shared by the kernels: floats compute in `f32`, integers in `i64`.

use crate::dtype::{DType, Literal};
use crate::storage::HostData;
use half::{bf16, f16};

/// A floating-point storage type whose math runs in `f32`.
pub(crate) trait FloatLike: Copy + PartialOrd + Send + Sync {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl FloatLike for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl FloatLike for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl FloatLike for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// An integer storage type whose math runs in `i64` and wraps on the way back.
pub(crate) trait IntLike: Copy + PartialOrd + Send + Sync {
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}

macro_rules! impl_int_like {
    ($t:ty) => {
        impl IntLike for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
impl_int_like!(i64);
impl_int_like!(i32);
impl_int_like!(u8);

/// Every element as `i64` (floats truncate toward zero, bools are 0/1).
pub(crate) fn to_i64_vec(data: &HostData) -> Vec<i64> {
    match data {
        HostData::I64(v) => v.clone(),
        HostData::I32(v) => v.iter().map(|&x| x as i64).collect(),
        HostData::U8(v) => v.iter().map(|&x| x as i64).collect(),
        HostData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
        other => other.to_f64_vec().into_iter().map(|x| x as i64).collect(),
    }
}

/// Overwrite `out` (already sized) with `values` converted to its dtype.
pub(crate) fn fill_from_f64(out: &mut HostData, values: impl Iterator<Item = f64>) {
    match out {
        HostData::F32(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as f32),
        HostData::BF16(o) => o
            .iter_mut()
            .zip(values)
            .for_each(|(o, v)| *o = bf16::from_f64(v)),
        HostData::F16(o) => o
            .iter_mut()
            .zip(values)
            .for_each(|(o, v)| *o = f16::from_f64(v)),
        HostData::I64(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as i64),
        HostData::I32(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as i32),
        HostData::U8(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as u8),
        HostData::Bool(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v != 0.0),
    }
}

/// Overwrite `out` (already sized) with integer `values` converted to its dtype.
pub(crate) fn fill_from_i64(out: &mut HostData, values: impl Iterator<Item = i64>) {
    match out {
        HostData::I64(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v),
        HostData::I32(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as i32),
        HostData::U8(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v as u8),
        HostData::Bool(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v != 0),
        float => fill_from_f64(float, values.map(|v| v as f64)),
    }
}

/// Fill every element of `out` with `value`.
pub(crate) fn fill_literal(out: &mut HostData, value: Literal) {
    let len = out.len();
    match (value, out.dtype()) {
        (Literal::Int(v), dtype) if !dtype.is_float() => {
            fill_from_i64(out, std::iter::repeat_n(v, len))
        }
        (v, _) => fill_from_f64(out, std::iter::repeat_n(v.as_f64(), len)),
    }
}

/// Convert `x` into `out`'s dtype, element by element.
pub(crate) fn cast(x: &HostData, out: &mut HostData) {
    if x.dtype().is_float() && out.dtype() == DType::Bool {
        fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i)));
    } else if x.dtype().is_float() {
        match (x, out) {
            (HostData::F32(a), HostData::BF16(o)) => {
                a.iter().zip(o).for_each(|(a, o)| *o = bf16::from_f32(*a))
            }
            (HostData::F32(a), HostData::F16(o)) => {
                a.iter().zip(o).for_each(|(a, o)| *o = f16::from_f32(*a))
            }
            (HostData::BF16(a), HostData::F32(o)) => {
                a.iter().zip(o).for_each(|(a, o)| *o = a.to_f32())
            }
            (HostData::F16(a), HostData::F32(o)) => {
                a.iter().zip(o).for_each(|(a, o)| *o = a.to_f32())
            }
            (x, out) => fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i))),
        }
    } else {
        fill_from_i64(out, to_i64_vec(x).into_iter());
    }
}
