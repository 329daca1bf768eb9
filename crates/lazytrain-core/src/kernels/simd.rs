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
    {
        let line = (64 / std::mem::size_of::<T>().max(1)).max(1);
        for k in (0..len).step_by(line) {
            // SAFETY: a prefetch is only a hint and never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(first.wrapping_add(k).cast())
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (first, len);
}
