//! The `gemm` crate call every f32/f64 product goes through (the plain
//! batched products and the widened bf16/f16 ones), and how many threads a
//! product of a given size gets.

use super::gemm_tuning;
use super::numeric::Real;

/// A matrix operand for [`gemm_into`]: its first element and its
/// `(row stride, column stride)` in elements.
#[derive(Clone, Copy)]
pub(crate) struct GemmOperand<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

// SAFETY: an operand is only read, by the threads of one product.
unsafe impl<T: Sync> Send for GemmOperand<T> {}

impl<T> GemmOperand<T> {
    /// The operand from row `row` on.
    ///
    /// # Safety
    /// The row lies inside the operand's buffer.
    unsafe fn rows_from(self, row: usize) -> GemmOperand<T> {
        GemmOperand { ptr: self.ptr.add(row * self.rs), ..self }
    }

    /// The operand from column `column` on.
    ///
    /// # Safety
    /// The column lies inside the operand's buffer.
    unsafe fn columns_from(self, column: usize) -> GemmOperand<T> {
        GemmOperand { ptr: self.ptr.add(column * self.cs), ..self }
    }
}

/// A right operand stored transposed (`k` contiguous, as in a linear
/// layer's `x W^T`) is copied row-major first when `k` is at least this
/// long and the product has at least [`TRANSPOSE_RHS_FROM_M`] rows: `gemm`
/// packs such an operand slowly when `k` is long (BERT-base's feed-forward
/// output, `[1024, 3072] x [768, 3072]^T`: 15.9 ms against 11.0 ms with the
/// operand row-major on a 2-core Zen 5; there no faster at `k` = 2048 and
/// the same at 1024), and the copy takes about 1.5 ms. On a 2-core Zen 4
/// (AMD EPYC Genoa) the copy also won at 1024 and 2048: BERT-small's
/// `[2048, 2048] x [512, 2048]^T` 21.1 against 22.2 ms, BERT-mini's
/// `[4096, 1024] x [256, 1024]^T` 10.3 against 10.8, `[440, 2048] x [512,
/// 2048]^T` 5.7 against 7.1. With the copy through registers it also won
/// at 512, operands from memory on 2 threads: BERT-small's `[2048, 512] x
/// [512, 512]^T` 4.88 against 5.48 ms, `[2048, 512] x [2048, 512]^T` 20.4
/// against 21.5, `[440, 512] x [2048, 512]^T` 4.7 against 5.6 (at 256 it
/// did not: `[4096, 256] x [256, 256]^T` 2.44-2.61 against 2.54). Each
/// large product tries both on the machine it runs on ([`gemm_tuning`]),
/// so the threshold only says where trying is worth it. A product with an
/// epilogue runs by row panels along the route its trials keep (or its
/// planned copy, when it is too small to try), each panel multiplying by
/// one shared copy when the route copies
/// ([`super::dot::RowPanels`], [`RowMajorCopy`]). The values are the same
/// bits: `gemm` packs either layout into the same panels.
const TRANSPOSE_RHS_FROM_K: usize = 512;
/// See [`TRANSPOSE_RHS_FROM_K`]: the copy is paid once per call, the time
/// it saves grows with the rows.
const TRANSPOSE_RHS_FROM_M: usize = 256;

/// True when [`gemm_into`] copies a right operand with strides `(rs, cs)`
/// row-major before an `m x k x n` product (see [`TRANSPOSE_RHS_FROM_K`]).
fn copies_rhs((m, k, n): (usize, usize, usize), (rs, cs): (usize, usize)) -> bool {
    rs == 1 && cs >= k && n > 1 && k >= TRANSPOSE_RHS_FROM_K && m >= TRANSPOSE_RHS_FROM_M
}

/// The widest output (in columns) that [`gemm_into`] computes column-major
/// and then transposes: a product far taller than wide whose left operand
/// is column-major, the gradient `dY^T X` of a vocabulary-sized decoder
/// weight above all. `gemm` runs such a product 1.2-1.9x faster when its
/// output is column-major (on a 2-core Intel Xeon, 2 threads: `[4096,
/// 8192]^T x [4096, 128]` 62 -> 37 ms, `[800, 8192]^T x [800, 128]` 11.5
/// -> 7.8 ms, `[800, 30522]^T x [800, 256]` 77 -> 53 ms, `[2048, 8192]^T
/// x [2048, 512]` in BERT-small's step 1.42-1.45x the time of the logits'
/// product of the same size -> 1.17-1.29x, transpose included; not slower
/// at 8000 columns or at `k` = 800). The transpose takes about 1 ms per 4
/// MiB; at 768 columns it ate the gain (`[800, 30522]^T x [800, 768]`).
const TRANSPOSED_OUTPUT_MAX_N: usize = 512;
/// See [`TRANSPOSED_OUTPUT_MAX_N`]: the narrowest output it applies to (the
/// width it was measured at).
const TRANSPOSED_OUTPUT_MIN_N: usize = 64;
/// See [`TRANSPOSED_OUTPUT_MAX_N`]: at least this many times as many rows as
/// columns (at 4 the row-major output was faster; 16 is BERT-small's
/// decoder, 8192 x 512).
const TRANSPOSED_OUTPUT_MIN_ASPECT: usize = 16;

/// True when [`gemm_into`] computes an `m x k x n` product with a left
/// operand of strides `a` and a right one of strides `b` column-major and
/// transposes it into the output (see [`TRANSPOSED_OUTPUT_MAX_N`]).
fn transposes_output((m, _, n): (usize, usize, usize), a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 == 1
        && b.1 == 1
        && (TRANSPOSED_OUTPUT_MIN_N..=TRANSPOSED_OUTPUT_MAX_N).contains(&n)
        && m >= TRANSPOSED_OUTPUT_MIN_ASPECT * n
}

/// The shortest shared dimension `k` that [`gemm_into`] splits in two
/// halves, each computed on its own share of the threads and then added:
/// `gemm` shares a product's work between threads by blocks of the output,
/// and an output that is small next to `k` (a weight's gradient `X^T dY`
/// summed over every token of the batch, or the masked-LM head's input
/// gradient summed over the vocabulary) leaves its two threads poorly used.
/// Measured on a 2-core Intel Xeon with the pool's threads kept awake as
/// in a step, `gemm` on 2 threads against the split (`m x k x n`): `128 x
/// 4096 x 128` 1.00 -> 0.73 ms, `128 x 4096 x 512` 2.91 -> 2.35, `512 x
/// 2048 x 512` 4.85 -> 4.17, `2048 x 2048 x 512` 23.9 -> 19.6, `768 x 1024
/// x 768` 6.1 -> 4.9, `800 x 8192 x 128` 12.0 -> 6.7, `160 x 30522 x 768`
/// 39 -> 35; on one thread the two halves take what one product does.
/// Products with `k` shorter than `m` or `n` were no faster (`3072 x 1024
/// x 768` 1.01x), nor with a transposed right operand (a linear layer's
/// `x W^T`: `2048 x 2048 x 512` 0.97x). The halves do not depend on the
/// thread count, so neither do the bits.
const SPLIT_K_FROM: usize = 1024;

/// True when [`gemm_into`] splits the shared dimension of an `m x k x n`
/// product with a right operand of strides `b` (see [`SPLIT_K_FROM`]).
fn splits_k((m, k, n): (usize, usize, usize), b: (usize, usize)) -> bool {
    b.1 == 1 && k >= SPLIT_K_FROM && k >= m && k >= n && m * n * k >= PARALLEL_FLOPS
}

/// How [`gemm_into`] runs a product: straight into the output, through a
/// thread-local scratch copy for a layout `gemm` handles slowly, or as two
/// halves of its shared dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GemmRoute {
    /// `gemm` writes the row-major output directly.
    Direct,
    /// The right operand is copied row-major first ([`copies_rhs`]).
    CopyRhs,
    /// The product is computed column-major and transposed into the output
    /// ([`transposes_output`]).
    TransposeOutput,
    /// Each half of the shared dimension is one product (of the routes
    /// above), on half the threads, and the second is added to the first
    /// ([`splits_k`]).
    SplitK,
}

impl GemmRoute {
    /// The route of an `m x k x n` product with a left operand of strides
    /// `a` and a right one of strides `b` (a split's right operand is
    /// row-major, so it is never one that [`copies_rhs`] copies).
    pub(crate) fn of(dims: (usize, usize, usize), a: (usize, usize), b: (usize, usize)) -> GemmRoute {
        if splits_k(dims, b) {
            GemmRoute::SplitK
        } else {
            GemmRoute::unsplit(dims, a, b)
        }
    }

    /// [`GemmRoute::of`] for a product whose shared dimension is not split:
    /// a half of a split one.
    fn unsplit(dims: (usize, usize, usize), a: (usize, usize), b: (usize, usize)) -> GemmRoute {
        if copies_rhs(dims, b) {
            GemmRoute::CopyRhs
        } else if transposes_output(dims, a, b) {
            GemmRoute::TransposeOutput
        } else {
            GemmRoute::Direct
        }
    }

    /// True when the product must run whole: a copy of a whole operand or
    /// of the whole output sits between `gemm` and the caller's rows, or
    /// every output row sums two halves.
    pub(crate) fn runs_whole(self) -> bool {
        match self {
            GemmRoute::Direct => false,
            GemmRoute::CopyRhs | GemmRoute::TransposeOutput | GemmRoute::SplitK => true,
        }
    }
}

thread_local! {
    /// This thread's row-major copies of transposed right operands (8-byte
    /// words holding f32 or f64 values), kept between products (`gemm`'s
    /// and the attention-head kernel's).
    pub(super) static ROW_MAJOR_RHS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's column-major products (see [`transposes_output`]), as
    /// 8-byte words, kept between products.
    static COLUMN_MAJOR_OUT: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's products of second halves (see [`splits_k`]), as 8-byte
    /// words, kept between products.
    static SECOND_HALF: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on `len` values of `T` in `cell`'s buffer, grown as needed (their
/// contents are unspecified). The buffer is taken out of `cell` meanwhile:
/// a thread waiting for the other half of a split product may run another
/// product that needs the same kind of scratch (it then gets a new one).
pub(super) fn with_scratch<T: Real, R>(
    cell: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u64>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut words = take_scratch::<T>(cell, len);
    // SAFETY: `words` holds at least `len` values of `T` (a float of at most
    // 8 bytes, aligned to at most 8, for which any bits are a value).
    let result = f(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) });
    cell.set(words);
    result
}

/// `cell`'s buffer taken out of it, grown to hold at least `len` values of
/// `T` (the caller puts it back).
fn take_scratch<T>(cell: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u64>>>, len: usize) -> Vec<u64> {
    let mut words = cell.take();
    let word_len = (len * std::mem::size_of::<T>()).div_ceil(8);
    if words.len() < word_len {
        words.resize(word_len, 0);
    }
    words
}

/// `out = a x b` for an `m x k` and a `k x n` matrix through `gemm`, `out`
/// row-major `m x n` (overwritten, not read). Layouts that `gemm` handles
/// slowly go through a copy on the way, and a long shared dimension is
/// split ([`GemmRoute::of`]); a copy planned for a large product is first
/// tried against the direct call on this machine ([`gemm_tuning`]).
///
/// # Safety
/// `a` and `b` address every element of their matrices inside live
/// buffers, `out` holds `m * n` elements, and `out` aliases neither.
pub(crate) unsafe fn gemm_into<T: Real + Send + Sync + 'static>(
    dims: (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    let planned = GemmRoute::of(dims, (a.rs, a.cs), (b.rs, b.cs));
    if !gemm_tuning::tried(planned, dims) {
        return gemm_routed(planned, dims, a, b, out, parallelism);
    }
    let key = gemm_tuning::route_key(dims, (a.rs, a.cs), (b.rs, b.cs), parallelism);
    match gemm_tuning::pick(key, planned) {
        gemm_tuning::Pick::Untimed(route) => gemm_routed(route, dims, a, b, out, parallelism),
        gemm_tuning::Pick::Timed(route, index) => {
            let started = std::time::Instant::now();
            gemm_routed(route, dims, a, b, out, parallelism);
            gemm_tuning::record(key, index, started.elapsed().as_secs_f64());
        }
    }
}

/// [`gemm_into`] along `route`.
///
/// # Safety
/// As for [`gemm_into`].
pub(crate) unsafe fn gemm_routed<T: Real + Send + Sync + 'static>(
    route: GemmRoute,
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    debug_assert!(out.len() >= m * n);
    match route {
        GemmRoute::CopyRhs => with_scratch(&ROW_MAJOR_RHS, k * n, |copy: &mut [T]| {
            // SAFETY: the caller's: column `j` of `b` is `k` values from `b.ptr + j * b.cs`.
            transpose_columns(b.ptr, b.cs, (k, n), copy, parallelism);
            let b = GemmOperand { ptr: copy.as_ptr(), rs: n, cs: 1 };
            gemm_row_major((m, k, n), a, b, out, parallelism)
        }),
        GemmRoute::TransposeOutput => with_scratch(&COLUMN_MAJOR_OUT, m * n, |columns: &mut [T]| {
            gemm_call((m, k, n), a, b, (columns.as_mut_ptr(), (1, m)), parallelism);
            // SAFETY: column `j` of the product is the `m` values from `columns[j * m]`.
            transpose_columns(columns.as_ptr(), m, (m, n), out, parallelism)
        }),
        GemmRoute::SplitK => with_scratch(&SECOND_HALF, m * n, |second: &mut [T]| {
            let half = k / 2;
            // SAFETY: the caller's: `half < k` is a column of `a` and a row of `b`.
            let (a2, b2) = (a.columns_from(half), b.rows_from(half));
            let first = &mut out[..m * n];
            let unsplit = |k| GemmRoute::unsplit((m, k, n), (a.rs, a.cs), (b.rs, b.cs));
            let (route1, route2) = (unsplit(half), unsplit(k - half));
            match parallelism {
                gemm::Parallelism::Rayon(threads) if threads > 1 => {
                    let each = gemm_parallelism(m * n * half, threads / 2);
                    let (one, two) = (&mut *first, &mut *second);
                    rayon::join(
                        // SAFETY: as above; `one` and `two` hold m x n each.
                        move || unsafe { gemm_routed(route1, (m, half, n), a, b, one, each) },
                        move || unsafe { gemm_routed(route2, (m, k - half, n), a2, b2, two, each) },
                    );
                    add_into(first, second, threads);
                }
                gemm::Parallelism::Rayon(_) | gemm::Parallelism::None => {
                    gemm_routed(route1, (m, half, n), a, b, first, parallelism);
                    gemm_routed(route2, (m, k - half, n), a2, b2, second, parallelism);
                    add_into(first, second, 1);
                }
            }
        }),
        GemmRoute::Direct => gemm_row_major((m, k, n), a, b, out, parallelism),
    }
}

/// `sum[i] += addend[i]`, on up to `threads` threads.
fn add_into<T: Real + Send + Sync>(sum: &mut [T], addend: &[T], threads: usize) {
    super::split::zip_in_parts(addend, sum, threads, |addend, sum| {
        sum.iter_mut().zip(addend).for_each(|(s, &a)| *s = *s + a)
    });
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
        #[cfg(target_arch = "x86_64")]
        if std::mem::size_of::<T>() == 4 && super::simd::avx512() {
            // SAFETY: AVX-512 F is present; `T` is a 4-byte float, moved as
            // its bits; the columns' words are the caller's, `rows` holds
            // the block's `rows.len() / n` rows of `n`.
            unsafe {
                let src = (b.at(k0) as *const u32, cs);
                let dst = (rows.as_mut_ptr() as *mut u32, n);
                super::simd::transpose_words(src, dst, (rows.len() / n, n));
            }
            return;
        }
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

/// A row-major copy of a transposed f32 right operand, made once for all
/// the row panels of a product ([`super::dot::RowPanels`]) that the
/// trials routed through [`GemmRoute::CopyRhs`]: each panel then calls
/// `gemm` directly on the copy, with the bits of the whole product. The
/// copy lives in the [`ROW_MAJOR_RHS`] buffer of the thread that makes it,
/// taken out while the copy lives and put back into the buffer of the
/// thread that drops it (the same one, in `RowPanels`).
pub(crate) struct RowMajorCopy {
    /// The buffer's words, `k * n` f32 values of them the copy.
    words: Vec<u64>,
    /// Columns of the copy (its row stride).
    n: usize,
}

impl RowMajorCopy {
    /// Copy the `k x n` operand `b` (column `j` is `k` contiguous values
    /// from `b.ptr + j * b.cs`) row-major, on the threads `parallelism`
    /// allows.
    ///
    /// # Safety
    /// `b.rs` is 1 and every column of `b` lies inside a live buffer.
    pub(crate) unsafe fn new(b: GemmOperand<f32>, (k, n): (usize, usize), parallelism: gemm::Parallelism) -> Self {
        debug_assert_eq!(b.rs, 1, "a transposed operand");
        let mut words = take_scratch::<f32>(&ROW_MAJOR_RHS, k * n);
        // SAFETY: `words` holds at least `k * n` f32 values (any bits are one).
        let copy = std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<f32>(), k * n);
        transpose_columns(b.ptr, b.cs, (k, n), copy, parallelism);
        RowMajorCopy { words, n }
    }

    /// The copy as a row-major operand (valid while `self` lives).
    pub(crate) fn operand(&self) -> GemmOperand<f32> {
        GemmOperand { ptr: self.words.as_ptr().cast(), rs: self.n, cs: 1 }
    }
}

impl Drop for RowMajorCopy {
    fn drop(&mut self) {
        ROW_MAJOR_RHS.set(std::mem::take(&mut self.words));
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

/// The most bytes of packed left-operand rows one `gemm` call may hold:
/// `gemm` packs a row-major product's left operand, up to [`PACKED_DEPTH`]
/// columns of every row at once, into a buffer it allocates on each call.
/// Above 32 MiB the C allocator maps such a buffer afresh every time and
/// unmaps it on return, so every call faults in every page of it again:
/// BERT-base's decoder weight gradient (`[1024, 30522]^T x [1024, 768]`)
/// packed 62 MB per step, about 15 000 page faults (Intel Xeon virtual
/// machine, `/usr/bin/time` over 2 and 5 steps). Computed in blocks of
/// rows, each block's buffer stays below that, and the allocator keeps the
/// freed memory for the next block and step: 3-4 faults per step (`bench
/// --json`'s `page_faults_per_step`), and in three interleaved profiled
/// runs the product took 1.20x (1.12-1.26) the time of the logits' product
/// of the same size instead of 1.44x (1.24-1.76).
const PACKED_ROWS_MAX_BYTES: usize = 16 << 20;

/// The most columns of the left operand `gemm` packs at a time (its `kc`,
/// 512 on every x86-64 cache layout for a shared dimension of 512 or more).
const PACKED_DEPTH: usize = 512;

/// Rows of the left operand per `gemm` call for a shared dimension `k` (see
/// [`PACKED_ROWS_MAX_BYTES`]), a multiple of 64.
fn rows_per_call<T>(k: usize) -> usize {
    let row_bytes = k.clamp(1, PACKED_DEPTH) * std::mem::size_of::<T>();
    (PACKED_ROWS_MAX_BYTES / row_bytes / 64 * 64).max(64)
}

/// `out = a x b` into a row-major `out`, in blocks of [`rows_per_call`]
/// rows. A block's rows are the whole product's, bit for bit: `gemm` sums
/// every output element over the shared dimension in the same order
/// whatever the number of rows.
///
/// # Safety
/// As for [`gemm_into`].
unsafe fn gemm_row_major<T: Real + 'static>(
    dims: (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
) {
    gemm_in_row_blocks(dims, a, b, out, parallelism, rows_per_call::<T>(dims.1))
}

/// [`gemm_row_major`] in blocks of `block` rows.
///
/// # Safety
/// As for [`gemm_into`].
unsafe fn gemm_in_row_blocks<T: Real + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    out: &mut [T],
    parallelism: gemm::Parallelism,
    block: usize,
) {
    let block = block.max(1);
    for first in (0..m).step_by(block) {
        let rows = block.min(m - first);
        let out = out[first * n..].as_mut_ptr();
        // SAFETY: the caller's; `first < m` is a row of `a` and of `out`.
        gemm_call((rows, k, n), a.rows_from(first), b, (out, (n, 1)), parallelism);
    }
}

/// The `gemm` call itself, writing the `m x n` product from `out.0` with
/// `(row stride, column stride)` `out.1`.
///
/// # Safety
/// As for [`gemm_into`]; `out` addresses every element of the product.
unsafe fn gemm_call<T: Real + 'static>(
    (m, k, n): (usize, usize, usize),
    a: GemmOperand<T>,
    b: GemmOperand<T>,
    (out, (out_rs, out_cs)): (*mut T, (usize, usize)),
    parallelism: gemm::Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        out,
        out_cs as isize,
        out_rs as isize,
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

/// The smallest product (multiply-adds) that [`gemm_parallelism`] gives
/// more than one thread.
const PARALLEL_FLOPS: usize = 1 << 21;

/// [`matmul_parallelism`] with at most `threads` threads.
pub(crate) fn gemm_parallelism(flops: usize, threads: usize) -> gemm::Parallelism {
    if threads > 1 && flops >= PARALLEL_FLOPS {
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
        unsafe { gemm_call((m, k, n), x, y, (in_place.as_mut_ptr(), (n, 1)), gemm::Parallelism::None) };
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

    /// A tall, narrow product with a column-major left operand (computed
    /// column-major and transposed) gives the bits of the product written
    /// row-major in place, on one thread and on two, with a left operand
    /// whose columns are longer than `m` (a view of a wider matrix).
    #[test]
    fn transposing_a_tall_narrow_output_changes_no_bits() {
        let (m, k, n) = (TRANSPOSED_OUTPUT_MIN_ASPECT * TRANSPOSED_OUTPUT_MIN_N + 5, 37, TRANSPOSED_OUTPUT_MIN_N);
        let a_cs = m + 3;
        assert!(transposes_output((m, k, n), (1, a_cs), (n, 1)));
        assert!(!transposes_output((m, k, n), (k, 1), (n, 1)) && !transposes_output((m - 10, k, n), (1, a_cs), (n, 1)));
        let a: Vec<f32> = (0..k * a_cs).map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5).collect();
        let operands =
            || (GemmOperand { ptr: a.as_ptr(), rs: 1, cs: a_cs }, GemmOperand { ptr: b.as_ptr(), rs: n, cs: 1 });
        for parallelism in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
            let mut in_place = vec![0f32; m * n];
            let (x, y) = operands();
            // SAFETY: both operands address their buffers, the output holds m x n.
            unsafe { gemm_call((m, k, n), x, y, (in_place.as_mut_ptr(), (n, 1)), parallelism) };
            let mut transposed = vec![0f32; m * n];
            let (x, y) = operands();
            // SAFETY: as above.
            unsafe { gemm_into((m, k, n), x, y, &mut transposed, parallelism) };
            assert!(transposed.iter().zip(&in_place).all(|(t, p)| t.to_bits() == p.to_bits()), "{parallelism:?}");
            let reference: f64 = (0..k).map(|p| f64::from(a[p * a_cs + m - 2]) * f64::from(b[p * n + 7])).sum();
            assert!((f64::from(transposed[(m - 2) * n + 7]) - reference).abs() < 1e-4, "the product itself");
        }
    }

    /// The routes a product's trials choose between give the same bits
    /// over several of `gemm`'s `k` blocks, on one thread and on two: a
    /// tall product with a column-major left operand computed column-major,
    /// and a product with a transposed right operand copied row-major,
    /// against the direct call.
    #[test]
    fn tried_routes_give_the_direct_bits_over_long_shared_dimensions() {
        let k = 2 * PACKED_DEPTH + 77;
        let values = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| (((i + seed) * 7919) % 1000) as f32 / 997.0 - 0.5).collect()
        };
        let (m, n) = (2 * TRANSPOSED_OUTPUT_MIN_ASPECT * TRANSPOSED_OUTPUT_MIN_N + 3, TRANSPOSED_OUTPUT_MIN_N + 1);
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let tall = (GemmOperand { ptr: a.as_ptr(), rs: 1, cs: m }, GemmOperand { ptr: b.as_ptr(), rs: n, cs: 1 });
        let (m2, n2) = (70, 90);
        let (c, d) = (values(m2 * k, 3), values(k * n2, 4));
        let transposed_rhs =
            (GemmOperand { ptr: c.as_ptr(), rs: k, cs: 1 }, GemmOperand { ptr: d.as_ptr(), rs: 1, cs: k });
        for ((mm, nn), (x, y), route) in
            [((m, n), tall, GemmRoute::TransposeOutput), ((m2, n2), transposed_rhs, GemmRoute::CopyRhs)]
        {
            for parallelism in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                let (mut direct, mut routed) = (vec![0f32; mm * nn], vec![0f32; mm * nn]);
                // SAFETY: both operands address their buffers, the outputs hold mm x nn.
                unsafe {
                    gemm_routed(GemmRoute::Direct, (mm, k, nn), x, y, &mut direct, parallelism);
                    gemm_routed(route, (mm, k, nn), x, y, &mut routed, parallelism);
                }
                assert!(
                    direct.iter().zip(&routed).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{route:?} {parallelism:?}"
                );
            }
        }
    }

    /// A product computed in blocks of rows gives the bits of the product
    /// computed whole, on one thread and on two, blocks of uneven size and a
    /// shared dimension longer than `gemm` packs at once included; BERT's
    /// vocabulary-sized left operands are split, a layer's are not.
    #[test]
    fn a_product_in_blocks_of_rows_changes_no_bits() {
        let (m, k, n) = (300, PACKED_DEPTH + 190, 70);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5).collect();
        let cases = [
            (GemmOperand { ptr: a.as_ptr(), rs: k, cs: 1 }, "row-major"),
            (GemmOperand { ptr: a.as_ptr(), rs: 1, cs: m }, "column-major"),
        ];
        let y = GemmOperand { ptr: b.as_ptr(), rs: n, cs: 1 };
        for (x, layout) in cases {
            for parallelism in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                let mut whole = vec![0f32; m * n];
                // SAFETY: both operands address their buffers, the output holds m x n.
                unsafe { gemm_call((m, k, n), x, y, (whole.as_mut_ptr(), (n, 1)), parallelism) };
                let mut blocks = vec![0f32; m * n];
                // SAFETY: as above.
                unsafe { gemm_in_row_blocks((m, k, n), x, y, &mut blocks, parallelism, 128) };
                assert!(blocks.iter().zip(&whole).all(|(p, q)| p.to_bits() == q.to_bits()), "{layout} {parallelism:?}");
            }
        }
        assert_eq!(rows_per_call::<f32>(1024), 8192, "BERT-base's decoder gradient: 30522 rows in 4 calls");
        assert!(
            rows_per_call::<f32>(768) >= 4096 && rows_per_call::<f32>(3072) >= 4096,
            "a layer's tokens in one call"
        );
        assert_eq!(rows_per_call::<f32>(0), rows_per_call::<f32>(1));
    }

    /// A product with a long shared dimension is split in two halves whose
    /// sum it returns, bit for bit, on one thread and on two (also with a
    /// left operand read transposed from a wider matrix), within rounding of
    /// the f64 product; a transposed right operand or a `k` shorter than the
    /// output is not split.
    #[test]
    fn a_long_shared_dimension_is_summed_from_two_halves_on_any_thread_count() {
        let (m, k, n) = (47, SPLIT_K_FROM + 7, 50);
        assert!(splits_k((m, k, n), (n, 1)) && !splits_k((m, k, n), (1, k)));
        assert!(!splits_k((k + 1, k, n), (n, 1)) && !splits_k((m, SPLIT_K_FROM - 1, n), (n, 1)));
        let a_cs = m + 3;
        let a: Vec<f32> = (0..k * a_cs).map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5).collect();
        let (x, y) = (GemmOperand { ptr: a.as_ptr(), rs: 1, cs: a_cs }, GemmOperand { ptr: b.as_ptr(), rs: n, cs: 1 });
        assert_eq!(GemmRoute::of((m, k, n), (x.rs, x.cs), (y.rs, y.cs)), GemmRoute::SplitK);
        let half = k / 2;
        let (mut first, mut second) = (vec![0f32; m * n], vec![0f32; m * n]);
        // SAFETY: both operands address their buffers (the halves from column
        // and row `half`), the outputs hold m x n.
        unsafe {
            gemm_call((m, half, n), x, y, (first.as_mut_ptr(), (n, 1)), gemm::Parallelism::None);
            let (x2, y2) = (x.columns_from(half), y.rows_from(half));
            gemm_call((m, k - half, n), x2, y2, (second.as_mut_ptr(), (n, 1)), gemm::Parallelism::None);
        }
        let halves: Vec<f32> = first.iter().zip(&second).map(|(p, q)| p + q).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for parallelism in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
            let mut split = vec![0f32; m * n];
            // SAFETY: as above.
            let out = &mut split;
            pool.install(move || unsafe { gemm_into((m, k, n), x, y, out, parallelism) });
            assert!(split.iter().zip(&halves).all(|(s, h)| s.to_bits() == h.to_bits()), "{parallelism:?}");
            let reference: f64 = (0..k).map(|p| f64::from(a[p * a_cs + m - 2]) * f64::from(b[p * n + 7])).sum();
            assert!((f64::from(split[(m - 2) * n + 7]) - reference).abs() < 1e-3, "the product itself");
        }
    }
}
