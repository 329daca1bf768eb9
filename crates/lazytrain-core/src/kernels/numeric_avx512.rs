//! [`exp_f32`](super::numeric::exp_f32) and
//! [`erf_f32`](super::numeric::erf_f32) on 16 lanes of AVX-512, written
//! with the instructions the scalar versions leave to the compiler's
//! vectoriser but the one the scalar code has no word for: the final
//! `y · 2ⁿ` is one `vscalefps` instead of building two powers of two from
//! exponent bits and multiplying by both. Scaling by a power of two is
//! exact wherever the result is a normal float, which is everywhere the
//! clamped `exp` does not return its special values, so every lane holds
//! the scalar version's bits (tests below, over a sweep of all floats).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `e^x` in each lane, the bits of [`super::numeric::exp_f32`].
///
/// # Safety
/// The CPU has AVX-512 F (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
    use super::numeric::exp_constants::{HIGH, LOW};
    let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LOW)), _mm512_set1_ps(HIGH));
    let e = exp16_clamped(xc);
    let e = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(HIGH)),
        e,
        _mm512_set1_ps(f32::INFINITY),
    );
    let e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(LOW)), e, _mm512_setzero_ps());
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), e, x)
}

/// `e^x` for lanes already within `exp_f32`'s clamp (`-87.34 ≤ x ≤
/// 88.72`, no NaN): the scalar version's reduction and polynomial.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp16_clamped(xc: __m512) -> __m512 {
    use super::numeric::exp_constants::{LN2_HI, LN2_LO, LOG2E, P, ROUND};
    let round = _mm512_set1_ps(ROUND);
    let t = _mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2E), round);
    let n = _mm512_sub_ps(t, round);
    // fma(-n, c, v) is fnmadd(n, c, v): the negation is exact.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc));
    let p = horner16(&P, r);
    let y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0));
    _mm512_scalef_ps(y, n)
}

/// The polynomial with coefficients `c` (highest degree first) at `x`, by
/// Horner's rule in fused multiply-adds (as the scalar `horner`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn horner16(c: &[f32], x: __m512) -> __m512 {
    c[1..].iter().fold(_mm512_set1_ps(c[0]), |p, &c| _mm512_fmadd_ps(p, x, _mm512_set1_ps(c)))
}

/// `erf(x)` in each lane, the bits of [`super::numeric::erf_f32`] (whose
/// coefficients these are).
///
/// # Safety
/// The CPU has AVX-512 F and DQ (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn erf16(x: __m512) -> __m512 {
    use super::numeric::erf_constants::{A, B};
    let sign = _mm512_set1_ps(-0.0);
    let ax = _mm512_andnot_ps(sign, x);
    let small = _mm512_mul_ps(x, horner16(&A, _mm512_mul_ps(x, x)));
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_min_ps(_mm512_max_ps(ax, one), _mm512_set1_ps(4.0));
    let w = _mm512_sub_ps(_mm512_div_ps(one, t), _mm512_set1_ps(0.625));
    // -(t t) lies in [-16, -1]: inside exp's clamp, never NaN.
    let e = exp16_clamped(_mm512_xor_ps(_mm512_mul_ps(t, t), sign));
    let large = _mm512_fnmadd_ps(e, horner16(&B, w), one);
    let large = _mm512_or_ps(_mm512_andnot_ps(sign, large), _mm512_and_ps(sign, x));
    let pick_small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, one) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_blend_ps(pick_small, large, small)
}

/// The bf16 words of the lanes of `x`, each in the low half of its 32-bit
/// lane: [`super::numeric::bf16_from_f32`]'s integer arithmetic (round to
/// nearest even, NaNs quieted), so the same bits.
///
/// # Safety
/// The CPU has AVX-512 F (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bf16_words16(x: __m512) -> __m512i {
    let bits = _mm512_castps_si512(x);
    let high = _mm512_srli_epi32::<16>(bits);
    let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
    let magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
    let nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F80_0000));
    _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x0040)))
}

/// Each lane of `x` rounded to bf16 and widened back, the interpreter's
/// `RoundBf16` (`bf16_to_f32(bf16_from_f32(x))`, a quieted NaN keeping its
/// quiet bit).
///
/// # Safety
/// The CPU has AVX-512 F (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn round_bf16_16(x: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bf16_words16(x)))
}

/// `f(i, mask)` for each group of 16 lanes of `0..len`, `i` its first
/// index and `mask` the lanes below `len` (all of them but in a last part).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn each16(len: usize, mut f: impl FnMut(usize, __mmask16)) {
    // Whole groups under a constant mask (plain loads and stores once
    // inlined), then the part.
    let whole = len / 16 * 16;
    for i in (0..whole).step_by(16) {
        f(i, u16::MAX);
    }
    if whole < len {
        f(whole, (1u16 << (len - whole)) - 1);
    }
}

/// `out[i] = f(x[i])` for `i < len`, 16 lanes at a time (`x` and `out` may
/// be the same buffer: each group is read before it is written).
///
/// # Safety
/// The CPU has AVX-512 F, and `x` and `out` address `len` elements.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn map16(x: *const f32, out: *mut f32, len: usize, f: impl Fn(__m512) -> __m512) {
    each16(len, |i, m| _mm512_mask_storeu_ps(out.add(i), m, f(_mm512_maskz_loadu_ps(m, x.add(i)))));
}

/// `out[i] = exp_f32(x[i])` for `i < min(x.len(), out.len())`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn exp_slice(x: &[f32], out: &mut [f32]) {
    map16(x.as_ptr(), out.as_mut_ptr(), x.len().min(out.len()), |v| exp16(v))
}

/// `values[i] = exp_f32(values[i])`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn exp_in_place(values: &mut [f32]) {
    let p = values.as_mut_ptr();
    map16(p, p, values.len(), |v| exp16(v))
}

/// `out[i] = erf_f32(x[i])` for `i < min(x.len(), out.len())`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ (see [`super::simd::avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn erf_slice(x: &[f32], out: &mut [f32]) {
    map16(x.as_ptr(), out.as_mut_ptr(), x.len().min(out.len()), |v| erf16(v))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::numeric::{bf16_from_f32, bf16_to_f32, erf_f32, exp_f32};

    /// Every 65 537th float (all signs, exponents and NaN payload kinds)
    /// and the edges of the clamps.
    fn sweep() -> Vec<f32> {
        let mut values: Vec<f32> = (0..=u32::MAX).step_by(65_537).map(f32::from_bits).collect();
        values.extend([0.0, -0.0, 1.0, -1.0, 4.0, -4.0, 88.722_84, 88.722_85, 88.5, -87.336_55, -87.336_56, -103.0]);
        values.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX, f32::MIN]);
        // Dense runs where the results are ordinary: activations and logits.
        values.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 1.0e-3));
        values
    }

    /// Lanes of `vector` against `scalar` on every value of [`sweep`].
    fn same_bits(name: &str, vector: unsafe fn(__m512) -> __m512, scalar: fn(f32) -> f32) {
        let values = sweep();
        for chunk in values.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let mut out = [0f32; 16];
            // SAFETY: the caller checked for AVX-512.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), vector(_mm512_loadu_ps(lanes.as_ptr()))) };
            for (&x, &y) in chunk.iter().zip(&out) {
                let expected = scalar(x);
                let same = y.to_bits() == expected.to_bits() || (y.is_nan() && expected.is_nan());
                assert!(same, "{name}({x:e}) = {y:e}, the scalar version {expected:e}");
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn exp_lanes(x: __m512) -> __m512 {
        exp16(x)
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn erf_lanes(x: __m512) -> __m512 {
        erf16(x)
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn round_lanes(x: __m512) -> __m512 {
        round_bf16_16(x)
    }

    #[test]
    fn lanes_hold_the_scalar_bits() {
        if !crate::kernels::simd::avx512() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        same_bits("exp", exp_lanes, exp_f32);
        same_bits("erf", erf_lanes, erf_f32);
        same_bits("round to bf16", round_lanes, |x| bf16_to_f32(bf16_from_f32(x)));
    }
}
