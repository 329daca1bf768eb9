//! bf16 matmul on AVX-512 BF16: `vdpbf16ps` multiplies pairs of bf16 values
//! and accumulates them into f32 lanes, 32 products per instruction.
//!
//! A classic packed GEMM: the right operand is packed into strips of
//! [`NR`] columns with each pair of consecutive `k` rows interleaved (the
//! layout `vdpbf16ps` reads), the left operand into strips of [`MR`] rows
//! whose `k` pairs are broadcast as 32-bit words; the micro-kernel keeps an
//! `MR x NR` f32 tile in registers over the whole `k` and is stored once
//! (rounded to bf16 when the output is bf16). Block sizes keep a packed
//! strip of each operand in the L1/L2 caches; rows (or, for short
//! matrices, columns) are split between the pool's threads.
//!
//! Products of bf16 values are exact in f32; the sums are rounded as the
//! instruction rounds them (round to nearest even, denormals flushed), so
//! results equal an f32 matmul of the same bf16 inputs within f32 rounding.
//!
//! On CPUs whose `vdpbf16ps` runs at half the f32 FMA rate (see
//! `bf16_arithmetic`), the same packing writes each pair as its two values
//! widened to f32 (two words where there was one; `k` blocks half as long,
//! the same bytes), the left operand is always packed, and an FMA
//! micro-kernel multiplies them: an f32 matmul of the bf16 inputs.

use super::bf16_arithmetic::{arithmetic, micro_kernel_fma, Arithmetic};
use super::numeric::bf16_from_f32;
use half::bf16;

/// Pairs of `k` ahead of the one being packed whose values the packing
/// loops of row-major right operands and transposed left ones ask the CPU
/// to load ([`crate::kernels::simd::prefetch`]): each pair is two short
/// runs a row apart, which the hardware prefetchers do not run ahead of
/// when the operand comes from memory. A weight gradient `X^T dY` with
/// both operands out of cache (`[2048, 512]^T x [2048, 2048]`, median of
/// 300 on a 2-core AMD EPYC Genoa): 12.0–13.2 ms without, 11.5–11.6 with.
const PREFETCH_PAIRS: usize = 4;

/// Rows of the register tile.
pub(crate) const MR: usize = 8;
/// Columns of the register tile (two vectors of 16 f32).
pub(crate) const NR: usize = 32;
/// Pairs of `k` per block: packed strips stay in L1/L2 however long `k` is
/// (a left strip of 32 KiB, a right one of 128 KiB). Products with `k` =
/// 2 048, operands from memory, 2 threads, six interleaved runs each on a
/// 2-core AMD EPYC Genoa (GFLOP/s at 512 pairs → 1 024): `[2048, 2048] x
/// [2048, 512]` 401 → 426, with the right operand transposed 410 → 426,
/// `[2048, 512]^T x [2048, 2048]` 385 → 403, `[2048, 512]^T x [2048, 512]`
/// 350 → 351. Partial sums are kept in f32 between blocks, so the block
/// length never changes the bits.
const KC_PAIRS: usize = 1024;
/// Packed-operand budgets in bytes: a left block, a right block (together
/// within a 1 MiB L2). A weight gradient `[2048, 512]^T x [2048, 512]`,
/// operands from memory, 2 threads, interleaved probe runs on a 2-core AMD
/// EPYC Genoa: 319–356 GFLOP/s with a 192 KiB left block, 360–370 with
/// 384 KiB (each thread's 256 rows in 3 blocks instead of 6, so the right
/// operand streams through L2 half as often); larger products unchanged.
const A_BLOCK_BYTES: usize = 384 * 1024;
const B_BLOCK_BYTES: usize = 512 * 1024;

/// True when this CPU runs this kernel (AVX-512 BF16), multiplying as
/// [`arithmetic`] says: `vdpbf16ps`, or FMA on widened values.
pub(crate) fn available() -> bool {
    arithmetic().is_some()
}

/// A logical matrix inside a bf16 buffer: element `(i, j)` is at
/// `offset + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub data: &'a [bf16],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl View<'_> {
    #[inline(always)]
    pub(super) fn bits(&self, i: usize, j: usize) -> u32 {
        u32::from(self.data[self.offset + i * self.rs + j * self.cs].to_bits())
    }
}

/// Where the product goes: a row-major `m x n` matrix of f32 or bf16.
pub(crate) enum Out<'a> {
    /// f32 results (the tests compare them with an f64 reference; the IR's
    /// bf16 matmul has a bf16 output).
    #[cfg_attr(not(test), allow(dead_code))]
    F32(&'a mut [f32]),
    /// Results rounded to bf16 (nearest even).
    BF16(&'a mut [bf16]),
}

/// The output as raw parts, shared by threads that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) enum OutPtr {
    F32(*mut f32),
    BF16(*mut bf16),
}

// SAFETY: threads of one product write disjoint elements.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out = a x b` for `m x k` and `k x n` views, on up to `threads` threads.
/// Only call when [`available`] says so.
pub(crate) fn matmul(m: usize, k: usize, n: usize, a: View, b: View, out: Out, threads: usize) {
    let arithmetic = arithmetic().expect("callers check `available`");
    matmul_with(arithmetic, (m, k, n), a, b, out, threads);
}

/// [`matmul`] with the given arithmetic, which this CPU supports.
pub(crate) fn matmul_with(
    arithmetic: Arithmetic,
    (m, k, n): (usize, usize, usize),
    a: View,
    b: View,
    out: Out,
    threads: usize,
) {
    let ptr = match out {
        Out::F32(o) => {
            assert!(o.len() >= m * n, "the output holds the product");
            OutPtr::F32(o.as_mut_ptr())
        }
        Out::BF16(o) => {
            assert!(o.len() >= m * n, "the output holds the product");
            OutPtr::BF16(o.as_mut_ptr())
        }
    };
    // SAFETY: the output holds the `m x n` product (asserted above), rows
    // `n` apart, and is borrowed mutably here.
    unsafe { matmul_rows(arithmetic, (m, k, n), a, b, (ptr, n), threads) }
}

/// [`matmul`] into rows of the output `out_rs` apart from `out`: a matrix
/// of a batched product stored straight into the layout of a permute that
/// reads it (the attention's heads into their tokens' rows).
///
/// # Safety
/// [`available`] says so; the `m` rows of `n` values from `out`, `out_rs`
/// apart, lie inside one buffer that nobody else touches there meanwhile.
pub(crate) unsafe fn matmul_strided(
    (m, k, n): (usize, usize, usize),
    a: View,
    b: View,
    out: (OutPtr, usize),
    threads: usize,
) {
    let arithmetic = arithmetic().expect("callers check `available`");
    matmul_rows(arithmetic, (m, k, n), a, b, out, threads)
}

/// [`matmul_with`] into rows `out_rs` apart from `out`.
///
/// # Safety
/// As for [`matmul_strided`], for `arithmetic`.
unsafe fn matmul_rows(
    arithmetic: Arithmetic,
    (m, k, n): (usize, usize, usize),
    a: View,
    b: View,
    (ptr, out_rs): (OutPtr, usize),
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if arithmetic == Arithmetic::Tiles {
        // SAFETY: `Tiles` is chosen only where `dot_amx::enable` succeeded;
        // the caller's rows hold the output.
        unsafe { super::dot_amx::matmul((m, k, n), a, b, (ptr, out_rs), threads) };
        return;
    }
    let parts = threads.clamp(1, 8);
    let work = m * n * k;
    if parts == 1 || work < 1 << 20 {
        // SAFETY: the caller checked the CPU; the ranges cover the output once.
        unsafe { block(&Geometry::of(k, arithmetic), out_rs, a, b, ptr, 0..m, 0..n, &Shared::None) };
        return;
    }
    // Split the longer side between the threads. The operand along the
    // other side is the same for every thread: pack it once, each thread
    // packing a share of its strips, instead of once per thread (a left
    // operand read in place needs no packing).
    let split_rows = m >= n;
    let (len, unit) = if split_rows { (m, MR) } else { (n, NR) };
    let chunk = len.div_ceil(parts).div_ceil(unit) * unit;
    let geometry = Geometry::of(k, arithmetic);
    let words = geometry.words;
    let shared = match split_rows {
        true => {
            let pack = |cols, p0, pairs, out: &mut [u32]| pack_b(&b, (k, words), cols, p0, pairs, out);
            Shared::B(prepack(&geometry, (n, geometry.nc, NR), parts, &pack))
        }
        false if geometry.reads_in_place(&a) => Shared::None,
        false => {
            let pack = |rows, p0, pairs, out: &mut [u32]| pack_a(&a, (k, words), rows, p0, pairs, out);
            Shared::A(prepack(&geometry, (m, geometry.mc, MR), parts, &pack))
        }
    };
    rayon::scope(|s| {
        let (shared, geometry) = (&shared, &geometry);
        for start in (0..len).step_by(chunk) {
            let range = start..(start + chunk).min(len);
            s.spawn(move |_| {
                let (rows, cols) = if split_rows { (range, 0..n) } else { (0..m, range) };
                // SAFETY: as above; the threads' ranges are disjoint.
                unsafe { block(geometry, out_rs, a, b, ptr, rows, cols, shared) };
            });
        }
    });
    if let Shared::A(packed) | Shared::B(packed) = shared {
        SHARED_PACKING.with_borrow_mut(|buffer| *buffer = packed.words);
    }
}

thread_local! {
    /// The words of the operand this thread last packed for all the
    /// threads of a product, kept for its next product: no allocation and
    /// no zeroing (the packing writes every word it hands out).
    static SHARED_PACKING: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How a product is blocked: [`KC_PAIRS`] pairs of `k` per block (half as
/// many when values are packed widened, the same bytes), right operand
/// blocks of `nc` columns and left operand blocks of `mc` rows within the
/// packing budgets.
struct Geometry {
    k: usize,
    arithmetic: Arithmetic,
    /// Packed words per pair of `k` per row or column.
    words: usize,
    pairs: usize,
    kc: usize,
    nc: usize,
    mc: usize,
    k_blocks: usize,
}

impl Geometry {
    fn of(k: usize, arithmetic: Arithmetic) -> Geometry {
        let (pairs, words) = (k.div_ceil(2), arithmetic.words_per_pair());
        let kc = (KC_PAIRS / words).min(pairs.max(1));
        Geometry {
            k,
            arithmetic,
            words,
            pairs,
            kc,
            nc: ((B_BLOCK_BYTES / (4 * kc * words)) / NR * NR).max(NR),
            mc: ((A_BLOCK_BYTES / (4 * kc * words)) / MR * MR).max(MR),
            k_blocks: pairs.div_ceil(kc).max(1),
        }
    }

    /// True when rows of `a` are read in place: contiguous bf16 pairs are
    /// already the words `vdpbf16ps` broadcasts (widened values are packed).
    fn reads_in_place(&self, a: &View) -> bool {
        self.arithmetic == Arithmetic::DotPairs && a.cs == 1 && self.k.is_multiple_of(2)
    }

    /// Pairs `p0..p0 + len` of `k` block `kb`.
    fn k_block(&self, kb: usize) -> (usize, usize) {
        (kb * self.kc, self.kc.min(self.pairs - kb * self.kc))
    }
}

/// An operand packed once for all the threads of a product: for each
/// block of its side (`nc` columns of the right operand, `mc` rows of the
/// left) and each `k` block, the packed words, in that order.
struct Packed {
    words: Vec<u32>,
    /// Where block `side_block * k_blocks + kb` starts.
    starts: Vec<usize>,
    k_blocks: usize,
}

impl Packed {
    /// The packed words of side block `side_block` (`nc` columns or `mc`
    /// rows from the operand's start) and `k` block `kb`.
    fn block(&self, side_block: usize, kb: usize) -> &[u32] {
        let at = side_block * self.k_blocks + kb;
        &self.words[self.starts[at]..self.starts[at + 1]]
    }
}

/// Which operand the threads of a product share packed.
enum Shared {
    /// Each thread packs what it reads.
    None,
    /// The right operand (the threads split rows).
    B(Packed),
    /// The left operand (the threads split columns).
    A(Packed),
}

/// Packs whole strips `range` of pairs `p0..p0 + pairs` of an operand into
/// a slice: `pack(range, p0, pairs, out)`.
type PackStrips<'a> = dyn Fn(std::ops::Range<usize>, usize, usize, &mut [u32]) + Sync + 'a;

/// Pack a whole operand for all threads: `len` columns (or rows) in blocks
/// of `side`, strips of `unit`; the strips of every block are shared out
/// between `parts` threads, `pack(range, p0, pairs, out)` packing whole
/// strips `range` of pairs `p0..p0 + pairs` into `out`.
fn prepack(g: &Geometry, (len, side, unit): (usize, usize, usize), parts: usize, pack: &PackStrips) -> Packed {
    let mut starts = vec![0];
    let mut jobs = Vec::new();
    for s0 in (0..len).step_by(side) {
        let width = side.min(len - s0);
        for kb in 0..g.k_blocks {
            let (p0, kp) = g.k_block(kb);
            let strips = width.div_ceil(unit);
            let per_job = strips.div_ceil(parts);
            for first in (0..strips).step_by(per_job) {
                let last = (first + per_job).min(strips);
                let range = s0 + first * unit..(s0 + last * unit).min(s0 + width);
                jobs.push(((last - first) * kp * unit * g.words, range, p0, kp));
            }
            let start = *starts.last().expect("starts with 0");
            starts.push(start + strips * kp * unit * g.words);
        }
    }
    let mut words = SHARED_PACKING.with_borrow_mut(std::mem::take);
    let len = *starts.last().expect("starts with 0");
    // The jobs' words follow each other: hand out consecutive slices.
    let mut rest: &mut [u32] = sized(&mut words, len);
    let mut slices = Vec::with_capacity(jobs.len());
    for (size, range, p0, kp) in jobs {
        let (slice, tail) = std::mem::take(&mut rest).split_at_mut(size);
        slices.push((slice, range, p0, kp));
        rest = tail;
    }
    rayon::scope(|s| {
        for (slice, range, p0, kp) in slices {
            s.spawn(move |_| pack(range, p0, kp, slice));
        }
    });
    Packed { words, starts, k_blocks: g.k_blocks }
}

/// Compute rows `rows` x columns `cols` of the product (`n` is the distance
/// between the output's rows). `k` is split into blocks of [`KC_PAIRS`] pairs so a packed
/// block of each operand stays in cache; partial sums live in f32 (the
/// output itself, or a scratch rectangle when the output is bf16).
///
/// # Safety
/// The CPU has AVX-512 BF16; `out` holds `m x n` elements, and no other
/// thread writes the rectangle.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    g: &Geometry,
    n: usize,
    a: View,
    b: View,
    out: OutPtr,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    shared: &Shared,
) {
    let width = cols.len();
    // Partial sums of a bf16 product between k blocks: this thread's
    // buffer, kept between products (every element is written by the first
    // block before later blocks read it).
    let scratch_len = match (out, g.k_blocks > 1) {
        (OutPtr::BF16(_), true) => rows.len() * width,
        _ => 0,
    };
    BUFFERS.with_borrow_mut(|buffers| {
        let Buffers { partial_sums, left, right } = buffers;
        block_with(n, (a, b), out, (rows, cols), shared, g, (sized(partial_sums, scratch_len), left, right))
    });
}

/// A thread's working memory for its blocks of products, kept between
/// products: no allocation, and no zeroing (every word is written before
/// it is read: the packing loops fill what they hand out, the first `k`
/// block every partial sum).
struct Buffers {
    /// Partial sums of a bf16 product between `k` blocks.
    partial_sums: Vec<f32>,
    /// The left operand's block, packed by this thread.
    left: Vec<u32>,
    /// The right operand's block, packed by this thread.
    right: Vec<u32>,
}

thread_local! {
    /// This thread's [`Buffers`].
    static BUFFERS: std::cell::RefCell<Buffers> =
        const { std::cell::RefCell::new(Buffers { partial_sums: Vec::new(), left: Vec::new(), right: Vec::new() }) };
}

/// [`block`] with its geometry and partial-sum scratch. A left operand
/// that needs packing while the right one is shared packed is packed once
/// per block of rows and `k` (looping over the column blocks inside);
/// otherwise each right block is packed once and stays in cache while the
/// row blocks go by.
///
/// # Safety
/// As for [`block`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_with(
    n: usize,
    (a, b): (View, View),
    out: OutPtr,
    (rows, cols): (std::ops::Range<usize>, std::ops::Range<usize>),
    shared: &Shared,
    g: &Geometry,
    (scratch, own_a, own_b): (&mut [f32], &mut Vec<u32>, &mut Vec<u32>),
) {
    let (k, words, direct_a) = (g.k, g.words, g.reads_in_place(&a));
    let mut tile = [0f32; MR * NR];
    let ctx = Tiles { n, a, out, rows: rows.clone(), cols: cols.clone(), g, direct_a };
    let row_blocks = || rows.clone().step_by(g.mc).map(|ic| (ic, g.mc.min(rows.end - ic)));
    let col_blocks = || cols.clone().step_by(g.nc).map(|jc| (jc, g.nc.min(cols.end - jc)));
    let mut pack_own_a = |ic: usize, mb: usize, p0: usize, kp: usize| -> *const u32 {
        let own = sized(own_a, mb.div_ceil(MR) * kp * MR * words);
        pack_a(&a, (k, words), ic..ic + mb, p0, kp, own);
        own.as_ptr()
    };
    match (shared, direct_a) {
        (Shared::B(packed), false) => {
            for kb in 0..g.k_blocks {
                let (p0, kp) = g.k_block(kb);
                for (ic, mb) in row_blocks() {
                    let packed_a = pack_own_a(ic, mb, p0, kp);
                    for (jc, nb) in col_blocks() {
                        // Threads splitting rows cover all columns: `jc` is a block start.
                        let packed_b = packed.block(jc / g.nc, kb).as_ptr();
                        ctx.compute((ic, mb), (jc, nb), kb, (packed_a, packed_b), &mut tile, scratch);
                    }
                }
            }
        }
        (Shared::B(_), true) | (Shared::None | Shared::A(_), _) => {
            for (jc, nb) in col_blocks() {
                for kb in 0..g.k_blocks {
                    let (p0, kp) = g.k_block(kb);
                    let packed_b: *const u32 = match shared {
                        Shared::B(packed) => packed.block(jc / g.nc, kb).as_ptr(),
                        Shared::None | Shared::A(_) => {
                            let own = sized(own_b, nb.div_ceil(NR) * kp * NR * words);
                            pack_b(&b, (k, words), jc..jc + nb, p0, kp, own);
                            own.as_ptr()
                        }
                    };
                    for (ic, mb) in row_blocks() {
                        let packed_a: *const u32 = match (shared, direct_a) {
                            (_, true) => std::ptr::null(),
                            // Threads splitting columns cover all rows: `ic` is a block start.
                            (Shared::A(packed), false) => packed.block(ic / g.mc, kb).as_ptr(),
                            (Shared::None | Shared::B(_), false) => pack_own_a(ic, mb, p0, kp),
                        };
                        ctx.compute((ic, mb), (jc, nb), kb, (packed_a, packed_b), &mut tile, scratch);
                    }
                }
            }
        }
    }
}

/// What every block of one thread's rectangle shares.
struct Tiles<'a, 'g> {
    n: usize,
    a: View<'a>,
    out: OutPtr,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    g: &'g Geometry,
    direct_a: bool,
}

impl Tiles<'_, '_> {
    /// The tiles of rows `ic..ic + mb` x columns `jc..jc + nb` over `k`
    /// block `kb`, from the packed blocks (`packed_a` unused when the left
    /// operand is read in place): partial sums loaded before and saved
    /// after every block but the first and last, the last block's stored.
    ///
    /// # Safety
    /// As for [`block`]; the packed blocks hold these rows, columns and `k` block.
    #[inline(always)]
    unsafe fn compute(
        &self,
        (ic, mb): (usize, usize),
        (jc, nb): (usize, usize),
        kb: usize,
        (packed_a, packed_b): (*const u32, *const u32),
        tile: &mut [f32; MR * NR],
        scratch: &mut [f32],
    ) {
        let (g, a, rows, cols) = (self.g, &self.a, &self.rows, &self.cols);
        let (p0, kp) = g.k_block(kb);
        let (first, last) = (kb == 0, kb + 1 == g.k_blocks);
        let width = cols.len();
        for sa in 0..mb.div_ceil(MR) {
            let (i0, tr) = (ic + sa * MR, MR.min(rows.end - ic - sa * MR));
            // Word `p` of row `r` is at `rows_a[r] + p * step_a`.
            let (rows_a, step_a) = if self.direct_a {
                let base = a.data.as_ptr().add(a.offset + 2 * p0);
                // Rows past the edge repeat the last row; their results are dropped.
                (std::array::from_fn(|r| base.add((i0 + r.min(tr - 1)) * a.rs) as *const u32), 1)
            } else {
                let pa = packed_a.add(sa * kp * MR * g.words);
                (std::array::from_fn(|r| pa.add(r)), MR)
            };
            for sb in 0..nb.div_ceil(NR) {
                let pb = packed_b.add(sb * kp * NR * g.words);
                let (j0, tc) = (jc + sb * NR, NR.min(jc + nb - jc - sb * NR));
                // Where this tile's partial sums live between k blocks.
                let partial = match self.out {
                    OutPtr::F32(p) => Partial::Out(p, self.n, i0, j0),
                    OutPtr::BF16(_) => Partial::Scratch(scratch.as_mut_ptr(), width, i0 - rows.start, j0 - cols.start),
                };
                if !first {
                    partial.load(tile, tr, tc);
                }
                match g.arithmetic {
                    Arithmetic::DotPairs => micro_kernel(kp, (&rows_a, step_a), pb, tile, !first),
                    Arithmetic::Fma => micro_kernel_fma(kp, rows_a[0], pb, tile, !first),
                    Arithmetic::Tiles => unreachable!("`matmul_with` hands AMX products to `dot_amx`"),
                }
                if last {
                    store(tile, self.out, self.n, i0, j0, tr, tc);
                } else {
                    partial.save(tile, tr, tc);
                }
            }
        }
    }
}

/// The first `len` elements of `buffer`, grown (never shrunk) to hold
/// them; its users write every element before reading it (the packing
/// loops every word they hand out, the first `k` block every partial sum).
pub(super) fn sized<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

/// Where a tile's partial sums are kept between blocks of `k`: in the f32
/// output at `(i0, j0)` (row length `n`), or in the bf16 output's f32
/// scratch rectangle (row length `width`).
#[derive(Clone, Copy)]
enum Partial {
    Out(*mut f32, usize, usize, usize),
    Scratch(*mut f32, usize, usize, usize),
}

impl Partial {
    /// The row-major `rows x cols` corner of the partial sums, as a pointer and row length.
    fn base(self) -> (*mut f32, usize) {
        match self {
            // SAFETY (both): `block` builds them from tile corners inside its rectangle.
            Partial::Out(p, n, i, j) | Partial::Scratch(p, n, i, j) => (unsafe { p.add(i * n + j) }, n),
        }
    }

    /// # Safety
    /// The rectangle lies in this thread's part of the buffer.
    unsafe fn load(self, tile: &mut [f32; MR * NR], rows: usize, cols: usize) {
        let (p, stride) = self.base();
        if cols == NR {
            // Whole rows: fixed-size copies the compiler keeps in registers.
            for r in 0..rows {
                tile[r * NR..(r + 1) * NR].copy_from_slice(&*(p.add(r * stride) as *const [f32; NR]));
            }
            tile[rows * NR..].fill(0.0);
            return;
        }
        tile.fill(0.0);
        for r in 0..rows {
            tile[r * NR..r * NR + cols].copy_from_slice(std::slice::from_raw_parts(p.add(r * stride), cols));
        }
    }

    /// # Safety
    /// As for [`Partial::load`].
    unsafe fn save(self, tile: &[f32; MR * NR], rows: usize, cols: usize) {
        let (p, stride) = self.base();
        if cols == NR {
            for r in 0..rows {
                (*(p.add(r * stride) as *mut [f32; NR])).copy_from_slice(&tile[r * NR..(r + 1) * NR]);
            }
            return;
        }
        for r in 0..rows {
            std::slice::from_raw_parts_mut(p.add(r * stride), cols).copy_from_slice(&tile[r * NR..r * NR + cols]);
        }
    }
}

/// The bf16 buffer as raw 16-bit words.
pub(super) fn raw(data: &[bf16]) -> &[u16] {
    // SAFETY: `bf16` is a transparent wrapper of `u16`.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u16, data.len()) }
}

/// `out[c] = lo[c] | hi[c] << 16` (the `k` pair of two rows), `hi` absent past an odd `k`.
#[inline(always)]
pub(super) fn interleave(lo: &[u16], hi: Option<&[u16]>, out: &mut [u32]) {
    match hi {
        Some(hi) => {
            out.iter_mut().zip(lo.iter().zip(hi)).for_each(|(o, (&l, &h))| *o = u32::from(l) | u32::from(h) << 16)
        }
        None => out.iter_mut().zip(lo).for_each(|(o, &l)| *o = u32::from(l)),
    }
}

/// Store pair word `word` (the values of `k` rows `2p` and `2p + 1`) of
/// column (or row) `c` of `k` pair `p` into a packed strip `unit` wide:
/// as one word (`words` = 1, for `vdpbf16ps`), or as its two values
/// widened to f32 in consecutive rows of `unit` words (`words` = 2).
#[inline(always)]
fn put(strip: &mut [u32], (unit, words): (usize, usize), p: usize, c: usize, word: u32) {
    if words == 1 {
        strip[p * unit + c] = word;
    } else {
        strip[2 * p * unit + c] = word << 16;
        strip[(2 * p + 1) * unit + c] = word & 0xFFFF_0000;
    }
}

/// Pack columns `cols` and row pairs `p0..p0 + pairs` of `b` (`k x n`)
/// into `packed`: per strip of [`NR`] columns, per pair of rows, [`NR`]
/// words holding `(b[2p][j], b[2p+1][j])` (`words` = 1), or `2 x NR`
/// words holding row `2p` then row `2p + 1` widened to f32 (`words` = 2);
/// zero past the edges. Row-major and transposed storage each get a loop
/// that reads memory in order.
fn pack_b(
    b: &View,
    (k, words): (usize, usize),
    cols: std::ops::Range<usize>,
    p0: usize,
    pairs: usize,
    packed: &mut [u32],
) {
    let nb = cols.len();
    let d = raw(b.data);
    let strip_len = pairs * NR * words;
    if b.cs == 1 {
        crate::kernels::simd::widest!(pack_b_rows(b, (k, words), cols.clone(), p0, pairs, packed));
    }
    for s in 0..nb.div_ceil(NR) {
        let (width, j) = (NR.min(nb - s * NR), cols.start + s * NR);
        let strip = &mut packed[s * strip_len..(s + 1) * strip_len];
        if width < NR {
            strip.chunks_mut(NR).for_each(|words| words[width..].fill(0));
        }
        if b.cs == 1 {
            // Row-major storage: packed above, a pair of rows at a time.
            continue;
        }
        if b.rs == 1 {
            // Transposed storage: each column is contiguous in `k`, so the
            // pair (2q, 2q + 1) of a column is one unaligned 32-bit word.
            // Blocks of 16 pairs: the columns' words are read in runs and
            // the strip written a row of words at a time.
            let full = (k / 2).saturating_sub(p0).min(pairs);
            let base = &d[b.offset + j * b.cs + 2 * p0..];
            if !(words == 1 && width == NR && pack_transposed_in_registers(base, b.cs, full, strip)) {
                for p1 in (0..full).step_by(16) {
                    let rows = 16.min(full - p1);
                    for c in 0..width {
                        let column = &base[c * b.cs + 2 * p1..][..2 * rows];
                        for (r, pair) in column.chunks_exact(2).enumerate() {
                            put(strip, (NR, words), p1 + r, c, u32::from(pair[0]) | u32::from(pair[1]) << 16);
                        }
                    }
                }
            }
            if full < pairs {
                // The last pair of an odd `k`.
                for c in 0..width {
                    put(strip, (NR, words), full, c, u32::from(d[b.offset + (j + c) * b.cs + 2 * (p0 + full)]));
                }
            }
        } else {
            for p in 0..pairs {
                let q = p0 + p;
                for c in 0..width {
                    let hi = if 2 * q + 1 < k { b.bits(2 * q + 1, j + c) } else { 0 };
                    put(strip, (NR, words), p, c, b.bits(2 * q, j + c) | hi << 16);
                }
            }
        }
    }
}

/// [`pack_b`] for row-major `b`: each pair of rows is read once, in order,
/// and its words handed to every strip (reading a strip's columns row
/// after row instead strides through memory a row apart, and the loads
/// wait on the caches). Strips are zeroed past the edge by the caller.
#[inline(always)]
fn pack_b_rows(
    b: &View,
    (k, words): (usize, usize),
    cols: std::ops::Range<usize>,
    p0: usize,
    pairs: usize,
    packed: &mut [u32],
) {
    let nb = cols.len();
    let d = raw(b.data);
    let strip_len = pairs * NR * words;
    for p in 0..pairs {
        let q = p0 + p;
        let row = |r: usize| &d[b.offset + r * b.rs + cols.start..][..nb];
        let (lo, hi) = (row(2 * q), (2 * q + 1 < k).then(|| row(2 * q + 1)));
        if p + PREFETCH_PAIRS < pairs {
            let ahead = b.offset + 2 * (q + PREFETCH_PAIRS) * b.rs + cols.start;
            crate::kernels::simd::prefetch(d.as_ptr().wrapping_add(ahead), nb);
            crate::kernels::simd::prefetch(d.as_ptr().wrapping_add(ahead + b.rs), nb);
        }
        for (s, c0) in (0..nb).step_by(NR).enumerate() {
            let width = NR.min(nb - c0);
            let at = s * strip_len + p * NR * words;
            let lo = &lo[c0..c0 + width];
            let hi = hi.map(|hi| &hi[c0..c0 + width]);
            match words {
                1 => interleave(lo, hi, &mut packed[at..at + width]),
                _ => {
                    widen(lo, &mut packed[at..at + width]);
                    match hi {
                        Some(hi) => widen(hi, &mut packed[at + NR..at + NR + width]),
                        None => packed[at + NR..at + NR + width].fill(0),
                    }
                }
            }
        }
    }
}

/// Pack pair words `0..pairs` of [`NR`] columns stored `cs` elements apart
/// from `base[0]` into `strip` with [`pack_transposed_columns`] when this
/// CPU has AVX-512 and every word read lies in `base`; false (nothing
/// written) otherwise.
fn pack_transposed_in_registers(base: &[u16], cs: usize, pairs: usize, strip: &mut [u32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if pairs > 0 && strip.len() >= pairs * NR && (NR - 1) * cs + 2 * pairs <= base.len() && super::simd::avx512() {
        // SAFETY: AVX-512 F is present; the last word read, pair `pairs - 1`
        // of column `NR - 1`, ends at `base[(NR - 1) * cs + 2 * pairs - 1]`;
        // the strip holds the words written.
        unsafe { pack_transposed_columns(base.as_ptr(), cs, pairs, strip.as_mut_ptr()) };
        return true;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, cs, pairs, strip);
    false
}

/// Pair words `0..pairs` of [`NR`] columns stored `cs` elements apart from
/// `base` (each column contiguous in `k`) into a packed strip: word `p` of
/// column `c` to `strip[p * NR + c]`. Sixteen pairs at a time, each
/// column's sixteen words are loaded as one vector (a cache line, in order
/// down the column) and each half strip's 16 x 16 block of words is
/// transposed in registers.
///
/// # Safety
/// AVX-512 F is present; the `pairs` words of every column lie in the
/// buffer; `strip` holds `pairs * NR` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_transposed_columns(base: *const u16, cs: usize, pairs: usize, strip: *mut u32) {
    use std::arch::x86_64::*;
    for p1 in (0..pairs).step_by(16) {
        let rows = 16.min(pairs - p1);
        let mask: __mmask16 = if rows == 16 { 0xFFFF } else { (1 << rows) - 1 };
        for half in 0..NR / 16 {
            let columns: [__m512i; 16] = std::array::from_fn(|c| {
                let column = base.add((16 * half + c) * cs + 2 * p1) as *const i32;
                _mm512_maskz_loadu_epi32(mask, column)
            });
            let pairs_of_columns = super::simd::transpose16(columns);
            for (p, words) in pairs_of_columns.iter().take(rows).enumerate() {
                _mm512_storeu_si512(strip.add((p1 + p) * NR + 16 * half) as *mut _, *words);
            }
        }
    }
}

/// `out[c]` = `values[c]` widened to f32 bits.
#[inline(always)]
fn widen(values: &[u16], out: &mut [u32]) {
    out.iter_mut().zip(values).for_each(|(o, &v)| *o = u32::from(v) << 16);
}

/// Pack rows `rows` and column pairs `p0..p0 + pairs` of `a` (`m x k`)
/// into `packed`: per strip of [`MR`] rows, per pair of columns, [`MR`]
/// words holding `(a[i][2p], a[i][2p+1])` (`words` = 1, zero past the
/// edges), or `2 x MR` words holding column `2p` then column `2p + 1`
/// widened to f32 (`words` = 2, see [`pack_a_widened`]). (Row-major `a`
/// with an even `k` is read in place by `vdpbf16ps` instead.)
fn pack_a(
    a: &View,
    (k, words): (usize, usize),
    rows: std::ops::Range<usize>,
    p0: usize,
    pairs: usize,
    packed: &mut [u32],
) {
    if words == 2 {
        pack_a_widened(a, k, rows, p0, pairs, packed);
        return;
    }
    let mb = rows.len();
    let strips = mb.div_ceil(MR);
    if !mb.is_multiple_of(MR) {
        // The last strip's rows past the edge.
        packed[(strips - 1) * pairs * MR..].chunks_mut(MR).for_each(|words| words[mb % MR..].fill(0));
    }
    crate::kernels::simd::widest!(pack_a_pairs(a, k, rows, p0, pairs, packed));
}

/// [`pack_a`]'s pair words: each strip's [`MR`] words of a pair of
/// columns written straight into it (transposed storage reads the two
/// columns as contiguous runs).
#[inline(always)]
fn pack_a_pairs(a: &View, k: usize, rows: std::ops::Range<usize>, p0: usize, pairs: usize, packed: &mut [u32]) {
    let (i0, mb) = (rows.start, rows.len());
    let d = raw(a.data);
    for p in 0..pairs {
        let q = p0 + p;
        if a.rs == 1 {
            let column = |c: usize| &d[a.offset + c * a.cs + i0..][..mb];
            if p + PREFETCH_PAIRS < pairs {
                let ahead = a.offset + 2 * (q + PREFETCH_PAIRS) * a.cs + i0;
                crate::kernels::simd::prefetch(d.as_ptr().wrapping_add(ahead), mb);
                crate::kernels::simd::prefetch(d.as_ptr().wrapping_add(ahead + a.cs), mb);
            }
            let (lo, hi) = (column(2 * q), (2 * q + 1 < k).then(|| column(2 * q + 1)));
            for (s, lo) in lo.chunks(MR).enumerate() {
                let at = (s * pairs + p) * MR;
                let hi = hi.map(|hi| &hi[s * MR..s * MR + lo.len()]);
                interleave(lo, hi, &mut packed[at..at + lo.len()]);
            }
        } else {
            for i in 0..mb {
                let hi = if 2 * q + 1 < k { a.bits(i0 + i, 2 * q + 1) } else { 0 };
                packed[((i / MR) * pairs + p) * MR + i % MR] = a.bits(i0 + i, 2 * q) | hi << 16;
            }
        }
    }
}

/// [`pack_a`] widening to f32: column `c` of the block (`k` index
/// `2 p0 + c`) of strip row `r` goes to word `c * MR + r` of its strip,
/// read along whichever axis `a` stores contiguously; the column past an
/// odd `k` is zero. Rows past the edge repeat the last row (their results
/// are dropped).
fn pack_a_widened(a: &View, k: usize, rows: std::ops::Range<usize>, p0: usize, pairs: usize, packed: &mut [u32]) {
    let (i0, mb) = (rows.start, rows.len());
    let strip_len = 2 * pairs * MR;
    let columns = (2 * pairs).min(k - 2 * p0);
    let d = raw(a.data);
    for (s, strip) in packed.chunks_mut(strip_len).take(mb.div_ceil(MR)).enumerate() {
        let height = MR.min(mb - s * MR);
        if columns < 2 * pairs {
            strip[columns * MR..].fill(0);
        }
        // Row `r` of the strip, or the last one past the edge.
        let row = |r: usize| i0 + s * MR + r.min(height - 1);
        if a.cs == 1 {
            // The strip's rows side by side, written a column at a time.
            let rows: [&[u16]; MR] = std::array::from_fn(|r| &d[a.offset + row(r) * a.rs + 2 * p0..][..columns]);
            for (c, words) in strip.chunks_exact_mut(MR).take(columns).enumerate() {
                for (word, row) in words.iter_mut().zip(&rows) {
                    *word = u32::from(row[c]) << 16;
                }
            }
        } else {
            for c in 0..columns {
                let at = a.offset + (2 * p0 + c) * a.cs;
                for (r, word) in strip[c * MR..(c + 1) * MR].iter_mut().enumerate() {
                    *word = u32::from(d[at + row(r) * a.rs]) << 16;
                }
            }
        }
    }
}

/// `tile = A strip x B strip` over `pairs` pairs of `k` (`tile +=` when
/// `accumulate`). Word `p` of row `r` of the A strip is at
/// `a.0[r] + p * a.1` (packed or in place, possibly unaligned).
///
/// # Safety
/// The CPU has AVX-512 BF16; every A word read and `pairs * NR` words of
/// `b` are in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro_kernel(
    pairs: usize,
    a: (&[*const u32; MR], usize),
    b: *const u32,
    tile: &mut [f32; MR * NR],
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(tile.as_ptr().add(r * NR));
            row[1] = _mm512_loadu_ps(tile.as_ptr().add(r * NR + 16));
        }
    }
    for p in 0..pairs {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16) as *const _));
        for (r, row) in acc.iter_mut().enumerate() {
            let word = a.0[r].add(p * a.1).read_unaligned();
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(word as i32));
            row[0] = _mm512_dpbf16_ps(row[0], av, b0);
            row[1] = _mm512_dpbf16_ps(row[1], av, b1);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), row[0]);
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), row[1]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_kernel(_: usize, _: (&[*const u32; MR], usize), _: *const u32, _: &mut [f32; MR * NR], _: bool) {
    unreachable!("`available` is false off x86-64")
}

/// Write the valid `rows x cols` corner of `tile` at `(i0, j0)`.
///
/// # Safety
/// The rectangle lies inside the `? x n` output and belongs to this thread.
#[inline(always)]
pub(super) unsafe fn store(
    tile: &[f32; MR * NR],
    out: OutPtr,
    n: usize,
    i0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if let (OutPtr::BF16(p), MR, NR) = (out, rows, cols) {
        round_tile(tile, p.add(i0 * n + j0), n);
        return;
    }
    for r in 0..rows {
        let src = &tile[r * NR..r * NR + cols];
        let at = (i0 + r) * n + j0;
        match out {
            OutPtr::F32(p) => std::slice::from_raw_parts_mut(p.add(at), cols).copy_from_slice(src),
            OutPtr::BF16(p) => std::slice::from_raw_parts_mut(p.add(at), cols)
                .iter_mut()
                .zip(src)
                .for_each(|(o, &v)| *o = bf16_from_f32(v)),
        }
    }
}

/// Round a whole tile to bf16 into rows `n` apart from `out`, 16 values an
/// instruction: [`bf16_from_f32`]'s integer arithmetic (round to nearest
/// even, NaNs quieted) in AVX-512 lanes, so the same bits.
///
/// # Safety
/// The CPU has AVX-512 F; the `MR x NR` rectangle at `out` belongs to this thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn round_tile(tile: &[f32; MR * NR], out: *mut bf16, n: usize) {
    use super::numeric_avx512::bf16_words16;
    use std::arch::x86_64::*;
    for r in 0..MR {
        for h in 0..NR / 16 {
            let words = bf16_words16(_mm512_loadu_ps(tile.as_ptr().add(r * NR + 16 * h)));
            _mm256_storeu_si256(out.add(r * n + 16 * h) as *mut __m256i, _mm512_cvtepi32_epi16(words));
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The AVX-512 tile rounding gives `bf16_from_f32`'s bits on ties,
    /// carries into the exponent, infinities, NaNs and subnormals.
    #[test]
    fn tile_rounding_matches_the_scalar_conversion() {
        if !available() {
            return;
        }
        let specials = [
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            f32::from_bits(0x3F7F_FFFF),
            f32::from_bits(0x7F7F_FFFF),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0xFFC1_2345),
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0x0000_8001),
            -0.0,
            1.0e-40,
        ];
        let mut u = vec![0f32; MR * NR];
        crate::random::uniform_f32(3, 0, &mut u);
        let mut tile = [0f32; MR * NR];
        for (i, t) in tile.iter_mut().enumerate() {
            *t = specials.get(i).copied().unwrap_or((u[i] - 0.5) * 1e3);
        }
        let n = NR + 3;
        let mut out = vec![bf16::ZERO; MR * n];
        // SAFETY: checked the CPU; the rectangle is inside `out`.
        unsafe { round_tile(&tile, out.as_mut_ptr(), n) };
        for r in 0..MR {
            for c in 0..NR {
                let expected = bf16_from_f32(tile[r * NR + c]).to_bits();
                assert_eq!(out[r * n + c].to_bits(), expected, "{:#x}", tile[r * NR + c].to_bits());
            }
        }
    }

    /// `a x b` in f64 from the bf16 values, and the sum of |products| per element.
    pub(in crate::kernels) fn reference(m: usize, k: usize, n: usize, a: &[bf16], b: &[bf16]) -> (Vec<f64>, Vec<f64>) {
        let mut exact = vec![0f64; m * n];
        let mut magnitude = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let v = a[i * k + p].to_f64() * b[p * n + j].to_f64();
                    exact[i * n + j] += v;
                    magnitude[i * n + j] += v.abs();
                }
            }
        }
        (exact, magnitude)
    }

    /// `len` bf16 values drawn uniformly from [-2, 2) with `seed`.
    pub(in crate::kernels) fn values(len: usize, seed: u64) -> Vec<bf16> {
        let mut u = vec![0f32; len];
        crate::random::uniform_f32(seed, 0, &mut u);
        u.iter().map(|&x| bf16::from_f32(4.0 * x - 2.0)).collect()
    }

    #[test]
    fn products_match_f64_within_f32_rounding_on_odd_shapes() {
        for arithmetic in Arithmetic::supported() {
            for (m, k, n, threads) in [
                (1, 1, 1, 1),
                (17, 33, 65, 1),
                (9, 7, 31, 2),
                (3, 1024, 2, 2),
                (64, 257, 96, 2),
                (8, 512, 300, 2),
                (20, 2500, 40, 1),
            ] {
                let (a, b) = (values(m * k, 1), values(k * n, 2));
                let mut out = vec![0f32; m * n];
                let av = View { data: &a, offset: 0, rs: k, cs: 1 };
                let bv = View { data: &b, offset: 0, rs: n, cs: 1 };
                // The last two are big enough to split rows, then columns, over threads.
                matmul_with(arithmetic, (m, k, n), av, bv, Out::F32(&mut out), threads);
                let (exact, magnitude) = reference(m, k, n, &a, &b);
                for i in 0..m * n {
                    let bound = (k as f64 + 2.0) * f64::from(f32::EPSILON) * magnitude[i] + 1e-30;
                    assert!(
                        (f64::from(out[i]) - exact[i]).abs() <= bound,
                        "{m}x{k}x{n} element {i}: {} vs {}",
                        out[i],
                        exact[i]
                    );
                }
                let mut rounded = vec![bf16::ZERO; m * n];
                matmul_with(arithmetic, (m, k, n), av, bv, Out::BF16(&mut rounded), threads);
                for i in 0..m * n {
                    assert_eq!(rounded[i], bf16::from_f32(out[i]), "bf16 output is the f32 result rounded");
                }
            }
        }
    }

    /// The threads pack the shared operand once between them (the right
    /// one when they split rows, a packed left one when they split
    /// columns): the same bits as one thread packing everything, over
    /// several `k` blocks and ragged edges.
    #[test]
    fn shared_packing_gives_the_single_thread_bits() {
        for arithmetic in Arithmetic::supported() {
            // (330, 2100, 300): a packed left operand over several column blocks of
            // the shared right one and two `k` blocks (packed once per row and
            // `k` block on several threads, once per column block on one).
            for (m, k, n, lhs_transposed) in [
                (130, 2100, 70, false),
                (130, 2101, 70, true),
                (40, 2100, 150, true),
                (41, 600, 150, false),
                (330, 2100, 300, true),
            ] {
                let (a, b) = (values(m * k, 11), values(k * n, 12));
                let av = match lhs_transposed {
                    true => View { data: &a, offset: 0, rs: 1, cs: m },
                    false => View { data: &a, offset: 0, rs: k, cs: 1 },
                };
                let bv = View { data: &b, offset: 0, rs: n, cs: 1 };
                let run = |threads: usize| {
                    let mut out = vec![bf16::ZERO; m * n];
                    matmul_with(arithmetic, (m, k, n), av, bv, Out::BF16(&mut out), threads);
                    out
                };
                let one = run(1);
                for threads in [2, 3] {
                    assert!(one == run(threads), "{m}x{k}x{n} (transposed lhs: {lhs_transposed}) on {threads} threads");
                }
            }
        }
    }

    #[test]
    fn branch_free_conversions_match_half() {
        use crate::kernels::numeric::bf16_to_f32;
        let specials =
            [0.0f32, -0.0, 1.0, -1.5, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-45];
        let mut u = vec![0f32; 4096];
        crate::random::uniform_f32(5, 0, &mut u);
        let spread = u.iter().map(|&x| f32::from_bits((x * u32::MAX as f32) as u32));
        for x in specials.into_iter().chain(spread) {
            assert_eq!(bf16_from_f32(x).to_bits(), bf16::from_f32(x).to_bits(), "{x:e} ({:#010x})", x.to_bits());
            let b = bf16::from_f32(x);
            assert_eq!(bf16_to_f32(b).to_bits(), b.to_f32().to_bits(), "{b}");
        }
        for bits in [0x7F81u16, 0xFF81, 0x7FC0, 0x0001, 0x8001] {
            let b = bf16::from_bits(bits);
            assert_eq!(bf16_to_f32(b).to_bits(), b.to_f32().to_bits(), "{bits:#06x}");
        }
        // Ties go to even.
        for bits in [0x3F80_8000u32, 0x3F81_8000, 0x3F80_8001, 0x3F80_7FFF] {
            let x = f32::from_bits(bits);
            assert_eq!(bf16_from_f32(x).to_bits(), bf16::from_f32(x).to_bits());
        }
    }

    /// A right operand stored transposed (its columns contiguous in `k`)
    /// packs into the words of the row-major one: odd `k` (the last pair
    /// half empty), several `k` blocks, a ragged strip, an odd offset.
    #[test]
    fn a_transposed_right_operand_gives_the_row_major_bits() {
        for arithmetic in Arithmetic::supported() {
            for (m, k, n, threads) in [(5, 1101, 70, 1), (9, 6, 34, 1), (3, 7, 33, 2), (130, 2050, 40, 2)] {
                let (a, b) = (values(m * k, 7), values(k * n, 8));
                let mut bt = vec![bf16::ZERO; 1 + k * n];
                for p in 0..k {
                    for j in 0..n {
                        bt[1 + j * k + p] = b[p * n + j];
                    }
                }
                let av = View { data: &a, offset: 0, rs: k, cs: 1 };
                let mut direct = vec![0f32; m * n];
                let mut viewed = vec![0f32; m * n];
                matmul_with(
                    arithmetic,
                    (m, k, n),
                    av,
                    View { data: &b, offset: 0, rs: n, cs: 1 },
                    Out::F32(&mut direct),
                    threads,
                );
                matmul_with(
                    arithmetic,
                    (m, k, n),
                    av,
                    View { data: &bt, offset: 1, rs: 1, cs: k },
                    Out::F32(&mut viewed),
                    threads,
                );
                assert_eq!(direct, viewed, "{m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn transposed_and_offset_views_read_the_right_elements() {
        for arithmetic in Arithmetic::supported() {
            let (m, k, n) = (5, 6, 34);
            let (a, b) = (values(m * k, 3), values(k * n, 4));
            // a stored transposed (k x m) after a 3-element offset.
            let mut at = vec![bf16::ZERO; 3 + m * k];
            for i in 0..m {
                for p in 0..k {
                    at[3 + p * m + i] = a[i * k + p];
                }
            }
            let mut direct = vec![0f32; m * n];
            let mut viewed = vec![0f32; m * n];
            let bv = View { data: &b, offset: 0, rs: n, cs: 1 };
            matmul_with(
                arithmetic,
                (m, k, n),
                View { data: &a, offset: 0, rs: k, cs: 1 },
                bv,
                Out::F32(&mut direct),
                1,
            );
            matmul_with(
                arithmetic,
                (m, k, n),
                View { data: &at, offset: 3, rs: 1, cs: m },
                bv,
                Out::F32(&mut viewed),
                1,
            );
            assert_eq!(direct, viewed);
        }
    }
}
