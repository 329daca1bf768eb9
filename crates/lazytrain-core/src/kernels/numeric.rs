//! Element traits shared by the kernels: floats compute in `f32`, integers in `i64`.

use crate::dtype::{DType, Literal};
use crate::storage::HostData;
use half::{bf16, f16};

/// Native floating-point arithmetic (`f32` or `f64`).
pub(crate) trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NAN: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn is_nan(self) -> bool;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! impl_real {
    ($t:ty, $erf:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAN: Self = <$t>::NAN;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
impl_real!(f32, libm::erff);
impl_real!(f64, libm::erf);

/// A floating-point storage type and the native type its math runs in
/// (`bf16`/`f16` widen to `f32`).
pub(crate) trait FloatLike: Copy + PartialOrd + Send + Sync {
    type Math: Real;
    fn widen(self) -> Self::Math;
    fn narrow(v: Self::Math) -> Self;
}

macro_rules! impl_float_like {
    ($t:ty, $math:ty, $widen:expr, $narrow:expr) => {
        impl FloatLike for $t {
            type Math = $math;
            #[inline(always)]
            fn widen(self) -> $math {
                $widen(self)
            }
            #[inline(always)]
            fn narrow(v: $math) -> Self {
                $narrow(v)
            }
        }
    };
}
impl_float_like!(f32, f32, |v| v, |v| v);
impl_float_like!(f64, f64, |v| v, |v| v);
impl_float_like!(bf16, f32, bf16::to_f32, bf16::from_f32);
impl_float_like!(f16, f32, f16::to_f32, f16::from_f32);

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
        HostData::F64(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = v),
        HostData::BF16(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = bf16::from_f64(v)),
        HostData::F16(o) => o.iter_mut().zip(values).for_each(|(o, v)| *o = f16::from_f64(v)),
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
        (Literal::Int(v), dtype) if !dtype.is_float() => fill_from_i64(out, std::iter::repeat_n(v, len)),
        (v, _) => fill_from_f64(out, std::iter::repeat_n(v.as_f64(), len)),
    }
}

/// Convert `x` into `out`'s dtype, element by element.
pub(crate) fn cast(x: &HostData, out: &mut HostData) {
    if x.dtype().is_float() && out.dtype() == DType::Bool {
        fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i)));
    } else if x.dtype().is_float() {
        match (x, out) {
            (HostData::F32(a), HostData::BF16(o)) => a.iter().zip(o).for_each(|(a, o)| *o = bf16::from_f32(*a)),
            (HostData::F32(a), HostData::F16(o)) => a.iter().zip(o).for_each(|(a, o)| *o = f16::from_f32(*a)),
            (HostData::BF16(a), HostData::F32(o)) => a.iter().zip(o).for_each(|(a, o)| *o = a.to_f32()),
            (HostData::F16(a), HostData::F32(o)) => a.iter().zip(o).for_each(|(a, o)| *o = a.to_f32()),
            (x, out) => fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i))),
        }
    } else {
        fill_from_i64(out, to_i64_vec(x).into_iter());
    }
}
