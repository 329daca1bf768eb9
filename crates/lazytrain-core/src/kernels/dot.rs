//! Batched matmul kernels: a naive reference loop and the `gemm` crate.

use super::gemm::{
    gemm_into, gemm_parallelism, gemm_routed, matmul_parallelism, with_scratch, GemmOperand, GemmRoute, RowMajorCopy,
};
use super::numeric::{FloatLike, Real};
use crate::storage::HostData;
use half::bf16;

/// The geometry of one batched matmul `[b, m, k] x [b, k, n]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DotDims {
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub lhs_t: bool,
    pub rhs_t: bool,
}

impl DotDims {
    /// `(row stride, column stride)` of the left operand as an `m x k` matrix.
    fn lhs_strides(&self) -> (usize, usize) {
        if self.lhs_t {
            (1, self.m)
        } else {
            (self.k, 1)
        }
    }

    /// `(row stride, column stride)` of the right operand as a `k x n` matrix.
    fn rhs_strides(&self) -> (usize, usize) {
        if self.rhs_t {
            (1, self.k)
        } else {
            (self.n, 1)
        }
    }
}

/// Which matmul implementation runs `dot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Triple loop with `f64` accumulation: the reference interpreter's oracle.
    Naive,
    /// The `gemm` crate's blocked SIMD kernels.
    Gemm,
}

fn naive_typed<T: FloatLike>(d: DotDims, a: &[T], b: &[T], o: &mut [T]) {
    let (ars, acs) = d.lhs_strides();
    let (brs, bcs) = d.rhs_strides();
    for bi in 0..d.batch {
        let (a, b) = (&a[bi * d.m * d.k..], &b[bi * d.k * d.n..]);
        let o = &mut o[bi * d.m * d.n..];
        for i in 0..d.m {
            for j in 0..d.n {
                let mut acc = 0f64;
                for p in 0..d.k {
                    acc += a[i * ars + p * acs].widen().to_f64() * b[p * brs + j * bcs].widen().to_f64();
                }
                o[i * d.n + j] = T::narrow(T::Math::from_f64(acc));
            }
        }
    }
}

/// Where an operand's matrices sit in its buffer: an offset per batch and
/// the row and column strides of the logical (untransposed) matrix.
#[derive(Clone, Debug)]
pub(crate) struct MatrixLayout {
    offsets: Vec<usize>,
    rs: usize,
    cs: usize,
}

impl MatrixLayout {
    /// The layout of an operand of logical `rows x cols` matrices stored as
    /// `shape` (`[batch.., p, q]`, transposed when `transposed`) with
    /// element `strides`; `len` is the buffer's length (checked).
    fn new(shape: &[usize], strides: &[usize], transposed: bool, len: usize) -> Result<MatrixLayout, String> {
        let rank = shape.len();
        let (p, q) = (strides[rank - 2], strides[rank - 1]);
        let (rs, cs) = if transposed { (q, p) } else { (p, q) };
        let batch_shape = &shape[..rank - 2];
        let batches: usize = batch_shape.iter().product();
        let mut offsets = Vec::with_capacity(batches);
        let mut index = vec![0usize; batch_shape.len()];
        for _ in 0..batches {
            offsets.push(index.iter().zip(strides).map(|(i, s)| i * s).sum());
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < batch_shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        let last = offsets.iter().max().copied().unwrap_or(0)
            + (shape[rank - 2].max(1) - 1) * strides[rank - 2]
            + (shape[rank - 1].max(1) - 1) * strides[rank - 1];
        if shape.iter().product::<usize>() > 0 && last >= len {
            return Err(format!("a matmul operand reaches element {last} of a buffer of {len}"));
        }
        Ok(MatrixLayout { offsets, rs, cs })
    }

    /// The layout of a contiguous operand.
    fn contiguous(shape: &[usize], transposed: bool, len: usize) -> Result<MatrixLayout, String> {
        MatrixLayout::new(shape, &crate::shape::contiguous_strides(shape), transposed, len)
    }
}

/// Where a product's output matrices go: the buffer's first element and
/// each matrix's place in it (rows of `n` contiguous values, `rs` apart).
#[derive(Clone, Copy)]
struct OutMatrices<'l, T> {
    ptr: *mut T,
    layout: &'l MatrixLayout,
}

// SAFETY: the threads of one product write disjoint matrices of the output.
unsafe impl<T: Send> Send for OutMatrices<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for OutMatrices<'_, T> {}

impl<T> OutMatrices<'_, T> {
    /// Matrix `bi`'s first element and row stride.
    ///
    /// # Safety
    /// `bi` is a matrix of the layout, which lies inside the buffer.
    unsafe fn matrix(&self, bi: usize) -> (*mut T, usize) {
        (self.ptr.add(self.layout.offsets[bi]), self.layout.rs)
    }
}

/// `o = a x b` through `gemm` (or the attention-head kernel), the output's
/// matrices placed by `out` in `o` (checked by [`output_layout`]).
fn gemm_native<T: Real + Send + Sync + 'static>(
    d: DotDims,
    a: (&[T], &MatrixLayout),
    b: (&[T], &MatrixLayout),
    (o, out): (&mut [T], &MatrixLayout),
) {
    let out = OutMatrices { ptr: o.as_mut_ptr(), layout: out };
    if d.k == 0 {
        for bi in 0..d.batch {
            for r in 0..d.m {
                // SAFETY: the layout's matrices lie inside `o`.
                unsafe {
                    let (first, rs) = out.matrix(bi);
                    std::slice::from_raw_parts_mut(first.add(r * rs), d.n).fill(T::ZERO);
                }
            }
        }
        return;
    }
    let parallelism = matmul_parallelism(d.m * d.n * d.k);
    let threads = rayon::current_num_threads();
    if d.batch >= 2
        && threads > 1
        && matches!(parallelism, gemm::Parallelism::None)
        && d.batch * d.m * d.n * d.k >= 1 << 21
    {
        // Many small matrices (attention heads): split the batch between two
        // threads, each running its matrices one after another.
        let half = d.batch / 2;
        rayon::join(
            || gemm_batches(d, a, b, out, 0..half, gemm::Parallelism::None),
            || gemm_batches(d, a, b, out, half..d.batch, gemm::Parallelism::None),
        );
        return;
    }
    gemm_batches(d, a, b, out, 0..d.batch, parallelism);
}

/// Batches `range` of the product into their places in `out`.
fn gemm_batches<T: Real + Send + Sync + 'static>(
    d: DotDims,
    (a, la): (&[T], &MatrixLayout),
    (b, lb): (&[T], &MatrixLayout),
    out: OutMatrices<T>,
    range: std::ops::Range<usize>,
    parallelism: gemm::Parallelism,
) {
    for bi in range {
        // SAFETY: `MatrixLayout::new` checked that every matrix lies inside
        // its buffer; the output's matrices are disjoint (a permutation of
        // a contiguous layout) and alias neither input.
        unsafe {
            let a = GemmOperand { ptr: a.as_ptr().add(la.offsets[bi]), rs: la.rs, cs: la.cs };
            let b = GemmOperand { ptr: b.as_ptr().add(lb.offsets[bi]), rs: lb.rs, cs: lb.cs };
            one_matrix((d.m, d.k, d.n), a, b, out.matrix(bi), parallelism);
        }
    }
}

thread_local! {
    /// This thread's row-major copy of a product whose rows go further
    /// apart than their length, kept between products.
    static SPACED_ROWS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One matrix of a batched product into rows of `n` values `rs` apart from
/// `out`: on the attention-head kernel when it applies, else through
/// `gemm` (a compact copy of a small strided right operand first; into a
/// row-major scratch matrix copied into place when the rows are spaced).
///
/// # Safety
/// As for [`gemm_into`], with `out`'s rows inside a live buffer that
/// nobody else touches there meanwhile.
unsafe fn one_matrix<T: Real + Send + Sync + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    (out, rs): (*mut T, usize),
    parallelism: gemm::Parallelism,
) {
    if m * n == 0 || head_product((m, k, n), a, b, (out, rs), parallelism) {
        return;
    }
    let product = |o: &mut [T]| with_compact_columns(b, (k, n), |b| gemm_into((m, k, n), a, b, o, parallelism));
    if rs == n {
        return product(std::slice::from_raw_parts_mut(out, m * n));
    }
    with_scratch(&SPACED_ROWS, m * n, |rows: &mut [T]| {
        product(rows);
        for (r, row) in rows.chunks_exact(n).enumerate() {
            std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * rs), n);
        }
    })
}

/// Compute one matrix of an f32 product on this thread with the
/// attention-head kernel (`dot_heads`), when it is small enough and runs on
/// one thread; false (nothing written) otherwise.
///
/// # Safety
/// As for [`gemm_into`].
unsafe fn head_product<T: 'static>(
    dims: (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    (out, rs): (*mut T, usize),
    parallelism: gemm::Parallelism,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && matches!(parallelism, gemm::Parallelism::None)
        && super::dot_heads::applies(dims)
    {
        let f32_operand = |x: GemmOperand<T>| GemmOperand { ptr: x.ptr.cast::<f32>(), rs: x.rs, cs: x.cs };
        // SAFETY: `T` is f32 (checked above), so the buffers hold f32 values.
        super::dot_heads::product(dims, f32_operand(a), f32_operand(b), (out.cast::<f32>(), rs));
        return true;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (dims, a, b, out, rs, parallelism);
    false
}

/// True when [`dot`] computes each matrix of a batched product of `macs`
/// multiply-adds per matrix on one thread.
pub(crate) fn matrices_run_alone(macs: usize) -> bool {
    matches!(matmul_parallelism(macs), gemm::Parallelism::None)
}

/// An f32 matmul operand given by a pointer to its buffer's first element
/// (for a buffer other threads write at other matrices meanwhile).
#[derive(Clone, Copy)]
pub(crate) struct RawOperand<'a> {
    /// The buffer's first element.
    pub ptr: *const f32,
    /// Elements in the buffer.
    pub len: usize,
    /// The operand's shape.
    pub shape: &'a [usize],
    /// Element strides when read as a view of the buffer.
    pub strides: Option<&'a [usize]>,
}

/// A batched f32 product computed one matrix at a time on the calling
/// thread, as [`dot`] computes each matrix of a batch whose matrices run on
/// one thread each (the same kernel, so the same bits): an attention's
/// products run a head at a time between the other steps of a head chain.
pub(crate) struct HeadProducts {
    d: DotDims,
    a: (*const f32, MatrixLayout),
    b: (*const f32, MatrixLayout),
    out: MatrixLayout,
}

// SAFETY: the operands are only read; `compute`'s caller keeps them alive
// and unwritten at the matrices read.
unsafe impl Sync for HeadProducts {}

impl HeadProducts {
    /// The products `a x b` of geometry `d` into an output buffer of
    /// `out.len` elements holding the `out.shape` product as `out.strides`
    /// say (`None`: contiguous), or `None` when a matrix of this product
    /// would not run on one thread in [`dot`] (where it then may have other
    /// bits).
    pub(crate) fn new(
        d: DotDims,
        a: RawOperand,
        b: RawOperand,
        out: RawOperand,
    ) -> Result<Option<HeadProducts>, String> {
        if !matrices_run_alone(d.m * d.n * d.k) {
            return Ok(None);
        }
        let layout = |x: &RawOperand, transposed: bool| match x.strides {
            Some(s) => MatrixLayout::new(x.shape, s, transposed, x.len),
            None => MatrixLayout::contiguous(x.shape, transposed, x.len),
        };
        let (la, lb) = (layout(&a, d.lhs_t)?, layout(&b, d.rhs_t)?);
        let out = output_layout(out.shape, out.strides, out.len)?;
        if la.offsets.len() != d.batch || lb.offsets.len() != d.batch || out.offsets.len() != d.batch {
            return Err(format!(
                "a product of {} matrices read as {} and {}, stored as {}",
                d.batch,
                la.offsets.len(),
                lb.offsets.len(),
                out.offsets.len()
            ));
        }
        Ok(Some(HeadProducts { d, a: (a.ptr, la), b: (b.ptr, lb), out }))
    }

    /// Matrices in the batch.
    pub(crate) fn batch(&self) -> usize {
        self.d.batch
    }

    /// Ask the CPU to bring matrix `i` of both operands into its L2 cache
    /// (a hint; nothing is read): a head chain prefetches the next head's
    /// operands while it computes this one's.
    pub(crate) fn prefetch(&self, i: usize) {
        if i >= self.d.batch {
            return;
        }
        let (d, (pa, la), (pb, lb)) = (self.d, &self.a, &self.b);
        for (p, layout, rows, columns) in [(pa, la, d.m, d.k), (pb, lb, d.k, d.n)] {
            let first = p.wrapping_add(layout.offsets[i]);
            // Runs along the contiguous axis, one per row (or column).
            let (runs, run_len, stride) = match (layout.rs, layout.cs) {
                (_, 1) => (rows, columns, layout.rs),
                (1, _) => (columns, rows, layout.cs),
                _ => continue,
            };
            for r in 0..runs {
                super::simd::prefetch_l2(first.wrapping_add(r * stride), run_len);
            }
        }
    }

    /// Compute matrix `i` into its place in the output buffer starting at
    /// `out` (of the length given to [`HeadProducts::new`]).
    ///
    /// # Safety
    /// `i < batch`; the operands' buffers are alive and nobody writes the
    /// elements of matrix `i` meanwhile; nobody else touches output matrix
    /// `i` meanwhile.
    pub(crate) unsafe fn compute(&self, i: usize, out: *mut f32) {
        let (d, (pa, la), (pb, lb)) = (self.d, &self.a, &self.b);
        let a = GemmOperand { ptr: pa.add(la.offsets[i]), rs: la.rs, cs: la.cs };
        let b = GemmOperand { ptr: pb.add(lb.offsets[i]), rs: lb.rs, cs: lb.cs };
        let out = OutMatrices { ptr: out, layout: &self.out };
        one_matrix((d.m, d.k, d.n), a, b, out.matrix(i), gemm::Parallelism::None);
    }
}

/// The largest right operand (in bytes) that [`with_compact_columns`]
/// copies: an attention head (`128 x 64` f32 values are 32 KiB) with room
/// to spare, small enough to stay in a core's L2 cache while `gemm` reads it.
const COMPACT_MAX_BYTES: usize = 256 << 10;

thread_local! {
    /// This thread's compact copies of right operands (8-byte words holding
    /// f32 or f64 values), kept between products.
    static COMPACT_RHS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on the `k x n` right operand `b`, or on a compact copy of it
/// when it is small, stored transposed (each column contiguous) and its
/// columns lie further apart than their length: the keys of an attention
/// in its query-key product (`Q K^T`), `[batch, heads, seq, head_dim]`
/// views of a `[batch, seq, heads, head_dim]` projection whose columns are
/// a whole token's width apart. `gemm` packs such an operand slowly; with
/// the copy (columns stay columns), BERT-small's 128 query-key products of
/// a batch (`128 x 64 x 128` each, operands from memory) took 1.91 ms
/// instead of 2.61 (2-core AMD EPYC Genoa). Copying the left operand, a
/// row-major right one (the values in `P V`), or transposing the copy
/// row-major, made the products slower (2.79, 1.87, 2.40 ms). The copy
/// holds the same values in the same orientation, so `gemm` computes the
/// same sums in the same order (the tests compare the bits). On CPUs with
/// AVX-512 the f32 heads now run on `dot_heads` instead (faster still);
/// this copy serves the others and f64.
///
/// # Safety
/// `b` addresses every element of its matrix inside a live buffer.
unsafe fn with_compact_columns<T: Real, R>(
    b: GemmOperand<T>,
    (k, n): (usize, usize),
    f: impl FnOnce(GemmOperand<T>) -> R,
) -> R {
    if !(b.rs == 1 && b.cs > k) || k * n * std::mem::size_of::<T>() > COMPACT_MAX_BYTES {
        return f(b);
    }
    with_scratch(&COMPACT_RHS, k * n, |copy: &mut [T]| {
        for (j, column) in copy.chunks_exact_mut(k.max(1)).take(n).enumerate() {
            // SAFETY: the caller's: column `j` is the `k` values from `b.ptr + j * b.cs`.
            column.copy_from_slice(unsafe { std::slice::from_raw_parts(b.ptr.add(j * b.cs), k) });
        }
        f(GemmOperand { ptr: copy.as_ptr(), rs: 1, cs: k })
    })
}

/// Run `one(batch, output, threads)` for every matrix of a batched product
/// whose outputs are `d.m x d.n` chunks of `o`: many small matrices are
/// shared out between threads whole, large ones use every thread each.
fn for_each_matrix<T: Send>(d: DotDims, o: &mut [T], one: impl Fn(usize, &mut [T], usize) + Sync) {
    let size = d.m * d.n;
    if size == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    if matrices_alone(d, threads) {
        use rayon::prelude::*;
        o.par_chunks_mut(size).enumerate().for_each(|(bi, o)| one(bi, o, 1));
    } else {
        for (bi, o) in o.chunks_mut(size).enumerate() {
            one(bi, o, threads);
        }
    }
}

/// True when the matrices of `d` go out whole, one thread each, between
/// the `threads` of the pool: exactly when one matrix would run on one
/// thread anyway (`gemm_parallelism`), as `gemm_native` splits batches.
fn matrices_alone(d: DotDims, threads: usize) -> bool {
    let single = matches!(gemm_parallelism(d.m * d.n * d.k, threads), gemm::Parallelism::None);
    d.batch >= threads && threads > 1 && single
}

/// bf16 x bf16 with f32 accumulation on AVX-512 BF16 (see `dot_bf16`).
fn gemm_bf16(d: DotDims, (a, la): (&[bf16], &MatrixLayout), (b, lb): (&[bf16], &MatrixLayout), o: &mut [bf16]) {
    use super::dot_bf16::{matmul, Out, View};
    for_each_matrix(d, o, |bi, o, threads| {
        let av = View { data: a, offset: la.offsets[bi], rs: la.rs, cs: la.cs };
        let bv = View { data: b, offset: lb.offsets[bi], rs: lb.rs, cs: lb.cs };
        matmul(d.m, d.k, d.n, av, bv, Out::BF16(o), threads);
    });
}

thread_local! {
    /// This thread's contiguous copy of a bf16 matrix on its way into a
    /// spaced output where the CPU has no bf16 kernel, kept between products.
    static SPACED_BF16: std::cell::RefCell<Vec<bf16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`gemm_bf16`] into the matrices of an output layout whose rows are
/// further apart than their length (a batched product stored straight into
/// the permute that reads it: an attention's heads into their tokens'
/// rows), each matrix on the threads [`matrices_alone`] gives it, so
/// the same bits: on the AVX-512 BF16 kernel where `kernel` says the CPU
/// has it (see [`gemm_bf16`]), else through a contiguous copy of each
/// matrix (see [`gemm_widened`]).
fn gemm_bf16_spaced(
    d: DotDims,
    (a, la): (&[bf16], &MatrixLayout),
    (b, lb): (&[bf16], &MatrixLayout),
    (o, lo): (&mut [bf16], &MatrixLayout),
    kernel: bool,
) {
    use super::dot_bf16::{matmul_strided, OutPtr, View};
    let out = OutMatrices { ptr: o.as_mut_ptr(), layout: lo };
    let one = |bi: usize, threads: usize| {
        // SAFETY: `output_layout` checked that every matrix of the layout
        // lies inside `o`; each matrix is written by this call only.
        let (first, rs) = unsafe { out.matrix(bi) };
        if kernel {
            let av = View { data: a, offset: la.offsets[bi], rs: la.rs, cs: la.cs };
            let bv = View { data: b, offset: lb.offsets[bi], rs: lb.rs, cs: lb.cs };
            // SAFETY: the CPU has the kernel; as above for the rows.
            unsafe { matmul_strided((d.m, d.k, d.n), av, bv, (OutPtr::BF16(first), rs), threads) };
            return;
        }
        SPACED_BF16.with_borrow_mut(|own| {
            let own = super::dot_bf16::sized(own, d.m * d.n);
            let av = super::dot_widened::Strided { data: a, offset: la.offsets[bi], rs: la.rs, cs: la.cs };
            let bv = super::dot_widened::Strided { data: b, offset: lb.offsets[bi], rs: lb.rs, cs: lb.cs };
            super::dot_widened::matmul((d.m, d.k, d.n), av, bv, own, threads);
            for (r, row) in own.chunks_exact(d.n).enumerate() {
                // SAFETY: as above, row `r` of matrix `bi`.
                unsafe { std::slice::from_raw_parts_mut(first.add(r * rs), d.n).copy_from_slice(row) };
            }
        });
    };
    let threads = rayon::current_num_threads();
    if matrices_alone(d, threads) {
        use rayon::prelude::*;
        (0..d.batch).into_par_iter().for_each(|bi| one(bi, 1));
    } else {
        (0..d.batch).for_each(|bi| one(bi, threads));
    }
}

/// bf16 or f16 operands widened to f32 for `gemm` (see
/// `dot_widened`): CPUs without a dot-product instruction for them.
fn gemm_widened<T: FloatLike<Math = f32>>(
    d: DotDims,
    (a, la): (&[T], &MatrixLayout),
    (b, lb): (&[T], &MatrixLayout),
    o: &mut [T],
) {
    use super::dot_widened::{matmul, Strided};
    for_each_matrix(d, o, |bi, o, threads| {
        let av = Strided { data: a, offset: la.offsets[bi], rs: la.rs, cs: la.cs };
        let bv = Strided { data: b, offset: lb.offsets[bi], rs: lb.rs, cs: lb.cs };
        matmul((d.m, d.k, d.n), av, bv, o, threads);
    });
}

/// Where the matrices of a product of shape `shape` go in its output buffer
/// of `len` elements: contiguous, or by element `strides` that lay the
/// buffer out as a permutation of its axes whose rows stay contiguous (a
/// batched product stored straight into the permute that reads it).
fn output_layout(shape: &[usize], strides: Option<&[usize]>, len: usize) -> Result<MatrixLayout, String> {
    let numel: usize = shape.iter().product();
    if numel != len {
        return Err(format!("a product of {numel} elements into a buffer of {len}"));
    }
    let Some(strides) = strides else { return MatrixLayout::contiguous(shape, false, len) };
    if strides.len() != shape.len() {
        return Err(format!("a product of shape {shape:?} stored with strides {strides:?}"));
    }
    let mut axes: Vec<usize> = (0..shape.len()).collect();
    axes.sort_by_key(|&a| std::cmp::Reverse(strides[a]));
    let permuted: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let expected = crate::shape::contiguous_strides(&permuted);
    let is_permutation = axes.iter().zip(&expected).all(|(&a, &s)| strides[a] == s || shape[a] == 1);
    if !is_permutation || strides.last() != Some(&1) {
        return Err(format!("a product of shape {shape:?} stored with strides {strides:?}"));
    }
    MatrixLayout::new(shape, strides, false, len)
}

/// A matmul operand: its buffer, stored shape, and element strides when it
/// is a strided view of the buffer (`None`: contiguous).
#[derive(Clone, Copy)]
pub(crate) struct DotOperand<'a> {
    pub data: &'a HostData,
    pub shape: &'a [usize],
    pub strides: Option<&'a [usize]>,
}

/// `out = lhs x rhs` with the given geometry, the product of shape
/// `out_shape` laid out in `out` by `out_strides` (`None`: contiguous; see
/// [`output_layout`]: `gemm`'s f32 and f64 products only).
pub(crate) fn dot(
    kernel: MatmulKernel,
    d: DotDims,
    a: DotOperand,
    b: DotOperand,
    (out, out_shape, out_strides): (&mut HostData, &[usize], Option<&[usize]>),
) -> Result<(), String> {
    let layout = |x: &DotOperand, transposed: bool| match x.strides {
        Some(s) => MatrixLayout::new(x.shape, s, transposed, x.data.len()),
        None => MatrixLayout::contiguous(x.shape, transposed, x.data.len()),
    };
    if kernel == MatmulKernel::Naive && (a.strides.is_some() || b.strides.is_some()) {
        return Err("the reference matmul reads contiguous operands only".into());
    }
    let (la, lb) = (layout(&a, d.lhs_t)?, layout(&b, d.rhs_t)?);
    let lo = output_layout(out_shape, out_strides, out.len())?;
    let spaced = out_strides.is_some();
    match (kernel, a.data, b.data, out) {
        (MatmulKernel::Gemm, HostData::F32(a), HostData::F32(b), HostData::F32(o)) => {
            gemm_native(d, (a, &la), (b, &lb), (o, &lo))
        }
        (MatmulKernel::Gemm, HostData::F64(a), HostData::F64(b), HostData::F64(o)) => {
            gemm_native(d, (a, &la), (b, &lb), (o, &lo))
        }
        (MatmulKernel::Gemm, HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) if spaced => {
            gemm_bf16_spaced(d, (a, &la), (b, &lb), (o, &lo), super::dot_bf16::available())
        }
        (_, _, _, out) if spaced => return Err(format!("a {} product stored through strides", out.dtype())),
        (MatmulKernel::Naive, HostData::F32(a), HostData::F32(b), HostData::F32(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::F64(a), HostData::F64(b), HostData::F64(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::F16(a), HostData::F16(b), HostData::F16(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Gemm, HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => {
            if super::dot_bf16::available() {
                gemm_bf16(d, (a, &la), (b, &lb), o)
            } else {
                gemm_widened(d, (a, &la), (b, &lb), o)
            }
        }
        (MatmulKernel::Gemm, HostData::F16(a), HostData::F16(b), HostData::F16(o)) => {
            gemm_widened(d, (a, &la), (b, &lb), o)
        }
        (_, a, b, _) => return Err(format!("dot of {} and {}", a.dtype(), b.dtype())),
    }
    Ok(())
}

/// Where a panel's rows of a product go: the first element of the
/// row-major `m x n` output, written by several threads at disjoint rows.
#[derive(Clone, Copy)]
pub(crate) enum PanelOut {
    /// An f32 product.
    F32(*mut f32),
    /// A bf16 product (AVX-512 BF16 kernel).
    BF16(*mut bf16),
}

// SAFETY: a panel output is shared by the threads of one product, which
// write disjoint rows of it (see `RowPanels::compute`).
unsafe impl Send for PanelOut {}
// SAFETY: as above.
unsafe impl Sync for PanelOut {}

/// A single (batch 1) product computed a panel of rows at a time on the
/// calling thread, so that a matmul epilogue can run on each panel while it
/// is still in cache. Every panel of rows `r0..r1` holds exactly what the
/// whole product would: row `i` of the result depends only on row `i` of
/// the left operand, and each panel runs on one thread.
pub(crate) struct RowPanels<'a> {
    d: DotDims,
    a: &'a HostData,
    la: MatrixLayout,
    b: &'a HostData,
    lb: MatrixLayout,
    /// The row-major copy of a transposed right operand that each panel
    /// multiplies by (the product's trials kept the copy).
    rhs_copy: Option<RowMajorCopy>,
}

impl<'a> RowPanels<'a> {
    /// The panels of `a x b` with geometry `d`, or `None` when this product
    /// is not computed by panels here: a batch of matrices, a dtype other
    /// than f32 and bf16 on a CPU with AVX-512 BF16, an f32 product whose
    /// route trials still run, or one routed through a transposed output or
    /// a split shared dimension. Where its route copies the right operand
    /// row-major, the copy is made here, once for all panels.
    pub(crate) fn new(d: DotDims, a: DotOperand<'a>, b: DotOperand<'a>) -> Result<Option<RowPanels<'a>>, String> {
        let supported = match (a.data, b.data) {
            (HostData::F32(_), HostData::F32(_)) => true,
            (HostData::BF16(_), HostData::BF16(_)) => super::dot_bf16::available(),
            _ => false,
        };
        if d.batch != 1 || d.k == 0 || !supported {
            return Ok(None);
        }
        let layout = |x: &DotOperand, transposed: bool| match x.strides {
            Some(s) => MatrixLayout::new(x.shape, s, transposed, x.data.len()),
            None => MatrixLayout::contiguous(x.shape, transposed, x.data.len()),
        };
        let (la, lb) = (layout(&a, d.lhs_t)?, layout(&b, d.rhs_t)?);
        let dims = (d.m, d.k, d.n);
        let route = GemmRoute::of(dims, (la.rs, la.cs), (lb.rs, lb.cs));
        let rhs_copy = match b.data {
            HostData::F32(b_values) if route.runs_whole() => {
                // A copy of a whole operand or of the whole output sits
                // between `gemm` and the caller's rows, or every output row
                // sums two halves. A product that `gemm_into` tries runs
                // whole (timed) until its trials are over; then by panels if
                // they kept the direct call, or by panels of direct calls on
                // one row-major copy of its right operand if they kept that
                // copy. Otherwise it runs whole, and its epilogue after it.
                let parallelism = matmul_parallelism(d.m * d.k * d.n);
                let kept = match super::gemm_tuning::tried(route, dims) {
                    true => super::gemm_tuning::kept(super::gemm_tuning::route_key(
                        dims,
                        (la.rs, la.cs),
                        (lb.rs, lb.cs),
                        parallelism,
                    )),
                    false => Some(route),
                };
                match kept {
                    Some(GemmRoute::Direct) => None,
                    Some(GemmRoute::CopyRhs) if lb.rs == 1 && lb.cs >= d.k => {
                        let column_major =
                            GemmOperand { ptr: b_values[lb.offsets[0]..].as_ptr(), rs: lb.rs, cs: lb.cs };
                        // SAFETY: the operand's row stride is 1 (checked), and
                        // its layout lies inside the buffer (`MatrixLayout`
                        // checks its last element).
                        Some(unsafe { RowMajorCopy::new(column_major, (d.k, d.n), parallelism) })
                    }
                    Some(GemmRoute::CopyRhs | GemmRoute::TransposeOutput | GemmRoute::SplitK) | None => {
                        return Ok(None)
                    }
                }
            }
            _ => None,
        };
        Ok(Some(RowPanels { d, a: a.data, la, b: b.data, lb, rhs_copy }))
    }

    /// Rows `r0..r1` of the product into `out`, on this thread.
    ///
    /// # Safety
    /// `out` addresses `m * n` elements of the product's dtype, and no other
    /// thread accesses rows `r0..r1` of it meanwhile.
    pub(crate) unsafe fn compute(&self, r0: usize, r1: usize, out: PanelOut) {
        let (d, rows) = (self.d, r1 - r0);
        let a_offset = self.la.offsets[0] + r0 * self.la.rs;
        match (self.a, self.b, out) {
            (HostData::F32(a), HostData::F32(b), PanelOut::F32(o)) => {
                let a = GemmOperand { ptr: a.as_ptr().add(a_offset), rs: self.la.rs, cs: self.la.cs };
                let b = match &self.rhs_copy {
                    Some(copy) => copy.operand(),
                    None => GemmOperand { ptr: b.as_ptr().add(self.lb.offsets[0]), rs: self.lb.rs, cs: self.lb.cs },
                };
                let o = std::slice::from_raw_parts_mut(o.add(r0 * d.n), rows * d.n);
                // Each panel calls `gemm` directly: the whole product's plan
                // is the direct call (a panel's fewer rows never plan a copy
                // or a transposed output that the whole product does not),
                // or its trials kept it, or the copy was made in `new`. Never
                // split `k` here: a panel's rows hold the whole product's bits.
                gemm_routed(GemmRoute::Direct, (rows, d.k, d.n), a, b, o, gemm::Parallelism::None);
            }
            (HostData::BF16(a), HostData::BF16(b), PanelOut::BF16(o)) => {
                use super::dot_bf16::{matmul, Out, View};
                let av = View { data: a, offset: a_offset, rs: self.la.rs, cs: self.la.cs };
                let bv = View { data: b, offset: self.lb.offsets[0], rs: self.lb.rs, cs: self.lb.cs };
                let o = std::slice::from_raw_parts_mut(o.add(r0 * d.n), rows * d.n);
                matmul(rows, d.k, d.n, av, bv, Out::BF16(o), 1);
            }
            _ => unreachable!("`new` admits f32 and bf16 products, and the output has the operands' dtype"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 heads stored into tokens' rows (`[b, h, s, w]` products in a
    /// `[b, s, h, w]` buffer), by the bf16 kernel where this CPU has it and
    /// by widened `gemm` on every CPU: the bits of the contiguous product
    /// (computed by the same kernel) moved row by row, on 1 and 2 threads,
    /// and nothing written between the rows.
    #[test]
    fn spaced_bf16_products_put_each_row_where_the_permute_would() {
        let (b, h, s, w, k) = (2, 3, 37, 20, 24);
        let d = DotDims { batch: b * h, m: s, k, n: w, lhs_t: false, rhs_t: false };
        let mut u = vec![0f32; d.batch * k * (s + w)];
        crate::random::uniform_f32(5, 0, &mut u);
        let values: Vec<bf16> = u.iter().map(|&x| bf16::from_f32(2.0 * x - 1.0)).collect();
        let (a, bb) = values.split_at(d.batch * s * k);
        let la = MatrixLayout::contiguous(&[b, h, s, k], false, a.len()).unwrap();
        let lb = MatrixLayout::contiguous(&[b, h, k, w], false, bb.len()).unwrap();
        let strides = [s * h * w, w, h * w, 1];
        let lo = output_layout(&[b, h, s, w], Some(&strides), b * h * s * w).unwrap();
        let kernels: &[bool] = if super::super::dot_bf16::available() { &[true, false] } else { &[false] };
        for &kernel in kernels {
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut contiguous = vec![bf16::ZERO; b * h * s * w];
                let mut spaced = vec![bf16::NAN; b * h * s * w];
                pool.install(|| {
                    match kernel {
                        true => gemm_bf16(d, (a, &la), (bb, &lb), &mut contiguous),
                        false => gemm_widened(d, (a, &la), (bb, &lb), &mut contiguous),
                    }
                    gemm_bf16_spaced(d, (a, &la), (bb, &lb), (&mut spaced, &lo), kernel);
                });
                for (bi, matrix) in contiguous.chunks_exact(s * w).enumerate() {
                    let (batch, head) = (bi / h, bi % h);
                    for (r, row) in matrix.chunks_exact(w).enumerate() {
                        let at = batch * strides[0] + head * strides[1] + r * strides[2];
                        let placed = &spaced[at..at + w];
                        assert!(
                            placed.iter().zip(row).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "kernel {kernel}, {threads} threads: matrix {bi} row {r}"
                        );
                    }
                }
                assert!(spaced.iter().all(|x| !x.is_nan()), "every element written once");
            }
        }
    }

    /// Batched bf16 products through whichever kernel this CPU runs: small
    /// matrices shared out whole between threads and large ones each on all
    /// threads give the same bits on 1 and 3 threads, within bf16 rounding
    /// of the f64 reference.
    #[test]
    fn batched_bf16_products_do_not_depend_on_the_thread_count() {
        for d in [
            DotDims { batch: 7, m: 9, k: 33, n: 5, lhs_t: false, rhs_t: true },
            DotDims { batch: 3, m: 130, k: 129, n: 131, lhs_t: true, rhs_t: false },
        ] {
            let mut u = vec![0f32; d.batch * d.k * (d.m + d.n)];
            crate::random::uniform_f32(3, 0, &mut u);
            let values: Vec<bf16> = u.iter().map(|&x| bf16::from_f32(2.0 * x - 1.0)).collect();
            let (a, b) = values.split_at(d.batch * d.k * d.m);
            let (a, b) = (HostData::BF16(a.to_vec()), HostData::BF16(b.to_vec()));
            let (a_shape, b_shape) = ([d.batch, d.m, d.k], [d.batch, d.n, d.k]);
            let (a_shape, b_shape) = match (d.lhs_t, d.rhs_t) {
                (false, true) => (a_shape, b_shape),
                _ => ([d.batch, d.k, d.m], [d.batch, d.k, d.n]),
            };
            let run = |kernel, threads| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut out = HostData::BF16(vec![bf16::ZERO; d.batch * d.m * d.n]);
                let operand = |data, shape| DotOperand { data, shape, strides: None };
                pool.install(|| {
                    dot(kernel, d, operand(&a, &a_shape), operand(&b, &b_shape), (&mut out, &[d.batch, d.m, d.n], None))
                })
                .unwrap();
                match out {
                    HostData::BF16(v) => v,
                    _ => unreachable!("the output is bf16"),
                }
            };
            let (one, three, reference) =
                (run(MatmulKernel::Gemm, 1), run(MatmulKernel::Gemm, 3), run(MatmulKernel::Naive, 1));
            assert!(one.iter().zip(&three).all(|(x, y)| x.to_bits() == y.to_bits()), "{d:?}");
            for (x, y) in one.iter().zip(&reference) {
                let (x, y) = (x.to_f32(), y.to_f32());
                assert!((x - y).abs() <= y.abs() / 128.0 + 1e-5, "{d:?}: {x} vs {y}");
            }
        }
    }

    /// A batched bf16 product with a transposed left operand, through the
    /// AVX-512 BF16 kernel and through the fallback (widen to f32, f32 GEMM).
    #[test]
    fn the_bf16_kernel_and_its_fallback_agree_within_bf16_rounding() {
        if !crate::kernels::dot_bf16::available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (the fallback is the only path)");
            return;
        }
        let d = DotDims { batch: 3, m: 19, k: 45, n: 37, lhs_t: true, rhs_t: false };
        let mut u = vec![0f32; d.batch * d.k * (d.m + d.n)];
        crate::random::uniform_f32(9, 0, &mut u);
        let values: Vec<bf16> = u.iter().map(|&x| bf16::from_f32(2.0 * x - 1.0)).collect();
        let (a, b) = values.split_at(d.batch * d.k * d.m);
        let la = MatrixLayout::contiguous(&[d.batch, d.k, d.m], true, a.len()).unwrap();
        let lb = MatrixLayout::contiguous(&[d.batch, d.k, d.n], false, b.len()).unwrap();
        let mut fast = vec![bf16::ZERO; d.batch * d.m * d.n];
        let mut fallback = fast.clone();
        gemm_bf16(d, (a, &la), (b, &lb), &mut fast);
        gemm_widened(d, (a, &la), (b, &lb), &mut fallback);
        for (x, y) in fast.iter().zip(&fallback) {
            let (x, y) = (x.to_f32(), y.to_f32());
            assert!((x - y).abs() <= y.abs() / 128.0 + 1e-6, "{x} vs {y}");
        }
        assert!(fast.iter().zip(&fallback).filter(|(x, y)| x == y).count() > fast.len() / 2);
    }

    /// A product's output layout: contiguous, or a permutation of its axes
    /// that keeps rows contiguous; strides that overlap, leave gaps or
    /// spread a row are refused.
    #[test]
    fn outputs_are_stored_as_permutations_of_their_axes() {
        let shape = [2, 3, 4, 5];
        let tokens = [60, 5, 15, 1];
        let layout = output_layout(&shape, Some(&tokens), 120).unwrap();
        assert_eq!((layout.rs, layout.cs), (15, 1));
        assert_eq!(layout.offsets, [0, 5, 10, 60, 65, 70]);
        assert_eq!(output_layout(&shape, None, 120).unwrap().offsets, [0, 20, 40, 60, 80, 100]);
        for bad in [[60, 5, 5, 1], [60, 20, 15, 1], [60, 1, 15, 3], [120, 5, 15, 1]] {
            assert!(output_layout(&shape, Some(&bad), 120).is_err(), "{bad:?}");
        }
        assert!(output_layout(&shape, Some(&[15, 1]), 120).is_err());
        assert!(output_layout(&shape, Some(&tokens), 119).is_err());
    }

    /// Attention-shaped products whose operands are head views of `[batch,
    /// seq, heads, head_dim]` buffers (rows a token's width apart;
    /// `with_compact_columns` copies the transposed keys): the same bits
    /// as the product of the heads laid out contiguously, and within f32
    /// rounding of the f64 reference. Query-key (right operand transposed)
    /// and probabilities-value (right operand row-major) products, one
    /// head's keys above the copy's size limit among them.
    #[test]
    fn head_views_give_the_bits_of_contiguous_heads() {
        for (b, t, h, e, rhs_t) in [(2, 5, 3, 4, true), (2, 5, 3, 4, false), (1, 300, 2, 256, true)] {
            let mut q = vec![0f32; b * t * h * e];
            let mut kv = q.clone();
            crate::random::uniform_f32(4, 0, &mut q);
            crate::random::uniform_f32(5, 0, &mut kv);
            // `[b, h, t, e]` views of the `[b, t, h, e]` buffers, and contiguous copies of them.
            let (view_shape, view_strides) = ([b, h, t, e], [t * h * e, e, h * e, 1]);
            let heads = |x: &[f32]| -> Vec<f32> {
                let mut out = Vec::with_capacity(x.len());
                for (bi, hi, ti) in (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..t).map(move |ti| (bi, hi, ti))))
                {
                    out.extend_from_slice(&x[((bi * t + ti) * h + hi) * e..][..e]);
                }
                out
            };
            // Query-key: `[t, e] x [t, e]^T`; probabilities-value: `[t, t] x [t, e]` with
            // the probabilities contiguous (here the first `t * t` values per head of `q`'s copy).
            let (d, lhs, lhs_shape, lhs_strides) = if rhs_t {
                let d = DotDims { batch: b * h, m: t, k: e, n: t, lhs_t: false, rhs_t: true };
                (d, q.clone(), view_shape.to_vec(), Some(view_strides))
            } else {
                let probabilities: Vec<f32> = (0..b * h * t * t).map(|i| q[i % q.len()]).collect();
                let d = DotDims { batch: b * h, m: t, k: t, n: e, lhs_t: false, rhs_t: false };
                (d, probabilities, vec![b, h, t, t], None)
            };
            let run = |lhs: &HostData, lhs_strides: Option<&[usize]>, rhs: &HostData, rhs_strides: Option<&[usize]>| {
                let mut out = HostData::F32(vec![0f32; d.batch * d.m * d.n]);
                let lhs = DotOperand { data: lhs, shape: &lhs_shape, strides: lhs_strides };
                let rhs = DotOperand { data: rhs, shape: &view_shape, strides: rhs_strides };
                dot(MatmulKernel::Gemm, d, lhs, rhs, (&mut out, &[d.batch, d.m, d.n], None)).unwrap();
                match out {
                    HostData::F32(v) => v,
                    _ => unreachable!("the output is f32"),
                }
            };
            let (lhs_data, kv_data) = (HostData::F32(lhs.clone()), HostData::F32(kv.clone()));
            let viewed = run(&lhs_data, lhs_strides.as_ref().map(|s| &s[..]), &kv_data, Some(&view_strides));
            let lhs_heads = HostData::F32(if rhs_t { heads(&lhs) } else { lhs.clone() });
            let kv_heads = HostData::F32(heads(&kv));
            let contiguous = run(&lhs_heads, None, &kv_heads, None);
            assert!(viewed.iter().zip(&contiguous).all(|(x, y)| x.to_bits() == y.to_bits()), "{b} {t} {h} {e}");
            assert_near(&viewed, &run_naive(d, &lhs_heads, &lhs_shape, &kv_heads, &view_shape));
        }
    }

    /// A linear layer's product whose transposed weight `gemm_into` copies
    /// row-major (planned, and too small to be tried): its row panels
    /// multiply by one copy of the weight and hold the whole product's bits,
    /// panel by panel, on any thread.
    #[test]
    fn panels_of_a_copied_right_operand_have_the_bits_of_the_whole_product() {
        let d = DotDims { batch: 1, m: 300, k: 520, n: 40, lhs_t: false, rhs_t: true };
        let ((x, x_shape), (w, w_shape)) = f32_operands(d, 5);
        let (x_op, w_op) = (
            DotOperand { data: &x, shape: &x_shape, strides: None },
            DotOperand { data: &w, shape: &w_shape, strides: None },
        );
        let mut whole = HostData::F32(vec![0f32; d.m * d.n]);
        dot(MatmulKernel::Gemm, d, x_op, w_op, (&mut whole, &[d.m, d.n], None)).unwrap();
        let panels = RowPanels::new(d, x_op, w_op).unwrap().expect("an f32 product runs by panels");
        assert!(panels.rhs_copy.is_some(), "the weight is copied once for all panels");
        let mut by_panels = vec![f32::NAN; d.m * d.n];
        let out = PanelOut::F32(by_panels.as_mut_ptr());
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        pool.scope(|scope| {
            for (r0, r1) in [(0, 97), (97, 200), (200, 300)] {
                let panels = &panels;
                // SAFETY: `by_panels` holds m x n values, each panel its own rows.
                scope.spawn(move |_| unsafe { panels.compute(r0, r1, out) });
            }
        });
        let HostData::F32(whole) = whole else { unreachable!("the output is f32") };
        assert!(whole.iter().zip(&by_panels).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert_near(&by_panels, &run_naive(d, &x, &x_shape, &w, &w_shape));
    }

    /// A product large enough to be tried runs whole until its trials end,
    /// then by panels through one copy of its right operand if they kept
    /// the copy, and whole again if they kept a transposed output.
    #[test]
    fn panels_follow_the_route_the_trials_kept() {
        use super::super::gemm_tuning::{pick, record, route_key, TRIALS_PER_ROUTE};
        // Shapes no other test times: a linear layer's `x W^T` (copied
        // weight) and a tall weight gradient (transposed output).
        let copied = DotDims { batch: 1, m: 264, k: 520, n: 248, lhs_t: false, rhs_t: true };
        let transposed = DotDims { batch: 1, m: 8200, k: 72, n: 66, lhs_t: true, rhs_t: false };
        for (d, planned) in [(copied, GemmRoute::CopyRhs), (transposed, GemmRoute::TransposeOutput)] {
            let ((a, a_shape), (b, b_shape)) = f32_operands(d, 7);
            let a_op = DotOperand { data: &a, shape: &a_shape, strides: None };
            let b_op = DotOperand { data: &b, shape: &b_shape, strides: None };
            let (la, lb) = (d.lhs_strides(), d.rhs_strides());
            assert_eq!(GemmRoute::of((d.m, d.k, d.n), la, lb), planned);
            let key = route_key((d.m, d.k, d.n), la, lb, matmul_parallelism(d.m * d.k * d.n));
            assert!(matches!(pick(key, planned), super::super::gemm_tuning::Pick::Timed(..)));
            assert!(RowPanels::new(d, a_op, b_op).unwrap().is_none(), "{planned:?}: runs whole while tried");
            for round in 0..2 * usize::from(TRIALS_PER_ROUTE) {
                // The planned route (candidate 0) is the faster.
                record(key, round % 2, 1.0 + (round % 2) as f64);
            }
            let panels = RowPanels::new(d, a_op, b_op).unwrap();
            match planned {
                GemmRoute::CopyRhs => {
                    let panels = panels.expect("the kept copy runs by panels");
                    assert!(panels.rhs_copy.is_some());
                    let mut by_panels = vec![f32::NAN; d.m * d.n];
                    // SAFETY: `by_panels` holds m x n values.
                    unsafe { panels.compute(0, d.m, PanelOut::F32(by_panels.as_mut_ptr())) };
                    let mut whole = HostData::F32(vec![0f32; d.m * d.n]);
                    dot(MatmulKernel::Gemm, d, a_op, b_op, (&mut whole, &[d.m, d.n], None)).unwrap();
                    let HostData::F32(whole) = whole else { unreachable!("the output is f32") };
                    assert!(whole.iter().zip(&by_panels).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
                _ => assert!(panels.is_none(), "a transposed output runs whole"),
            }
        }
    }

    /// Contiguous f32 operands of a single product `d` of uniform values
    /// from `seed`, with their stored shapes.
    fn f32_operands(d: DotDims, seed: u64) -> ((HostData, [usize; 2]), (HostData, [usize; 2])) {
        let mut values = vec![0f32; d.k * (d.m + d.n)];
        crate::random::uniform_f32(seed, 0, &mut values);
        let (a, b) = values.split_at(d.m * d.k);
        let a_shape = if d.lhs_t { [d.k, d.m] } else { [d.m, d.k] };
        let b_shape = if d.rhs_t { [d.n, d.k] } else { [d.k, d.n] };
        ((HostData::F32(a.to_vec()), a_shape), (HostData::F32(b.to_vec()), b_shape))
    }

    /// Every value within f32 rounding of the reference's.
    fn assert_near(values: &[f32], reference: &[f32]) {
        for (x, y) in values.iter().zip(reference) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    /// The reference product of contiguous f32 operands.
    fn run_naive(d: DotDims, lhs: &HostData, lhs_shape: &[usize], rhs: &HostData, rhs_shape: &[usize]) -> Vec<f32> {
        let mut out = HostData::F32(vec![0f32; d.batch * d.m * d.n]);
        let lhs = DotOperand { data: lhs, shape: lhs_shape, strides: None };
        let rhs = DotOperand { data: rhs, shape: rhs_shape, strides: None };
        dot(MatmulKernel::Naive, d, lhs, rhs, (&mut out, &[d.batch, d.m, d.n], None)).unwrap();
        match out {
            HostData::F32(v) => v,
            _ => unreachable!("the output is f32"),
        }
    }
}
