//! Which SIMD extensions the kernels compiled for several instruction sets
//! (`#[target_feature]` copies of the same loop) may use on this CPU,
//! detected once.

use std::sync::LazyLock;

/// AVX2 with FMA.
pub(crate) fn avx2() -> bool {
    static AVAILABLE: LazyLock<bool> =
        LazyLock::new(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"));
    *AVAILABLE
}

/// AVX-512 F, VL, BW and DQ (with AVX2 and FMA): twice AVX2's lanes for
/// the polynomial ops (exp, erf) and the reductions.
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
