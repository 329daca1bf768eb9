//! Which SIMD extensions the kernels compiled for several instruction sets
//! (`#[target_feature]` copies of the same loop) may use on this CPU,
//! detected once.

#[cfg(target_arch = "x86_64")]
use std::sync::LazyLock;

/// AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    static AVAILABLE: LazyLock<bool> =
        LazyLock::new(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"));
    *AVAILABLE
}

/// AVX-512 F, VL, BW and DQ (with AVX2 and FMA): twice AVX2's lanes for
/// the polynomial ops (exp, erf) and the reductions.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    static AVAILABLE: LazyLock<bool> = LazyLock::new(|| {
        avx2()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
    });
    *AVAILABLE
}

/// Compile `$body` (a call of a generic inline function) also for AVX2 and
/// AVX-512 and run the widest copy this CPU supports: the same arithmetic
/// in every copy, so the same bits. The closures are inlined by force: a
/// large body left out of line would be compiled without the features
/// (seen with the fused-kernel interpreter, which then ran 40 % slower).
macro_rules! widest {
    ($body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
            unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            if $crate::kernels::simd::avx512() {
                // SAFETY: the features were detected on this CPU.
                unsafe {
                    avx512(
                        #[inline(always)]
                        || $body,
                    )
                }
            } else if $crate::kernels::simd::avx2() {
                // SAFETY: as above.
                unsafe {
                    avx2(
                        #[inline(always)]
                        || $body,
                    )
                }
            } else {
                $body
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $body
        }
    }};
}
pub(crate) use widest;

/// Ask the CPU to start loading the `len` values from `first` into its
/// caches (a hint: never faults, even past the end of a buffer). For reads
/// the hardware prefetchers do not run ahead of: short runs far apart, or
/// a stream read in bursts between passes of arithmetic.
#[inline(always)]
pub(crate) fn prefetch<T>(first: *const T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<T, { std::arch::x86_64::_MM_HINT_T0 }>(first, len);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (first, len);
}

/// How far ahead of its reads a streaming loop asks for its data
/// ([`prefetch_ahead`]).
const STREAM_AHEAD_BYTES: usize = 2048;

/// [`prefetch`] of the `len` values a loop streaming through `first` from
/// element `at` reads [`STREAM_AHEAD_BYTES`] later. On the AMX Xeon the
/// hardware prefetchers alone left a GELU-gradient loop over BERT-mini's
/// `[4096, 1024]` product waiting on its loads for 58 % of its samples
/// (`perf annotate`); asking ahead took each call, product and epilogue,
/// from 12.2 to 8.3 ms, and BERT-mini's lane programs 11 % less time.
/// Distances of 512 B to 4 KiB gave the same time.
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(first: *const T, at: usize, len: usize) {
    prefetch(first.wrapping_add(at + STREAM_AHEAD_BYTES / std::mem::size_of::<T>().max(1)), len);
}

/// [`prefetch`] into the L2 cache only (not L1): for the next of many
/// blocks of work, while the current one still uses the L1 cache.
#[inline(always)]
pub(crate) fn prefetch_l2<T>(first: *const T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<T, { std::arch::x86_64::_MM_HINT_T1 }>(first, len);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (first, len);
}

/// A prefetch with hint `HINT` of every cache line of the `len` values from `first`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<T, const HINT: i32>(first: *const T, len: usize) {
    let line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    for k in (0..len).step_by(line) {
        // SAFETY: a prefetch is only a hint and never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(first.wrapping_add(k).cast()) };
    }
}

/// The 16 x 16 block of 32-bit words in `rows`, transposed: word `i` of
/// output `j` is word `j` of row `i` (pairs of rows interleaved, then pairs
/// of pairs, then 128-bit lanes gathered in two rounds).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose16(rows: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    // Lane L of `pairs[2i]` holds words 4L, 4L + 1 of rows 2i, 2i + 1
    // interleaved; of `pairs[2i + 1]`, words 4L + 2, 4L + 3.
    let pairs: [__m512i; 16] = std::array::from_fn(|t| {
        let (a, b) = (rows[t & !1], rows[t | 1]);
        match t % 2 {
            0 => _mm512_unpacklo_epi32(a, b),
            _ => _mm512_unpackhi_epi32(a, b),
        }
    });
    // Lane L of `quads[4g + e]` holds word 4L + e of rows 4g..4g + 4.
    let quads: [__m512i; 16] = std::array::from_fn(|u| {
        let (g, e) = (u / 4, u % 4);
        let (a, b) = (pairs[4 * g + e / 2], pairs[4 * g + 2 + e / 2]);
        match e % 2 {
            0 => _mm512_unpacklo_epi64(a, b),
            _ => _mm512_unpackhi_epi64(a, b),
        }
    });
    // Output `4L + e` gathers lane L of `quads[e]`, `quads[4 + e]`,
    // `quads[8 + e]` and `quads[12 + e]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for e in 0..4 {
        let even_lanes_low = _mm512_shuffle_i32x4::<0x88>(quads[e], quads[4 + e]);
        let odd_lanes_low = _mm512_shuffle_i32x4::<0xDD>(quads[e], quads[4 + e]);
        let even_lanes_high = _mm512_shuffle_i32x4::<0x88>(quads[8 + e], quads[12 + e]);
        let odd_lanes_high = _mm512_shuffle_i32x4::<0xDD>(quads[8 + e], quads[12 + e]);
        out[e] = _mm512_shuffle_i32x4::<0x88>(even_lanes_low, even_lanes_high);
        out[8 + e] = _mm512_shuffle_i32x4::<0xDD>(even_lanes_low, even_lanes_high);
        out[4 + e] = _mm512_shuffle_i32x4::<0x88>(odd_lanes_low, odd_lanes_high);
        out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(odd_lanes_low, odd_lanes_high);
    }
    out
}

/// Write the `rows x cols` matrix of 32-bit words whose column `j` is the
/// `rows` contiguous words from `src + j * src_stride` into `dst`
/// row-major, row `i` from `dst + i * dst_stride`: 16 x 16 blocks through
/// registers ([`transpose16`]), each read a cache line down each of 16
/// columns and written a cache line along each of 16 rows; the edges
/// word by word.
///
/// # Safety
/// AVX-512 F is present; the words read and written lie inside live
/// buffers that do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_words(
    (src, src_stride): (*const u32, usize),
    (dst, dst_stride): (*mut u32, usize),
    (rows, cols): (usize, usize),
) {
    use std::arch::x86_64::*;
    let (full_rows, full_cols) = (rows / 16 * 16, cols / 16 * 16);
    for j in (0..full_cols).step_by(16) {
        for i in (0..full_rows).step_by(16) {
            let columns: [__m512i; 16] =
                std::array::from_fn(|c| _mm512_loadu_si512(src.add((j + c) * src_stride + i) as *const _));
            for (r, row) in transpose16(columns).iter().enumerate() {
                _mm512_storeu_si512(dst.add((i + r) * dst_stride + j) as *mut _, *row);
            }
        }
    }
    let word = |i: usize, j: usize| src.add(j * src_stride + i).read();
    for j in 0..cols {
        let below = if j < full_cols { full_rows } else { 0 };
        for i in below..rows {
            dst.add(i * dst_stride + j).write(word(i, j));
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    /// Every word lands at its transposed place, in whole 16 x 16 blocks
    /// and at the edges, with strides longer than the matrix.
    #[test]
    fn transpose_words_moves_every_word_to_its_transposed_place() {
        if !super::avx512() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for (rows, cols, src_stride, dst_stride) in [(32, 48, 40, 50), (37, 21, 37, 21), (5, 3, 9, 4), (16, 16, 16, 16)]
        {
            let src: Vec<u32> = (0..cols * src_stride).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
            let mut dst = vec![u32::MAX; rows * dst_stride];
            // SAFETY: the test has AVX-512; both buffers hold the words addressed.
            unsafe { super::transpose_words((src.as_ptr(), src_stride), (dst.as_mut_ptr(), dst_stride), (rows, cols)) };
            for i in 0..rows {
                for j in 0..dst_stride {
                    let want = if j < cols { src[j * src_stride + i] } else { u32::MAX };
                    assert_eq!(dst[i * dst_stride + j], want, "{rows} x {cols}: ({i}, {j})");
                }
            }
        }
    }
}
