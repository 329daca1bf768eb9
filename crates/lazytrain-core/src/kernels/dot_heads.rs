//! f32 products of attention heads on AVX-512, without packing.
//!
//! An attention computes per head and batch element products of `seq x
//! head_dim` and `seq x seq` matrices (`128 x 64 x 128`, `128 x 128 x 64`
//! in BERT): about a million multiply-adds each, hundreds of them per
//! layer, one thread each. `gemm` packs both operands of every one of them
//! before its micro-kernel runs. Here the micro-kernel reads the operands
//! where they are: a row of the right operand is a few vectors (a value
//! head's row is 64 contiguous floats, whatever the distance between
//! rows), and each element of the left operand is broadcast from memory,
//! which reads a transposed left operand (`P^T dO`, `dS^T Q`) as easily as
//! a row-major one. Only a right operand stored transposed (the keys in
//! `Q K^T`) is first transposed through registers into the per-thread
//! buffer that `gemm`'s own row-major copies use.
//!
//! Measured on a 2-core AMD EPYC Genoa, one thread, operands in cache:
//! `128 x 128 x 64` at 114 GFLOP/s against `gemm`'s 107-109 (the core's
//! FMA rate is about 115), `128 x 64 x 128` with the keys' layout at 108
//! against 80. In BERT-mini's step the query-key products of 6 steps took
//! 78.7 ms instead of 89.8; the value products (whose probabilities come
//! from memory) 156.7 instead of 159.2.
//!
//! Every output element is one chain of fused multiply-adds over the shared
//! dimension in order from zero, as in `gemm`'s micro-kernel for a shared
//! dimension that it does not split into blocks (up to [`MAX_K`] here), so
//! the products have `gemm`'s bits (tests below).

#[cfg(target_arch = "x86_64")]
use super::gemm::{with_scratch, GemmOperand, ROW_MAJOR_RHS};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The longest shared dimension this kernel takes: `gemm` sums up to 512
/// (its depth block on every x86-64 cache layout) in one chain.
const MAX_K: usize = 256;

/// The longest side of the output this kernel takes (attention heads of
/// sequences up to 512 tokens).
const MAX_SIDE: usize = 512;

/// Rows of the output per tile (each with [`VECTORS`] accumulators).
const ROWS: usize = 6;

/// 16-float vectors of output columns per tile: 6 x 4 accumulators, 4
/// right-operand vectors and a broadcast left element fill 29 of the 32
/// registers.
const VECTORS: usize = 4;

/// True when [`product`] computes an `m x k x n` f32 product on this CPU:
/// not the products `gemm` sums in another order (matrix-vector products,
/// a shared dimension of 1 or 2, outputs of 256 elements or fewer).
pub(crate) fn applies((m, k, n): (usize, usize, usize)) -> bool {
    #[cfg(target_arch = "x86_64")]
    return (3..=MAX_K).contains(&k)
        && (2..=MAX_SIDE).contains(&m)
        && (2..=MAX_SIDE).contains(&n)
        && m * n > 256
        && super::simd::avx512();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out = a x b` for an `m x k` and a `k x n` f32 matrix, on the calling
/// thread: `out` is the output's first element and its rows (of `n`
/// contiguous elements, overwritten, not read) lie `out_rs` apart.
///
/// # Safety
/// [`applies`] holds for the dimensions; `a` and `b` address every element
/// of their matrices inside live buffers; `out`'s rows lie inside a live
/// buffer that nobody else touches there meanwhile.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn product(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<f32>,
    b: GemmOperand<f32>,
    out: (*mut f32, usize),
) {
    if b.cs == 1 {
        return product_row_major_rhs((m, k, n), a, (b.ptr, b.rs), out);
    }
    with_scratch(&ROW_MAJOR_RHS, k * n, |copy: &mut [f32]| {
        if b.rs == 1 {
            // Column `j` of `b` is the `k` floats from `b.ptr + j * b.cs`.
            super::simd::transpose_words((b.ptr.cast(), b.cs), (copy.as_mut_ptr().cast(), n), (k, n));
        } else {
            for (p, row) in copy.chunks_exact_mut(n).enumerate() {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = b.ptr.add(p * b.rs + j * b.cs).read();
                }
            }
        }
        product_row_major_rhs((m, k, n), a, (copy.as_ptr(), n), out)
    })
}

/// [`product`] with a right operand whose rows are contiguous, `rs` apart.
///
/// # Safety
/// As for [`product`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn product_row_major_rhs(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<f32>,
    (b, b_rs): (*const f32, usize),
    (o, out_rs): (*mut f32, usize),
) {
    let width = VECTORS * 16;
    for i in (0..m).step_by(ROWS) {
        let rows = ROWS.min(m - i);
        for j in (0..n).step_by(width) {
            let columns = width.min(n - j);
            let vectors = columns.div_ceil(16);
            let last = match columns % 16 {
                0 => u16::MAX,
                part => (1u16 << part) - 1,
            };
            let tile = Tile {
                k,
                a: a.ptr.add(i * a.rs),
                a_strides: (a.rs, a.cs),
                b: b.add(j),
                b_rs,
                out: o.add(i * out_rs + j),
                out_rs,
                last,
            };
            macro_rules! dispatch {
                ($($r:literal)*) => {
                    match (rows, vectors) {
                        $(
                            ($r, 1) => tile.run::<$r, 1>(),
                            ($r, 2) => tile.run::<$r, 2>(),
                            ($r, 3) => tile.run::<$r, 3>(),
                            ($r, 4) => tile.run::<$r, 4>(),
                        )*
                        (r, v) => unreachable!("a tile of {r} rows and {v} vectors"),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6);
        }
    }
}

/// One tile of the output: up to [`ROWS`] rows and [`VECTORS`] vectors of
/// columns.
#[cfg(target_arch = "x86_64")]
struct Tile {
    /// The shared dimension.
    k: usize,
    /// The tile's first row of the left operand.
    a: *const f32,
    /// `(row stride, column stride)` of the left operand.
    a_strides: (usize, usize),
    /// The tile's first column of the right operand's first row.
    b: *const f32,
    /// The right operand's row stride.
    b_rs: usize,
    /// The tile's first output element.
    out: *mut f32,
    /// The output's row stride.
    out_rs: usize,
    /// The lanes of the tile's last vector inside the output.
    last: u16,
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// `R` rows by `V` vectors: each step of the shared dimension loads `V`
    /// vectors of the right operand's row and multiplies each of `R`
    /// broadcast left elements into them.
    ///
    /// # Safety
    /// AVX-512 F is present; the tile's elements lie inside the operands
    /// and the output.
    #[inline(always)]
    unsafe fn run<const R: usize, const V: usize>(&self) {
        let mask = |v: usize| if v + 1 == V { self.last } else { u16::MAX };
        let (a_rs, a_cs) = self.a_strides;
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for p in 0..self.k {
            let row = self.b.add(p * self.b_rs);
            let b: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(mask(v), row.add(16 * v)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(self.a.add(r * a_rs + p * a_cs).read());
                for (acc, b) in acc.iter_mut().zip(&b) {
                    *acc = _mm512_fmadd_ps(x, *b, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(self.out.add(r * self.out_rs + 16 * v), mask(v), *acc);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::gemm::{gemm_into, GemmOperand};
    use super::{applies, product};

    /// A matrix of `len` floats of a fixed pattern.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut v = vec![0f32; len];
        crate::random::uniform_f32(seed, 0, &mut v);
        v.iter().map(|x| x - 0.5).collect()
    }

    /// Every layout of an attention's products (row-major and transposed
    /// left operands, right operands with contiguous rows a head's width
    /// apart, stored transposed, and strided both ways), and edge tiles of
    /// odd sizes: the bits of `gemm`.
    #[test]
    fn head_products_have_the_bits_of_gemm() {
        if !super::super::simd::avx512() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for (m, k, n) in [
            (128, 64, 128),
            (128, 128, 64),
            (37, 29, 83),
            (6, 3, 48),
            (2, 256, 130),
            (13, 200, 65),
            (512, 17, 2),
            (256, 256, 256),
        ] {
            assert!(applies((m, k, n)));
            // Operands sit in wider buffers (a head of several), so rows lie
            // further apart than their length.
            let a_buf = values(3 * m * k + 7, 1);
            let b_buf = values(3 * k * n + 7, 2);
            let layouts_a = [(3 * k, 1), (1, 3 * m), (1, m)];
            let layouts_b = [(3 * n, 1), (1, 3 * k), (1, k), (2 * n + 1, 3)];
            for &(ars, acs) in &layouts_a {
                for &(brs, bcs) in &layouts_b {
                    let a = GemmOperand { ptr: a_buf.as_ptr(), rs: ars, cs: acs };
                    let b = GemmOperand { ptr: b_buf.as_ptr(), rs: brs, cs: bcs };
                    let mut ours = vec![f32::NAN; m * n];
                    let mut theirs = vec![f32::NAN; m * n];
                    // SAFETY: the last element each operand addresses lies
                    // inside its buffer (asserted), the output holds m x n.
                    unsafe {
                        let last_a = (m - 1) * ars + (k - 1) * acs;
                        let last_b = (k - 1) * brs + (n - 1) * bcs;
                        assert!(last_a < a_buf.len() && last_b < b_buf.len());
                        product((m, k, n), a, b, (ours.as_mut_ptr(), n));
                        gemm_into((m, k, n), a, b, &mut theirs, gemm::Parallelism::None);
                    }
                    let differ = ours.iter().zip(&theirs).position(|(x, y)| x.to_bits() != y.to_bits());
                    assert_eq!(differ, None, "{m} x {k} x {n}, a {:?}, b {:?}", (ars, acs), (brs, bcs));
                    // Rows further apart (a head's rows among a token's
                    // heads): the same rows, nothing written between them.
                    let out_rs = 2 * n + 3;
                    let mut spaced = vec![f32::NAN; m * out_rs];
                    // SAFETY: as above; `spaced` holds m rows out_rs apart.
                    unsafe { product((m, k, n), a, b, (spaced.as_mut_ptr(), out_rs)) };
                    for (row, theirs) in spaced.chunks(out_rs).zip(theirs.chunks(n)) {
                        assert!(row[..n].iter().zip(theirs).all(|(x, y)| x.to_bits() == y.to_bits()));
                        assert!(row[n..].iter().all(|x| x.is_nan()));
                    }
                }
            }
        }
        assert!(
            !applies((128, 257, 128))
                && !applies((513, 64, 64))
                && !applies((64, 0, 64))
                && !applies((1, 64, 64))
                && !applies((16, 64, 16))
        );
    }
}
