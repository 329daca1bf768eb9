//! The `gemm` crate call every f32/f64 product goes through (the plain
//! batched products and the widened bf16/f16 ones), and how many threads a
//! product of a given size gets.

use super::numeric::Real;

/// A matrix operand for [`gemm_into`]: its first element and its
/// `(row stride, column stride)` in elements.
pub(crate) struct GemmOperand<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

/// `out = a x b` for an `m x k` and a `k x n` matrix through `gemm`, `out`
/// row-major `m x n` (overwritten, not read).
///
/// # Safety
/// `a` and `b` address every element of their matrices inside live
/// buffers, `out` holds `m * n` elements, and `out` aliases neither.
pub(crate) unsafe fn gemm_into<T: Real + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    debug_assert!(out.len() >= m * n);
    gemm::gemm(
        m,
        n,
        k,
        out.as_mut_ptr(),
        1,
        n as isize,
        false,
        a.ptr,
        a.cs as isize,
        a.rs as isize,
        b.ptr,
        b.cs as isize,
        b.rs as isize,
        T::ZERO,
        T::ONE,
        false,
        false,
        false,
        parallelism,
    );
}

/// Threads for one matmul: every thread of the current pool (all cores, or a
/// replica's share) for large products, one for small ones (where starting
/// threads costs more than it saves).
pub(crate) fn matmul_parallelism(flops: usize) -> gemm::Parallelism {
    gemm_parallelism(flops, rayon::current_num_threads())
}

/// [`matmul_parallelism`] with at most `threads` threads.
pub(crate) fn gemm_parallelism(flops: usize, threads: usize) -> gemm::Parallelism {
    if threads > 1 && flops >= 1 << 21 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}
