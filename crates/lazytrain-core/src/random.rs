//! Counter-based random numbers: Philox-4x32 with 10 rounds (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//!
//! Element `i` of a draw depends only on `(seed, stream, i)`, so masks are
//! reproducible, independent of thread count, and need no state between steps.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox-4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    // SAFETY: `u32`'s lane operations are plain integer arithmetic.
    unsafe { rounds(counter, key) }
}

/// The lane operations Philox's rounds need, for one block per lane: a
/// `u32` (one block) or a vector of them (a block per 32-bit lane).
trait PhiloxLanes: Copy {
    /// `x` in every lane.
    ///
    /// # Safety
    /// The CPU has the instructions of `Self`'s vectors.
    unsafe fn splat(x: u32) -> Self;
    /// Lane-wise exclusive or.
    ///
    /// # Safety
    /// As for [`PhiloxLanes::splat`].
    unsafe fn xor(self, other: Self) -> Self;
    /// The 64-bit products of the lanes with those of `m`, split into their
    /// high and low 32-bit halves, lane for lane.
    ///
    /// # Safety
    /// As for [`PhiloxLanes::splat`].
    unsafe fn mul_hi_lo(self, m: Self) -> (Self, Self);
}

impl PhiloxLanes for u32 {
    #[inline(always)]
    unsafe fn splat(x: u32) -> u32 {
        x
    }

    #[inline(always)]
    unsafe fn xor(self, other: u32) -> u32 {
        self ^ other
    }

    #[inline(always)]
    unsafe fn mul_hi_lo(self, m: u32) -> (u32, u32) {
        let p = (m as u64) * (self as u64);
        ((p >> 32) as u32, p as u32)
    }
}

/// Philox-4x32's ten rounds on the counter words `c` (a block per lane)
/// with `key`: the one definition the scalar and vector versions share.
///
/// # Safety
/// As for [`PhiloxLanes::splat`].
#[inline(always)]
unsafe fn rounds<V: PhiloxLanes>(mut c: [V; 4], key: [u32; 2]) -> [V; 4] {
    let (m0, m1) = (V::splat(M0), V::splat(M1));
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = c[0].mul_hi_lo(m0);
        let (hi1, lo1) = c[2].mul_hi_lo(m1);
        c = [hi1.xor(c[1]).xor(V::splat(k[0])), lo1, hi0.xor(c[3]).xor(V::splat(k[1])), lo0];
    }
    c
}

/// Fill `out` with uniform floats in `[0, 1)`: element `i` uses word `i % 4`
/// of the block with counter `(i / 4, stream)`, keyed by `seed`.
pub fn uniform_f32(seed: u64, stream: u64, out: &mut [f32]) {
    uniform_f32_from(seed, stream, 0, out);
}

/// Elements `first..first + out.len()` of the draw [`uniform_f32`] makes,
/// so a draw can be split between threads or computed tile by tile.
/// (Never inlined: compiled for AVX2, as it would be inside the fused
/// kernels, the rounds vectorise into code three times slower.)
#[inline(never)]
pub fn uniform_f32_from(seed: u64, stream: u64, first: usize, out: &mut [f32]) {
    let key = [seed as u32, (seed >> 32) as u32];
    let block = |b: usize| {
        let b = b as u64;
        philox4x32_10([b as u32, (b >> 32) as u32, stream as u32, (stream >> 32) as u32], key)
    };
    // A start inside a block takes that block's remaining words first.
    let skip = first % 4;
    let lead = ((4 - skip) % 4).min(out.len());
    let (head, rest) = out.split_at_mut(lead);
    if lead > 0 {
        head.iter_mut().zip(&block(first / 4)[skip..]).for_each(|(o, &w)| *o = unit_float(w));
    }
    let mut b = first.div_ceil(4);
    #[cfg(target_arch = "x86_64")]
    let rest = {
        let wide512 = crate::kernels::simd::avx512();
        let outputs = if wide512 { avx512::OUTPUTS } else { avx2::OUTPUTS };
        let wide = rest.len() / outputs * outputs;
        let fits = (b as u64).checked_add((wide / 4) as u64).is_some_and(|end| end <= 1 << 32);
        if wide > 0 && fits && (wide512 || std::is_x86_feature_detected!("avx2")) {
            let (wide, narrow) = rest.split_at_mut(wide);
            match wide512 {
                // SAFETY: AVX-512 was detected on this CPU.
                true => unsafe { avx512::uniform_blocks(key, stream, b as u32, wide) },
                // SAFETY: AVX2 was just detected on this CPU.
                false => unsafe { avx2::uniform_blocks(key, stream, b as u32, wide) },
            }
            b += wide.len() / 4;
            narrow
        } else {
            rest
        }
    };
    let mut whole = rest.chunks_exact_mut(4);
    for chunk in &mut whole {
        let words = block(b);
        for w in 0..4 {
            chunk[w] = unit_float(words[w]);
        }
        b += 1;
    }
    let tail = whole.into_remainder();
    tail.iter_mut().zip(block(b)).for_each(|(o, w)| *o = unit_float(w));
}

/// The float of a Philox word: its top 24 bits over 2^24.
#[inline(always)]
fn unit_float(w: u32) -> f32 {
    // Below 2^24, so the signed conversion (one instruction) is exact.
    ((w >> 8) as i32) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Philox-4x32-10 on eight blocks at once in AVX2 lanes: the same words
/// as [`philox4x32_10`], about three times faster than the scalar rounds.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{rounds, PhiloxLanes};
    use std::arch::x86_64::*;

    /// Outputs one iteration makes: eight blocks of four words.
    pub(super) const OUTPUTS: usize = 32;

    impl PhiloxLanes for __m256i {
        #[inline(always)]
        unsafe fn splat(x: u32) -> __m256i {
            _mm256_set1_epi32(x as i32)
        }

        #[inline(always)]
        unsafe fn xor(self, other: __m256i) -> __m256i {
            _mm256_xor_si256(self, other)
        }

        #[inline(always)]
        unsafe fn mul_hi_lo(self, m: __m256i) -> (__m256i, __m256i) {
            let even = _mm256_mul_epu32(self, m);
            let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(self), m);
            let hi = _mm256_blend_epi32::<0b1010_1010>(_mm256_srli_epi64::<32>(even), odd);
            let lo = _mm256_blend_epi32::<0b1010_1010>(even, _mm256_slli_epi64::<32>(odd));
            (hi, lo)
        }
    }

    /// The unit floats of eight words (see `unit_float`).
    #[inline(always)]
    unsafe fn unit_floats(w: __m256i) -> __m256 {
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<8>(w)), _mm256_set1_ps(1.0 / (1u32 << 24) as f32))
    }

    /// Fill `out` (a multiple of [`OUTPUTS`] long) with the unit floats of
    /// blocks `first_block..`, whose indices stay below 2^32.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn uniform_blocks(key: [u32; 2], stream: u64, first_block: u32, out: &mut [f32]) {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let (s0, s1) = (__m256i::splat(stream as u32), __m256i::splat((stream >> 32) as u32));
        for (i, chunk) in out.chunks_exact_mut(OUTPUTS).enumerate() {
            let base = first_block.wrapping_add((i * 8) as u32);
            let c = rounds([_mm256_add_epi32(__m256i::splat(base), lanes), _mm256_setzero_si256(), s0, s1], key);
            // Lane j of word w belongs at output 4 j + w: transpose 4 x 8.
            let t0 = _mm256_unpacklo_epi32(c[0], c[1]);
            let t1 = _mm256_unpackhi_epi32(c[0], c[1]);
            let t2 = _mm256_unpacklo_epi32(c[2], c[3]);
            let t3 = _mm256_unpackhi_epi32(c[2], c[3]);
            let (u0, u1) = (_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2));
            let (u2, u3) = (_mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3));
            let blocks = [
                _mm256_permute2x128_si256::<0x20>(u0, u1),
                _mm256_permute2x128_si256::<0x20>(u2, u3),
                _mm256_permute2x128_si256::<0x31>(u0, u1),
                _mm256_permute2x128_si256::<0x31>(u2, u3),
            ];
            for (q, words) in blocks.into_iter().enumerate() {
                _mm256_storeu_ps(chunk.as_mut_ptr().add(8 * q), unit_floats(words));
            }
        }
    }
}

/// Philox-4x32-10 on sixteen blocks at once in AVX-512 lanes: the same
/// words as [`philox4x32_10`] and the AVX2 version, twice its blocks per
/// instruction.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{rounds, PhiloxLanes};
    use std::arch::x86_64::*;

    /// Outputs one iteration makes: sixteen blocks of four words.
    pub(super) const OUTPUTS: usize = 64;

    impl PhiloxLanes for __m512i {
        #[inline(always)]
        unsafe fn splat(x: u32) -> __m512i {
            _mm512_set1_epi32(x as i32)
        }

        #[inline(always)]
        unsafe fn xor(self, other: __m512i) -> __m512i {
            _mm512_xor_si512(self, other)
        }

        #[inline(always)]
        unsafe fn mul_hi_lo(self, m: __m512i) -> (__m512i, __m512i) {
            let even = _mm512_mul_epu32(self, m);
            let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(self), m);
            const ODD_LANES: __mmask16 = 0b1010_1010_1010_1010;
            let hi = _mm512_mask_blend_epi32(ODD_LANES, _mm512_srli_epi64::<32>(even), odd);
            let lo = _mm512_mask_blend_epi32(ODD_LANES, even, _mm512_slli_epi64::<32>(odd));
            (hi, lo)
        }
    }

    /// The unit floats of sixteen words (see `unit_float`).
    #[inline(always)]
    unsafe fn unit_floats(w: __m512i) -> __m512 {
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32::<8>(w)), _mm512_set1_ps(1.0 / (1u32 << 24) as f32))
    }

    /// Fill `out` (a multiple of [`OUTPUTS`] long) with the unit floats of
    /// blocks `first_block..`, whose indices stay below 2^32.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn uniform_blocks(key: [u32; 2], stream: u64, first_block: u32, out: &mut [f32]) {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let (s0, s1) = (__m512i::splat(stream as u32), __m512i::splat((stream >> 32) as u32));
        for (i, chunk) in out.chunks_exact_mut(OUTPUTS).enumerate() {
            let base = first_block.wrapping_add((i * 16) as u32);
            let c = rounds([_mm512_add_epi32(__m512i::splat(base), lanes), _mm512_setzero_si512(), s0, s1], key);
            // Lane j of word w belongs at output 4 j + w: within each
            // 128-bit lane L, blocks 4L..4L+3 come out of the unpacks in
            // u0..u3; the shuffles then gather the lanes of consecutive blocks.
            let t0 = _mm512_unpacklo_epi32(c[0], c[1]);
            let t1 = _mm512_unpackhi_epi32(c[0], c[1]);
            let t2 = _mm512_unpacklo_epi32(c[2], c[3]);
            let t3 = _mm512_unpackhi_epi32(c[2], c[3]);
            let (u0, u1) = (_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2));
            let (u2, u3) = (_mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3));
            let low01 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u0, u1);
            let low23 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u2, u3);
            let high01 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u0, u1);
            let high23 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u2, u3);
            let blocks = [
                _mm512_shuffle_i32x4::<0b10_00_10_00>(low01, low23),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(low01, low23),
                _mm512_shuffle_i32x4::<0b10_00_10_00>(high01, high23),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(high01, high23),
            ];
            for (q, words) in blocks.into_iter().enumerate() {
                _mm512_storeu_ps(chunk.as_mut_ptr().add(16 * q), unit_floats(words));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors from Random123's kat_vectors file (philox4x32 10).
    #[test]
    fn philox_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// The vectorised rounds (AVX2 and AVX-512) give the scalar rounds'
    /// words, block for block, including blocks whose index needs the
    /// counter's high word.
    #[test]
    fn vectorised_draws_equal_the_scalar_blocks() {
        for (seed, stream, first) in [(0x9abc_def0_1234_5678u64, 3u64, 0usize), (7, 1 << 40, 1_000_001), (0, 0, 5)] {
            let mut fast = vec![0f32; 4_000];
            uniform_f32_from(seed, stream, first, &mut fast);
            let key = [seed as u32, (seed >> 32) as u32];
            for (i, &x) in fast.iter().enumerate() {
                let e = (first + i) as u64;
                let words =
                    philox4x32_10([(e / 4) as u32, ((e / 4) >> 32) as u32, stream as u32, (stream >> 32) as u32], key);
                assert_eq!(x.to_bits(), unit_float(words[(e % 4) as usize]).to_bits(), "element {e}");
            }
        }
        // Each vector version this CPU has, called directly (the draw above
        // takes the widest).
        #[cfg(target_arch = "x86_64")]
        {
            let (key, stream, first_block) = ([0x1234_5678, 0x9abc_def0], 5u64 << 33, 1_000_003u32);
            let expected: Vec<u32> = (0..128u32)
                .flat_map(|b| philox4x32_10([first_block + b, 0, stream as u32, (stream >> 32) as u32], key))
                .collect();
            let check = |name: &str, out: &[f32]| {
                for (i, (&x, &w)) in out.iter().zip(&expected).enumerate() {
                    assert_eq!(x.to_bits(), unit_float(w).to_bits(), "{name}: element {i}");
                }
            };
            let mut out = vec![0f32; 512];
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was detected.
                unsafe { avx2::uniform_blocks(key, stream, first_block, &mut out) };
                check("avx2", &out);
            }
            if crate::kernels::simd::avx512() {
                // SAFETY: AVX-512 was detected.
                unsafe { avx512::uniform_blocks(key, stream, first_block, &mut out) };
                check("avx512", &out);
            }
        }
        // Near 2^32 blocks the counter's high word changes: the scalar path.
        let first = ((1u64 << 32) - 3) as usize * 4;
        let mut near = vec![0f32; 64];
        uniform_f32_from(1, 2, first, &mut near);
        let words = philox4x32_10([0, 1, 2, 0], [1, 0]);
        assert_eq!(near[12].to_bits(), unit_float(words[0]).to_bits());
    }

    #[test]
    fn uniform_is_in_range_and_mean_half() {
        let mut v = vec![0f32; 10_000];
        uniform_f32(7, 0, &mut v);
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let mut w = vec![0f32; 10_000];
        uniform_f32(7, 1, &mut w);
        assert_ne!(v, w);
        let mut tail = vec![0f32; 6_000];
        uniform_f32_from(7, 0, 4_000, &mut tail);
        assert_eq!(tail, v[4_000..], "a split draw equals the whole one");
        for (start, len) in [(4_001, 3), (4_002, 7), (3, 1), (9_995, 5), (1, 77), (36, 64), (5, 4_003), (64, 1_024)] {
            let mut part = vec![0f32; len];
            uniform_f32_from(7, 0, start, &mut part);
            assert_eq!(part, v[start..start + len], "a draw from element {start}");
        }
    }
}
