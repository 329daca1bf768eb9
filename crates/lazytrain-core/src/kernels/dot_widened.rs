//! Matmuls of bf16 (or f16) values on CPUs without a dot-product
//! instruction for them: both operands are widened to f32 and the product
//! rounded back on all the pool's threads, around one `gemm` f32 product
//! (whose threads share its packed panels, as for f32 operands). The f32
//! copies live in scratch that each thread keeps and only grows, so
//! steady-state steps allocate nothing.
//!
//! Products of bf16 values are exact in f32 and the sums are f32 sums, so a
//! result is the f32 matmul of the same inputs, rounded once.

use super::gemm::{gemm_into, gemm_parallelism, GemmOperand};
use super::numeric::FloatLike;
use std::cell::RefCell;
use std::thread::LocalKey;

/// A logical matrix inside a buffer: element `(i, j)` is at
/// `offset + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

thread_local! {
    /// The widened left operand of the product this thread runs.
    static LEFT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The widened right operand.
    static RIGHT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The f32 product.
    static PRODUCT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on this thread's scratch `key` (a fresh vector in the unlikely
/// case that the thread is already using it further up its stack).
fn with_scratch<R>(key: &'static LocalKey<RefCell<Vec<f32>>>, f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Vec::new()),
    })
}

/// The `height x cols` matrix `x` widened into `dst`, keeping whichever
/// axis `x` stores contiguously, on up to `threads` threads; returns the
/// copy's `(rs, cs)`. `dst` only grows (it is scratch), so a repeated
/// product writes each element once.
fn widen<T: FloatLike<Math = f32>>(
    x: Strided<T>,
    (height, cols): (usize, usize),
    dst: &mut Vec<f32>,
    threads: usize,
) -> (usize, usize) {
    let len = height * cols;
    if dst.len() < len {
        dst.resize(len, 0.0);
    }
    let dst = &mut dst[..len];
    // Column-major blocks for column-major views (transposed operands).
    let by_columns = x.rs == 1 && x.cs != 1;
    let (lines, line_len) = if by_columns { (cols, height) } else { (height, cols) };
    let widen_lines = |first: usize, out: &mut [f32]| {
        for (line, out) in (first..).zip(out.chunks_exact_mut(line_len.max(1))) {
            if by_columns {
                let start = x.offset + line * x.cs;
                for (o, v) in out.iter_mut().zip(&x.data[start..start + height]) {
                    *o = v.widen();
                }
            } else {
                let start = x.offset + line * x.rs;
                if x.cs == 1 {
                    for (o, v) in out.iter_mut().zip(&x.data[start..start + cols]) {
                        *o = v.widen();
                    }
                } else {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = x.data[start + j * x.cs].widen();
                    }
                }
            }
        }
    };
    if threads > 1 && len >= super::split::SPLIT_ELEMENTWISE_FROM && lines > 1 {
        use rayon::prelude::*;
        let per_part = lines.div_ceil(threads);
        dst.par_chunks_mut(per_part * line_len).enumerate().for_each(|(p, out)| widen_lines(p * per_part, out));
    } else {
        widen_lines(0, dst);
    }
    if by_columns {
        (1, height)
    } else {
        (cols, 1)
    }
}

/// `out = a x b` for an `m x k` and a `k x n` matrix, `out` row-major
/// `m x n`, on up to `threads` threads of the current pool. The caller
/// checked that every element of the views lies in its buffer.
pub(crate) fn matmul<T: FloatLike<Math = f32>>(
    (m, k, n): (usize, usize, usize),
    a: Strided<T>,
    b: Strided<T>,
    out: &mut [T],
    threads: usize,
) {
    assert!(out.len() >= m * n, "the output holds the product");
    let out = &mut out[..m * n];
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(T::narrow(0.0));
        return;
    }
    with_scratch(&LEFT, |left| {
        with_scratch(&RIGHT, |right| {
            with_scratch(&PRODUCT, |product| {
                let (ars, acs) = widen(a, (m, k), left, threads);
                let (brs, bcs) = widen(b, (k, n), right, threads);
                // `gemm` overwrites the product (it does not read it): grow only.
                if product.len() < m * n {
                    product.resize(m * n, 0.0);
                }
                let product = &mut product[..m * n];
                // SAFETY: `left` holds the `m x k` values at (ars, acs),
                // `right` the `k x n` ones at (brs, bcs), `product` is
                // `m x n` row-major; none alias.
                unsafe {
                    let a = GemmOperand { ptr: left.as_ptr(), rs: ars, cs: acs };
                    let b = GemmOperand { ptr: right.as_ptr(), rs: brs, cs: bcs };
                    gemm_into((m, k, n), a, b, product, gemm_parallelism(m * n * k, threads));
                }
                narrow_into(product, out, threads);
            })
        })
    });
}

/// `out = product` rounded to `T`, on up to `threads` threads.
fn narrow_into<T: FloatLike<Math = f32>>(product: &[f32], out: &mut [T], threads: usize) {
    super::split::zip_in_parts(product, out, threads, |product, out| {
        out.iter_mut().zip(product).for_each(|(o, &v)| *o = T::narrow(v))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn values(len: usize, seed: u64) -> Vec<bf16> {
        let mut u = vec![0f32; len];
        crate::random::uniform_f32(seed, 0, &mut u);
        u.iter().map(|&x| bf16::from_f32(2.0 * x - 1.0)).collect()
    }

    /// The f64 product of the bf16 inputs, and the sum of |terms| per element.
    fn reference(m: usize, k: usize, n: usize, a: Strided<bf16>, b: Strided<bf16>) -> (Vec<f64>, Vec<f64>) {
        let at = |x: &Strided<bf16>, i: usize, j: usize| f64::from(x.data[x.offset + i * x.rs + j * x.cs].to_f32());
        let mut exact = vec![0f64; m * n];
        let mut magnitude = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let t = at(&a, i, p) * at(&b, p, j);
                    exact[i * n + j] += t;
                    magnitude[i * n + j] += t.abs();
                }
            }
        }
        (exact, magnitude)
    }

    /// Odd sizes (tall and wide), transposed and offset operands, k = 0,
    /// one to three threads: every element is the f64 product rounded once
    /// to bf16 (within the f32 sum's rounding).
    #[test]
    fn products_equal_the_f64_product_rounded_to_bf16() {
        let cases = [
            (1, 1, 1, false, false),
            (17, 33, 65, false, false),
            (65, 33, 17, true, false),
            (9, 7, 31, false, true),
            (300, 900, 40, true, true),
            (40, 1100, 300, false, true),
            (3, 0, 5, false, false),
        ];
        for (case, &(m, k, n, a_t, b_t)) in cases.iter().enumerate() {
            let offset = 3;
            let a_data = values(offset + m * k, 2 * case as u64);
            let b_data = values(offset + k * n, 2 * case as u64 + 1);
            let a = if a_t {
                Strided { data: &a_data[..], offset, rs: 1, cs: m }
            } else {
                Strided { data: &a_data[..], offset, rs: k, cs: 1 }
            };
            let b = if b_t {
                Strided { data: &b_data[..], offset, rs: 1, cs: k }
            } else {
                Strided { data: &b_data[..], offset, rs: n, cs: 1 }
            };
            let (exact, magnitude) = reference(m, k, n, a, b);
            for threads in [1, 2, 3] {
                let mut out = vec![bf16::from_f32(7.0); m * n];
                matmul((m, k, n), a, b, &mut out, threads);
                for (idx, o) in out.iter().enumerate() {
                    let got = f64::from(o.to_f32());
                    let bound = exact[idx].abs() / 256.0 + magnitude[idx] * 1e-6 + 1e-30;
                    assert!(
                        (got - exact[idx]).abs() <= bound,
                        "{m}x{k}x{n} (a_t {a_t}, b_t {b_t}, {threads} threads) element {idx}: {got} vs {}",
                        exact[idx]
                    );
                }
            }
        }
    }

    /// The thread count changes nothing: each element is one f32
    /// dot product computed the same way.
    #[test]
    fn thread_counts_give_identical_bits() {
        let (m, k, n) = (257, 300, 96);
        let a_data = values(m * k, 11);
        let b_data = values(k * n, 12);
        let a = Strided { data: &a_data[..], offset: 0, rs: k, cs: 1 };
        let b = Strided { data: &b_data[..], offset: 0, rs: n, cs: 1 };
        let mut one = vec![bf16::ZERO; m * n];
        let mut two = vec![bf16::ZERO; m * n];
        matmul((m, k, n), a, b, &mut one, 1);
        matmul((m, k, n), a, b, &mut two, 2);
        assert_eq!(one, two);
    }
}
