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
    ($t:ty, $exp:path, $erf:path, $tanh:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAN: Self = <$t>::NAN;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
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
                $tanh(self)
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
impl_real!(f32, exp_f32, erf_f32, tanh_f32);
impl_real!(f64, f64::exp, libm::erf, f64::tanh);

/// The polynomial with coefficients `c` (highest degree first) at `x`, by
/// Horner's rule in fused multiply-adds.
#[inline(always)]
fn horner(c: &[f32], x: f32) -> f32 {
    c[1..].iter().fold(c[0], |p, &c| p.mul_add(x, c))
}

/// The constants of [`exp_f32`] (shared with its AVX-512 lanes).
pub(super) mod exp_constants {
    /// `log2(e)`.
    pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// The high part of `ln 2` (exact in few bits, so `n ln2_hi` is exact).
    pub(crate) const LN2_HI: f32 = 0.693_359_4;
    /// The rest of `ln 2`.
    pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
    /// `1.5 * 2^23`: adding it rounds to an integer.
    pub(crate) const ROUND: f32 = 12_582_912.0;
    /// Above this, `e^x` is infinite.
    pub(crate) const HIGH: f32 = 88.722_84;
    /// Below this, `e^x` flushes to zero.
    pub(crate) const LOW: f32 = -87.336_55;
    /// Cephes' polynomial for `(e^r - 1 - r) / r²`, highest degree first.
    pub(crate) const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
}

/// The coefficients of [`erf_f32`] (shared with its AVX-512 lanes),
/// highest degree first.
pub(super) mod erf_constants {
    /// `erf(x) / x` in `x²`, for `|x| < 1`.
    pub(crate) const A: [f32; 7] = [
        7.854_02e-5,
        -8.010_246e-4,
        5.188_334_3e-3,
        -2.685_381_6e-2,
        0.112_835_85,
        -0.376_126_26,
        std::f32::consts::FRAC_2_SQRT_PI,
    ];
    /// `erfc(x) e^{x²}` in `1/|x| - 0.625`, for `1 ≤ |x| ≤ 4`.
    pub(crate) const B: [f32; 10] = [
        3.071_391_8e-2,
        -6.946_66e-3,
        -2.840_851_6e-2,
        4.461_993_6e-2,
        -4.678_601_8e-2,
        2.326_198_1e-2,
        4.376_080_3e-2,
        -0.172_393_6,
        0.382_283_84,
        0.305_953,
    ];
}

/// `e^x` in `f32`, branch-free so loops over it vectorise: Cody-Waite
/// reduction `x = n ln2 + r`, Cephes' degree-5 polynomial for `e^r`
/// (about 1 ulp), and `2^n` built from exponent bits in two halves.
/// Results below `f32::MIN_POSITIVE` flush to zero (x < -87.34); above
/// the largest finite value they are infinite; NaN stays NaN. The
/// reduction and the polynomial are fused multiply-adds: one instruction
/// each in the kernels compiled for AVX2 and AVX-512 (`simd::widest!`),
/// whose callers on the hot paths are (1.8x faster there than separate
/// multiplies and adds); elsewhere the C library's `fmaf`, which rounds
/// the same way, so the bits do not depend on the CPU.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    use exp_constants::{HIGH, LN2_HI, LN2_LO, LOG2E, LOW, P, ROUND};
    let xc = x.clamp(LOW, HIGH);
    // Adding ROUND leaves n in the low mantissa bits: no float-to-int conversion.
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let y = (horner(&P, r) * r).mul_add(r, r) + 1.0;
    let k = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let half = k >> 1;
    let scale_a = f32::from_bits(((half + 127) as u32) << 23);
    let scale_b = f32::from_bits(((k - half + 127) as u32) << 23);
    let e = y * scale_a * scale_b;
    let e = if x > HIGH { f32::INFINITY } else { e };
    let e = if x < LOW { 0.0 } else { e };
    if x.is_nan() {
        x
    } else {
        e
    }
}

/// `erf(x)` in `f32`, branch-free so loops over it (GELU) vectorise. Both
/// pieces are computed and one is selected: for `|x| < 1`, `x A(x²)`; above,
/// `1 − e^{−x²} B(1/|x| − 0.625)` with the sign restored (`|x|` clamped to
/// 4, past which erf rounds to ±1). `A` (degree 6) and `B` (degree 9) are
/// minimax fits of `erf(x)/x` and `erfc(x) e^{x²}` made for this function
/// by `tools/fit_erf.py` (relative error 1.2e-9 and 1.5e-8; `A`'s constant
/// term is 2/√π itself); evaluated in f32 the result is within 2.4 ulp of
/// the exact erf. NaN stays NaN. The polynomials are fused multiply-adds,
/// as in [`exp_f32`].
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    use erf_constants::{A, B};
    let ax = x.abs();
    let s = x * x;
    let small = x * horner(&A, s);
    let t = ax.clamp(1.0, 4.0);
    let w = 1.0 / t - 0.625;
    let large = (-exp_f32(-(t * t))).mul_add(horner(&B, w), 1.0).copysign(x);
    if ax < 1.0 || x.is_nan() {
        small
    } else {
        large
    }
}

/// `tanh(x)` in `f32`, branch-free so loops over it (GPT-2's GELU)
/// vectorise, where the C library's `tanhf` runs one value at a time. Both
/// pieces are computed and one is selected: for `|x| < 0.625`,
/// `x + x^3 U(x^2)`; above, `1 - 2 / (e^{2|x|} + 1)` with the sign
/// restored (`|x|` clamped to 10; tanh rounds to ±1 from 9.02 on). `U`
/// (degree 5, relative error 4.8e-9) is a minimax fit made for this
/// function by `tools/fit_tanh.py`; evaluated in f32 the result is within
/// 2 ulp of the exact tanh (1.12 measured). NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    const U: [f32; 6] = [2.292_894e-3, -8.344_098e-3, 2.176_897_4e-2, -5.395_927e-2, 0.133_333_04, -0.333_333_34];
    let ax = x.abs();
    let s = x * x;
    let small = (ax * s).mul_add(horner(&U, s), ax).copysign(x);
    let e = exp_f32(2.0 * ax.min(10.0));
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if ax < 0.625 || x.is_nan() {
        small
    } else {
        large
    }
}

#[cfg(test)]
mod tests {
    use super::{erf_f32, exp_f32, tanh_f32};

    /// Casts long enough to run on two threads convert every element as
    /// the scalar conversions do, both ways (odd length: unequal halves).
    #[test]
    fn long_casts_match_the_elementwise_conversions() {
        use super::{bf16_from_f32, bf16_to_f32, cast};
        use crate::kernels::split::SPLIT_ELEMENTWISE_FROM;
        use crate::storage::HostData;
        use half::bf16;
        let len = SPLIT_ELEMENTWISE_FROM * 2 + 3;
        let mut u = vec![0f32; len];
        crate::random::uniform_f32(9, 0, &mut u);
        let values: Vec<f32> = u.iter().enumerate().map(|(i, &x)| (x - 0.5) * (1u64 << (i % 40)) as f32).collect();
        let mut narrow = HostData::BF16(vec![bf16::ZERO; len]);
        cast(&HostData::F32(values.clone()), &mut narrow);
        let HostData::BF16(narrow_values) = &narrow else { unreachable!("a bf16 buffer") };
        assert!(narrow_values.iter().zip(&values).all(|(n, &v)| n.to_bits() == bf16_from_f32(v).to_bits()));
        let mut wide = HostData::F32(vec![0.0; len]);
        cast(&narrow, &mut wide);
        let HostData::F32(wide_values) = &wide else { unreachable!("an f32 buffer") };
        assert!(wide_values.iter().zip(narrow_values).all(|(w, &n)| w.to_bits() == bf16_to_f32(n).to_bits()));
    }

    #[test]
    fn exp_f32_is_within_two_ulp_of_the_f64_exp() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x < 88.7 {
            let exact = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - exact) / exact).abs());
            x += 0.000_37;
        }
        assert!(worst < 2.0 * f32::EPSILON as f64, "max relative error {worst} (2 ulp allowed)");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(1.0), std::f32::consts::E);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1e4), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72).is_finite() && exp_f32(88.72) > 3.3e38);
    }

    /// `tanh_f32` agrees with the f64 tanh to within 2 ulp over [-10, 10],
    /// keeps tiny values and signed zeros, saturates to ±1 and keeps NaN.
    #[test]
    fn tanh_f32_is_within_two_ulp_of_the_f64_tanh() {
        let mut worst = 0f64;
        let mut x = -10.0f32;
        while x < 10.0 {
            let exact = f64::from(x).tanh();
            let ulp = f64::from(f32::EPSILON) * (exact as f32).abs().max(f32::MIN_POSITIVE) as f64;
            worst = worst.max((f64::from(tanh_f32(x)) - exact).abs() / ulp);
            x += 0.000_097;
        }
        assert!(worst < 2.0, "max error {worst} ulp (2 allowed)");
        for tiny in [1e-3f32, 1e-8, 1e-30, -2e-38] {
            let exact = f64::from(tiny).tanh();
            assert!((f64::from(tanh_f32(tiny)) - exact).abs() <= exact.abs() * f64::from(f32::EPSILON), "{tiny}");
        }
        assert_eq!(tanh_f32(0.0).to_bits(), 0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(tanh_f32(9.5), 1.0);
        assert_eq!(tanh_f32(-50.0), -1.0);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn erf_f32_is_within_three_ulp_of_the_f64_erf() {
        let mut worst = 0f64;
        let mut x = -5.0f32;
        while x < 5.0 {
            let exact = libm::erf(f64::from(x));
            let ulp = f64::from(f32::EPSILON) * (exact as f32).abs().max(f32::MIN_POSITIVE) as f64;
            worst = worst.max((f64::from(erf_f32(x)) - exact).abs() / ulp);
            x += 0.000_113;
        }
        assert!(worst < 3.0, "max error {worst} ulp (3 allowed)");
        for tiny in [1e-3f32, 1e-8, 1e-30] {
            let exact = libm::erf(f64::from(tiny));
            assert!((f64::from(erf_f32(tiny)) - exact).abs() <= 3.0 * exact * f64::from(f32::EPSILON), "{tiny}");
        }
        assert_eq!(erf_f32(0.0), 0.0);
        assert_eq!(erf_f32(4.0), 1.0);
        assert_eq!(erf_f32(-7.5), -1.0);
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
    }
}

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
impl_float_like!(bf16, f32, bf16_to_f32, bf16_from_f32);

/// `bf16::from_f32` (round to nearest even; a NaN stays NaN with its quiet
/// bit set) without branches, so loops over it vectorise.
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> bf16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((bits >> 16) as u16) | 0x0040;
    bf16::from_bits(if bits & 0x7FFF_FFFF > 0x7F80_0000 { quiet_nan } else { rounded })
}

/// `bf16::to_f32` (exact; a NaN gets its quiet bit set) without branches.
#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    let bits = x.to_bits();
    let wide = u32::from(bits) << 16;
    f32::from_bits(if bits & 0x7FFF > 0x7F80 { wide | 0x0040_0000 } else { wide })
}
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
    if let HostData::F32(o) = out {
        o.fill(value.as_f64() as f32);
        return;
    }
    match (value, out.dtype()) {
        (Literal::Int(v), dtype) if !dtype.is_float() => fill_from_i64(out, std::iter::repeat_n(v, len)),
        (v, _) => fill_from_f64(out, std::iter::repeat_n(v.as_f64(), len)),
    }
}

/// `o[i] = f(a[i])` for the casts between f32 and the 16-bit floats: in
/// parts on the pool's threads for large inputs (a weight cast to bf16
/// under autocast), each compiled for the widest vector extension this CPU
/// has (the same bits).
fn convert<A: Copy + Sync, B: Send>(a: &[A], o: &mut [B], f: impl Fn(A) -> B + Sync) {
    super::split::zip_in_parts(a, o, rayon::current_num_threads(), |a, o| convert_range(a, o, &f));
}

/// [`convert`] on one thread.
fn convert_range<A: Copy, B>(a: &[A], o: &mut [B], f: &impl Fn(A) -> B) {
    super::simd::widest!(convert_lanes(a, o, f))
}

/// The loop [`convert_range`] compiles for each vector extension.
#[inline(always)]
fn convert_lanes<A: Copy, B>(a: &[A], o: &mut [B], f: &impl Fn(A) -> B) {
    a.iter().zip(o).for_each(|(a, o)| *o = f(*a));
}

/// Convert `x` into `out`'s dtype, element by element.
pub(crate) fn cast(x: &HostData, out: &mut HostData) {
    if x.dtype().is_float() && out.dtype() == DType::Bool {
        fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i)));
    } else if x.dtype().is_float() {
        match (x, out) {
            (HostData::F32(a), HostData::BF16(o)) => convert(a, o, bf16_from_f32),
            (HostData::F32(a), HostData::F16(o)) => convert(a, o, f16::from_f32),
            (HostData::BF16(a), HostData::F32(o)) => convert(a, o, bf16_to_f32),
            (HostData::F16(a), HostData::F32(o)) => convert(a, o, f16::to_f32),
            (x, out) => fill_from_f64(out, (0..x.len()).map(|i| x.get_f64(i))),
        }
    } else {
        fill_from_i64(out, to_i64_vec(x).into_iter());
    }
}
