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

/// A right operand stored transposed (`k` contiguous, as in a linear
/// layer's `x W^T`) is copied row-major first when `k` is at least this
/// long and the product has at least [`TRANSPOSE_RHS_FROM_M`] rows: `gemm`
/// packs such an operand slowly when `k` is long (BERT-base's feed-forward
/// output, `[1024, 3072] x [768, 3072]^T`: 15.9 ms against 11.0 ms with the
/// operand row-major on a 2-core Zen machine; no faster at `k` = 2048 and
/// the same at 1024), and the copy takes about 1.5 ms. The values are the
/// same bits: `gemm` packs either layout into the same panels.
const TRANSPOSE_RHS_FROM_K: usize = 3072;
/// See [`TRANSPOSE_RHS_FROM_K`]: the copy is paid once per call, the time
/// it saves grows with the rows.
const TRANSPOSE_RHS_FROM_M: usize = 256;

/// True when [`gemm_into`] copies a right operand with strides `(rs, cs)`
/// row-major before an `m x k x n` product (see [`TRANSPOSE_RHS_FROM_K`]).
pub(crate) fn copies_rhs((m, k, n): (usize, usize, usize), (rs, cs): (usize, usize)) -> bool {
    rs == 1 && cs >= k && n > 1 && k >= TRANSPOSE_RHS_FROM_K && m >= TRANSPOSE_RHS_FROM_M
}

thread_local! {
    /// This thread's row-major copies of transposed right operands (8-byte
    /// words holding f32 or f64 values), kept between products.
    static ROW_MAJOR_RHS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out = a x b` for an `m x k` and a `k x n` matrix through `gemm`, `out`
/// row-major `m x n` (overwritten, not read).
///
/// # Safety
/// `a` and `b` address every element of their matrices inside live
/// buffers, `out` holds `m * n` elements, and `out` aliases neither.
pub(crate) unsafe fn gemm_into<T: Real + Send + Sync + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    debug_assert!(out.len() >= m * n);
    if !copies_rhs((m, k, n), (b.rs, b.cs)) {
        return gemm_call((m, k, n), a, b, out, parallelism);
    }
    ROW_MAJOR_RHS.with_borrow_mut(|words| {
        let len = k * n;
        let word_len = (len * std::mem::size_of::<T>()).div_ceil(8);
        if words.len() < word_len {
            words.resize(word_len, 0);
        }
        // SAFETY: `words` holds at least `len` values of `T` (at most 8
        // bytes, aligned to at most 8), every one written below.
        let copy = std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len);
        // SAFETY: the caller's: column `j` of `b` is `k` values from `b.ptr + j * b.cs`.
        transpose_columns(b.ptr, b.cs, (k, n), copy, parallelism);
        gemm_call((m, k, n), a, GemmOperand { ptr: copy.as_ptr(), rs: n, cs: 1 }, out, parallelism)
    })
}

/// Write the `k x n` matrix whose column `j` is the `k` contiguous values
/// at `b + j * cs` into `out`, row-major, on the threads `parallelism` allows.
///
/// # Safety
/// Every such column lies inside a live buffer that `out` does not alias.
unsafe fn transpose_columns<T: Real + Send + Sync>(
    b: *const T,
    cs: usize,
    (k, n): (usize, usize),
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    /// Rows of `out` per block: the block's columns are read in runs of
    /// this many values and its rows written whole.
    const ROWS: usize = 32;
    let b = SendPtr(b);
    let rows_of = |(block, rows): (usize, &mut [T])| {
        let k0 = block * ROWS;
        for j in 0..n {
            // SAFETY: the caller's; `k0 + rows.len() / n <= k`.
            let column = unsafe { std::slice::from_raw_parts(b.at(j * cs + k0), rows.len() / n) };
            for (i, &v) in column.iter().enumerate() {
                rows[i * n + j] = v;
            }
        }
    };
    match parallelism {
        gemm::Parallelism::Rayon(threads) if threads > 1 => {
            use rayon::prelude::*;
            out[..k * n].par_chunks_mut(ROWS * n).enumerate().for_each(rows_of);
        }
        gemm::Parallelism::Rayon(_) | gemm::Parallelism::None => {
            out[..k * n].chunks_mut(ROWS * n).enumerate().for_each(rows_of)
        }
    }
}

/// A read-only pointer the threads of [`transpose_columns`] share.
#[derive(Clone, Copy)]
struct SendPtr<T>(*const T);

impl<T> SendPtr<T> {
    /// The pointer `offset` values on (a method, so that closures capture
    /// the whole `SendPtr`, not its field).
    ///
    /// # Safety
    /// The result lies inside the pointer's buffer.
    unsafe fn at(self, offset: usize) -> *const T {
        self.0.add(offset)
    }
}

// SAFETY: the threads only read through it.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

/// The `gemm` call itself.
///
/// # Safety
/// As for [`gemm_into`].
unsafe fn gemm_call<T: Real + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A transposed right operand long enough to be copied row-major gives
    /// the bits of the product read in place, on one thread and on two,
    /// including a column stride longer than `k` (a view of wider rows).
    #[test]
    fn copying_a_transposed_right_operand_changes_no_bits() {
        let (m, k, n) = (TRANSPOSE_RHS_FROM_M, TRANSPOSE_RHS_FROM_K, 5);
        let cs = k + 3;
        assert!(copies_rhs((m, k, n), (1, cs)) && !copies_rhs((m, k - 1, n), (1, cs)));
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
        let b: Vec<f32> = (0..n * cs).map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5).collect();
        let operands = || (GemmOperand { ptr: a.as_ptr(), rs: k, cs: 1 }, GemmOperand { ptr: b.as_ptr(), rs: 1, cs });
        let mut in_place = vec![0f32; m * n];
        let (x, y) = operands();
        // SAFETY: both operands address their buffers, the output holds m x n.
        unsafe { gemm_call((m, k, n), x, y, &mut in_place, gemm::Parallelism::None) };
        for parallelism in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
            let mut copied = vec![0f32; m * n];
            let (x, y) = operands();
            // SAFETY: as above.
            unsafe { gemm_into((m, k, n), x, y, &mut copied, parallelism) };
            assert!(copied.iter().zip(&in_place).all(|(c, p)| c.to_bits() == p.to_bits()), "{parallelism:?}");
        }
        let reference: f64 = (0..k).map(|p| f64::from(a[3 * k + p]) * f64::from(b[2 * cs + p])).sum();
        assert!((f64::from(in_place[3 * n + 2]) - reference).abs() < 1e-3, "the product itself");
    }
}
