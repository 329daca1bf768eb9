//! bf16 matmul on AMX tiles (Intel's Advanced Matrix Extensions): one
//! `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one into a
//! 16 x 16 f32 tile, 16 384 FLOPs an instruction.
//!
//! Both operands are packed into 1 KiB tiles (a row-major left operand
//! whose `k` fills whole chunks is read in place instead): the left one
//! per panel of [`PANEL`] rows, per chunk of [`CHUNK_PAIRS`] pairs of `k`, two tiles of
//! 16 rows holding each row's pairs as 32-bit words; the right one per
//! panel of [`PANEL`] columns, per chunk, two tiles of 16 columns holding
//! for each pair of `k` rows the columns' pair words (the layout
//! `tdpbf16ps` reads, the one `vdpbf16ps` reads too). Past the edges both
//! hold zeros. The micro-kernel keeps a 32 x 32 f32 product in four tile
//! registers over the whole `k`, chunk after chunk, so each element's sum
//! runs the same instructions whatever the blocking and the threads: the
//! bits do not depend on the thread count. It is stored once, rounded to
//! bf16 when the output is bf16.
//!
//! Products of bf16 values are exact in f32. How the hardware adds the 32
//! products of a chunk is not the sequential f32 sum (measured: about a
//! quarter of the elements of a 33 x 70 x 45 product differ in the last
//! bit from the FMA kernel's), so results equal an f32 matmul of the same
//! inputs within f32 rounding, as `vdpbf16ps`'s do; denormal inputs are
//! read as zero and denormal sums flushed.
//!
//! Linux grants a process the tiles' 8 KiB of register state only on
//! request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`): [`enable`] asks, and
//! `bf16_arithmetic` calls it once per process.

use super::dot_bf16::{interleave, raw, sized, store, OutPtr, View, MR, NR};
use half::bf16;

/// Rows (columns) of a packed left (right) panel: two tiles of 16.
const PANEL: usize = 32;
/// Pairs of `k` per tile: 16 words of 64 bytes a tile row.
const CHUNK_PAIRS: usize = 16;
/// Words of one tile (16 x 16).
const TILE_WORDS: usize = 256;
/// Packed bytes budget of a block of the right operand (a column block),
/// which holds at least [`MIN_BLOCK_PANELS`] panels however deep `k` is:
/// the left operand streams by once per block.
const B_BLOCK_BYTES: usize = 1 << 20;
const MIN_BLOCK_PANELS: usize = 4;
/// Chunks of `k` a micro-kernel runs before its partial sums go to memory
/// when `k` is longer: a left panel's stretch of 2 048 values stays in L2
/// beside the right block's, where whole panels of a vocabulary-long `k`
/// (2 MB each at 30 522) would stream from memory.
const KC_CHUNKS: usize = 64;
/// Rows whose partial sums are kept at once when `k` is blocked.
const MC_ROWS: usize = 8 * PANEL;
/// Bytes of a cache line, and of a tile row: one loads whole from a line
/// boundary and straddles two lines from anywhere else.
const LINE_BYTES: usize = 64;

/// True when this CPU has AMX-TILE and AMX-BF16, the kernel enabled them
/// in XCR0 and granted this process the tile state. Asked once.
pub(crate) fn enable() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        const OSXSAVE: u32 = 1 << 27;
        const AMX_BF16: u32 = 1 << 22;
        const AMX_TILE: u32 = 1 << 24;
        const XTILE_STATE: u64 = 0b11 << 17;
        const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_ulong = 18;
        if __cpuid(0).eax < 7 || __cpuid(1).ecx & OSXSAVE == 0 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        if edx & AMX_BF16 == 0 || edx & AMX_TILE == 0 {
            return false;
        }
        // SAFETY: OSXSAVE says XGETBV is enabled; register 0 is XCR0.
        let xcr0 = unsafe { xcr0() };
        if xcr0 & XTILE_STATE != XTILE_STATE {
            return false;
        }
        // SAFETY: a plain system call with integer arguments.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// XCR0, the state components the OS saves.
///
/// # Safety
/// The CPU has XGETBV enabled (CPUID.1:ECX.OSXSAVE).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn xcr0() -> u64 {
    let (lo, hi): (u32, u32);
    std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
    u64::from(hi) << 32 | u64::from(lo)
}

/// How a product of depth `k` is cut: chunks of `k`, words of a packed
/// panel, the columns of a packed block of the right operand, and the
/// chunks a micro-kernel runs at a time when `k` is blocked.
#[derive(Clone, Copy)]
struct Blocking {
    k: usize,
    chunks: usize,
    panel_words: usize,
    nc: usize,
    kc: usize,
}

impl Blocking {
    fn of(k: usize) -> Blocking {
        let chunks = k.div_ceil(2 * CHUNK_PAIRS);
        let panel_words = chunks * 2 * TILE_WORDS;
        let panel_bytes = (4 * panel_words).max(1);
        let nc = (B_BLOCK_BYTES / panel_bytes).max(MIN_BLOCK_PANELS) * PANEL;
        Blocking { k, chunks, panel_words, nc, kc: KC_CHUNKS }
    }

    /// True when the left operand `a` is read in place: row-major, its `k`
    /// whole chunks, each row starting on a cache line (its panels are
    /// packed otherwise: a tile row across two lines loads at half speed).
    fn reads_in_place(&self, a: &View) -> bool {
        let first_row = a.data.as_ptr().wrapping_add(a.offset);
        a.cs == 1
            && self.k.is_multiple_of(2 * CHUNK_PAIRS)
            && (a.rs * size_of::<bf16>()).is_multiple_of(LINE_BYTES)
            && first_row.align_offset(LINE_BYTES) == 0
    }

    /// Words of a packed block of `len` rows (or columns).
    fn block_words(&self, len: usize) -> usize {
        len.div_ceil(PANEL) * self.panel_words
    }

    /// Where the word of pair `p` of row (or column) `i` of a block lies.
    #[inline(always)]
    fn at(&self, i: usize, p: usize) -> usize {
        let (panel, half, r) = (i / PANEL, (i % PANEL) / 16, i % 16);
        panel * self.panel_words + (p / CHUNK_PAIRS) * 2 * TILE_WORDS + half * TILE_WORDS + r * 16 + p % CHUNK_PAIRS
    }

    /// The first words of `buffer` to pack a block of `len` rows (columns)
    /// into, its padding zeroed (packing writes the rest): a ragged last
    /// panel, and each panel's last chunk when `k` has a tail.
    fn block<'b>(&self, buffer: &'b mut Vec<u32>, len: usize) -> &'b mut [u32] {
        let words = aligned(buffer, self.block_words(len));
        if !len.is_multiple_of(PANEL) {
            words[len / PANEL * self.panel_words..].fill(0);
        }
        if !self.k.is_multiple_of(2 * CHUNK_PAIRS) {
            for panel in words.chunks_exact_mut(self.panel_words) {
                panel[self.panel_words - 2 * TILE_WORDS..].fill(0);
            }
        }
        words
    }
}

/// The first `len` words of `buffer` from a 64-byte boundary: a tile row
/// read from there lies in one cache line, not across two.
fn aligned(buffer: &mut Vec<u32>, len: usize) -> &mut [u32] {
    let words = sized(buffer, len + LINE_BYTES / size_of::<u32>());
    let skip = words.as_ptr().align_offset(LINE_BYTES);
    &mut words[skip..skip + len]
}

/// `out = a x b` (`m x k` by `k x n`) on up to `threads` threads, the
/// output's rows of `n` values `out_rs` apart.
///
/// # Safety
/// [`enable`] returned true; `out` holds the `m` rows, which no other
/// thread touches meanwhile.
pub(crate) unsafe fn matmul(
    (m, k, n): (usize, usize, usize),
    a: View,
    b: View,
    (out, out_rs): (OutPtr, usize),
    threads: usize,
) {
    let g = Blocking::of(k);
    let parts = threads.clamp(1, 8);
    if parts == 1 || m * n * k < 1 << 22 {
        compute(&g, out_rs, (a, b), out, 0..m, 0..n, Shared::default());
        return;
    }
    if m < PANEL * parts {
        // Few rows: the threads split the columns, each packing its own.
        let chunk = n.div_ceil(parts).div_ceil(PANEL) * PANEL;
        rayon::scope(|s| {
            for j0 in (0..n).step_by(chunk) {
                let cols = j0..(j0 + chunk).min(n);
                // SAFETY: as above; the threads' columns are disjoint.
                s.spawn(move |_| unsafe { compute(&g, out_rs, (a, b), out, 0..m, cols, Shared::default()) });
            }
        });
        return;
    }
    // The threads split the rows: the caller's buffers, kept between
    // products, hold what they share (fresh ones should a job this thread
    // runs while it waits multiply too).
    SHARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => {
            let (packed_a, packed_b) = &mut *buffers;
            split_rows(&g, (m, n, parts), (a, b), (out, out_rs), packed_a, packed_b);
        }
        Err(_) => split_rows(&g, (m, n, parts), (a, b), (out, out_rs), &mut Vec::new(), &mut Vec::new()),
    });
}

thread_local! {
    /// The operands a thread's products share between their threads.
    static SHARED: std::cell::RefCell<(Vec<u32>, Vec<u32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`matmul`] on `parts` threads splitting the rows, sharing each column
/// block of the right operand, packed once between them, and the left
/// operand when it needs packing, packed once for every block.
///
/// # Safety
/// As for [`matmul`].
unsafe fn split_rows(
    g: &Blocking,
    (m, n, parts): (usize, usize, usize),
    (a, b): (View, View),
    (out, out_rs): (OutPtr, usize),
    packed_a: &mut Vec<u32>,
    packed_b: &mut Vec<u32>,
) {
    let g = *g;
    let chunk = m.div_ceil(parts).div_ceil(PANEL) * PANEL;
    let shared_a: &[u32] = match g.reads_in_place(&a) {
        true => &[],
        false => {
            let words = g.block(packed_a, m);
            rayon::scope(|s| {
                for (i0, slice) in (0..m).step_by(chunk).zip(words.chunks_mut(chunk / PANEL * g.panel_words)) {
                    s.spawn(move |_| pack_a(&g, &a, i0..(i0 + chunk).min(m), slice));
                }
            });
            words
        }
    };
    for jc in (0..n).step_by(g.nc) {
        let cols = jc..(jc + g.nc).min(n);
        let words = g.block(packed_b, cols.len());
        let panels_per_part = cols.len().div_ceil(PANEL).div_ceil(parts);
        rayon::scope(|s| {
            for (part, slice) in words.chunks_mut(panels_per_part * g.panel_words).enumerate() {
                let first = cols.start + part * panels_per_part * PANEL;
                let own = first..(first + panels_per_part * PANEL).min(cols.end);
                s.spawn(move |_| pack_b(&g, &b, own, slice));
            }
        });
        let shared_b: &[u32] = words;
        rayon::scope(|s| {
            for i0 in (0..m).step_by(chunk) {
                let (rows, cols) = (i0..(i0 + chunk).min(m), cols.clone());
                let a_panels = (!shared_a.is_empty()).then(|| &shared_a[i0 / PANEL * g.panel_words..]);
                let shared = Shared { a: a_panels, b: Some(shared_b) };
                // SAFETY: as above; the threads' rows are disjoint.
                s.spawn(move |_| unsafe { compute(&g, out_rs, (a, b), out, rows, cols, shared) });
            }
        });
    }
}

/// Operands packed before [`compute`] runs: the left one's panels from the
/// first row of the rectangle (unless it is read in place), the right
/// one's block of its columns.
#[derive(Clone, Copy, Default)]
struct Shared<'a> {
    a: Option<&'a [u32]>,
    b: Option<&'a [u32]>,
}

thread_local! {
    /// This thread's packed blocks of the left and right operands, kept
    /// between products (packing writes every word it hands out, padding
    /// included), and its partial products when `k` is blocked.
    static PACKED: std::cell::RefCell<(Vec<u32>, Vec<u32>, Vec<Product>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Rows `rows` x columns `cols` of the product on this thread. The left
/// operand is read in place, packed in `shared`, or packed here once; the
/// right one's block of `cols` is packed in `shared` or packed here a
/// block of columns at a time.
///
/// # Safety
/// As for [`matmul`] (`out_rs` apart the output's rows); no other thread
/// writes the rectangle.
unsafe fn compute(
    g: &Blocking,
    out_rs: usize,
    (a, b): (View, View),
    out: OutPtr,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    shared: Shared,
) {
    PACKED.with_borrow_mut(|(own_a, own_b, partials)| {
        let _tiles = Tiles::configure();
        let mut tile = Product([0.0; PANEL * PANEL]);
        // Rows from `packed_from` on are read packed: all of them, or the
        // ragged last panel of an operand read in place.
        let packed_from = match g.reads_in_place(&a) {
            true => rows.start + rows.len() / PANEL * PANEL,
            false => rows.start,
        };
        let packed_a: &[u32] = match shared.a {
            Some(words) => words,
            None => {
                let packed_rows = packed_from..rows.end;
                let words = g.block(own_a, packed_rows.len());
                pack_a(g, &a, packed_rows, words);
                words
            }
        };
        let col_block = if shared.b.is_some() { cols.len().max(1) } else { g.nc };
        for jc in cols.clone().step_by(col_block) {
            let block_cols = jc..(jc + col_block).min(cols.end);
            let packed_b: &[u32] = match shared.b {
                Some(words) => words,
                None => {
                    let words = g.block(own_b, block_cols.len());
                    pack_b(g, &b, block_cols.clone(), words);
                    words
                }
            };
            let left_panel = |i0: usize| match i0 < packed_from {
                true => LeftPanel::in_place(&a, i0),
                false => LeftPanel::packed(packed_a.as_ptr().add((i0 - packed_from) / PANEL * g.panel_words)),
            };
            if g.chunks > g.kc {
                let right = (packed_b, block_cols.clone());
                blocked_k(g, out_rs, left_panel, right, out, rows.clone(), partials);
                continue;
            }
            // Each left panel stays in L1 while the right block's panels
            // stream by from L2 (measured 1.3-1.9x faster than the other
            // order on BERT's shapes).
            for i0 in rows.clone().step_by(PANEL) {
                let panel = left_panel(i0);
                for (jp, j0) in block_cols.clone().step_by(PANEL).enumerate() {
                    let pb = packed_b.as_ptr().add(jp * g.panel_words);
                    micro_kernel(0..g.chunks, panel, pb, &mut tile, false);
                    let (height, width) = (PANEL.min(rows.end - i0), PANEL.min(block_cols.end - j0));
                    tile.store(out, out_rs, (i0, j0), (height, width));
                }
            }
        }
    });
}

/// Rows `rows` x the columns of a packed right block of [`compute`]'s
/// product when `k` has more than `g.kc` chunks: per block of
/// [`MC_ROWS`] rows, a stretch of `k` at a time over all their panels,
/// each 32 x 32 product's sums stored to `partials` between stretches and
/// loaded back, so every element's sum runs the same instructions as
/// without blocking, and stored to the output after the last.
///
/// # Safety
/// As for [`compute`], with the tiles configured; `left_panel(i0)` and
/// the block hold every chunk of their panels.
unsafe fn blocked_k(
    g: &Blocking,
    out_rs: usize,
    left_panel: impl Fn(usize) -> LeftPanel,
    (packed_b, cols): (&[u32], std::ops::Range<usize>),
    out: OutPtr,
    rows: std::ops::Range<usize>,
    partials: &mut Vec<Product>,
) {
    let col_panels = cols.len().div_ceil(PANEL);
    if partials.len() < MC_ROWS / PANEL * col_panels {
        partials.resize_with(MC_ROWS / PANEL * col_panels, || Product([0.0; PANEL * PANEL]));
    }
    for ib in rows.clone().step_by(MC_ROWS) {
        let block_rows = ib..(ib + MC_ROWS).min(rows.end);
        for kc in (0..g.chunks).step_by(g.kc) {
            let stretch = kc..(kc + g.kc).min(g.chunks);
            for (ip, i0) in block_rows.clone().step_by(PANEL).enumerate() {
                let panel = left_panel(i0);
                for (jp, j0) in cols.clone().step_by(PANEL).enumerate() {
                    let partial = &mut partials[ip * col_panels + jp];
                    let pb = packed_b.as_ptr().add(jp * g.panel_words);
                    micro_kernel(stretch.clone(), panel, pb, partial, kc > 0);
                    if stretch.end == g.chunks {
                        let (height, width) = (PANEL.min(rows.end - i0), PANEL.min(cols.end - j0));
                        partial.store(out, out_rs, (i0, j0), (height, width));
                    }
                }
            }
        }
    }
}

/// Where the micro-kernel reads a panel of the left operand: the address
/// of its first tile and the bytes from a tile row to the next, from a
/// chunk of `k` to the next, and from its first tile to its second.
#[derive(Clone, Copy)]
struct LeftPanel {
    first: *const u8,
    row: usize,
    chunk: usize,
    half: usize,
}

impl LeftPanel {
    /// A panel packed in [`Blocking::at`]'s layout.
    fn packed(first: *const u32) -> LeftPanel {
        LeftPanel { first: first as *const u8, row: 64, chunk: 8 * TILE_WORDS, half: 4 * TILE_WORDS }
    }

    /// Rows `i0..i0 + 32` of a row-major `a` (contiguous pairs of `k` are the
    /// words `tdpbf16ps` reads).
    ///
    /// # Safety
    /// The rows and their whole `k` lie inside `a`.
    unsafe fn in_place(a: &View, i0: usize) -> LeftPanel {
        let row = 2 * a.rs;
        let first = a.data.as_ptr().add(a.offset + i0 * a.rs) as *const u8;
        LeftPanel { first, row, chunk: 4 * CHUNK_PAIRS, half: 16 * row }
    }
}

/// A 32 x 32 f32 product, row-major, aligned for the tile stores.
#[repr(C, align(64))]
struct Product([f32; PANEL * PANEL]);

impl Product {
    /// Write the `height x width` corner at `(i0, j0)` of the `? x n` output,
    /// a strip of [`MR`] rows at a time.
    ///
    /// # Safety
    /// The rectangle lies inside the output and belongs to this thread.
    unsafe fn store(&self, out: OutPtr, n: usize, (i0, j0): (usize, usize), (height, width): (usize, usize)) {
        const { assert!(NR == PANEL && PANEL.is_multiple_of(MR)) };
        for (s, strip) in self.0.chunks_exact(MR * NR).enumerate().take(height.div_ceil(MR)) {
            let strip: &[f32; MR * NR] = strip.try_into().expect("strips of MR x NR values");
            store(strip, out, n, i0 + s * MR, j0, MR.min(height - s * MR), width);
        }
    }
}

/// Pack rows `rows` of `a` (`m x k`) into `packed` ([`Blocking::at`]'s
/// layout), reading along whichever axis `a` stores contiguously. Words
/// past the edges keep the zeros the caller wrote.
fn pack_a(g: &Blocking, a: &View, rows: std::ops::Range<usize>, packed: &mut [u32]) {
    super::simd::widest!(pack_a_in(g, a, rows, packed))
}

/// [`pack_a`], inlined into each SIMD copy.
#[inline(always)]
fn pack_a_in(g: &Blocking, a: &View, rows: std::ops::Range<usize>, packed: &mut [u32]) {
    let (k, pairs) = (g.k, g.k.div_ceil(2));
    let d = raw(a.data);
    if a.cs == 1 {
        // Each run of a chunk's whole pairs goes straight to its tile row.
        let whole = k / 2;
        for (i, row) in rows.clone().enumerate() {
            let values = &d[a.offset + row * a.rs..][..k];
            for (c, run) in values[..2 * whole].chunks(2 * CHUNK_PAIRS).enumerate() {
                let at = g.at(i, c * CHUNK_PAIRS);
                for (word, pair) in packed[at..at + run.len() / 2].iter_mut().zip(run.chunks_exact(2)) {
                    *word = u32::from(pair[0]) | u32::from(pair[1]) << 16;
                }
            }
            if whole < pairs {
                packed[g.at(i, whole)] = u32::from(values[k - 1]);
            }
        }
    } else {
        // Transposed storage: whole 16 x 16 blocks through registers, then
        // the rest by two contiguous runs of the rows per pair.
        let (block_rows, block_pairs) = match a.rs == 1 {
            true => blocks::transposed_a(g, d, a, &rows, packed),
            false => (0, 0),
        };
        let mut column_pair = vec![0u32; rows.len()];
        for p in 0..pairs {
            let first = if p < block_pairs { block_rows } else { 0 };
            let column_pair = &mut column_pair[first..];
            if a.rs == 1 {
                let column = |c: usize| &d[a.offset + c * a.cs + rows.start + first..][..rows.len() - first];
                interleave(column(2 * p), (2 * p + 1 < k).then(|| column(2 * p + 1)), column_pair);
            } else {
                for (i, w) in column_pair.iter_mut().enumerate() {
                    let hi = if 2 * p + 1 < k { a.bits(rows.start + first + i, 2 * p + 1) } else { 0 };
                    *w = a.bits(rows.start + first + i, 2 * p) | hi << 16;
                }
            }
            for (i, &w) in column_pair.iter().enumerate() {
                packed[g.at(first + i, p)] = w;
            }
        }
    }
}

/// Pack columns `cols` of `b` (`k x n`) into `packed` ([`Blocking::at`]'s
/// layout with columns for rows), reading along whichever axis `b` stores
/// contiguously. Words past the edges keep the zeros the caller wrote.
fn pack_b(g: &Blocking, b: &View, cols: std::ops::Range<usize>, packed: &mut [u32]) {
    super::simd::widest!(pack_b_in(g, b, cols, packed))
}

/// [`pack_b`], inlined into each SIMD copy.
#[inline(always)]
fn pack_b_in(g: &Blocking, b: &View, cols: std::ops::Range<usize>, packed: &mut [u32]) {
    let (k, pairs, width) = (g.k, g.k.div_ceil(2), cols.len());
    let d = raw(b.data);
    if b.cs == 1 {
        let mut row_pair = vec![0u32; width];
        for p in 0..pairs {
            let row = |r: usize| &d[b.offset + r * b.rs + cols.start..][..width];
            // The rows two pairs on: the loop waits on these loads otherwise.
            for r in [2 * p + 4, 2 * p + 5] {
                super::simd::prefetch(d.as_ptr().wrapping_add(b.offset + r * b.rs + cols.start), width);
            }
            interleave(row(2 * p), (2 * p + 1 < k).then(|| row(2 * p + 1)), &mut row_pair);
            // Column `j` of pair `p` goes to word `j % 16` of row `p % 16`
            // of its tile: runs of 16 columns are contiguous.
            for (run, words) in row_pair.chunks(16).enumerate() {
                let at = column_word(g, 16 * run, p);
                packed[at..at + words.len()].copy_from_slice(words);
            }
        }
    } else if b.rs == 1 {
        // Transposed storage: each column is contiguous in `k`, so the pair
        // (2p, 2p + 1) of a column is one unaligned 32-bit word; whole 16 x
        // 16 blocks of them through registers, the rest word by word.
        let (block_cols, block_pairs) = blocks::transposed_b(g, d, b, &cols, packed);
        for (j, col) in cols.clone().enumerate() {
            let column = &d[b.offset + col * b.cs..][..k];
            for p in (if j < block_cols { block_pairs } else { 0 })..pairs {
                let hi = if 2 * p + 1 < k { u32::from(column[2 * p + 1]) } else { 0 };
                packed[column_word(g, j, p)] = u32::from(column[2 * p]) | hi << 16;
            }
        }
    } else {
        for (j, col) in cols.clone().enumerate() {
            for p in 0..pairs {
                let hi = if 2 * p + 1 < k { b.bits(2 * p + 1, col) } else { 0 };
                packed[column_word(g, j, p)] = b.bits(2 * p, col) | hi << 16;
            }
        }
    }
}

/// Packing by whole 16 x 16 blocks of pair words through AVX-512 registers
/// ([`super::simd::transpose16`]) where an operand stores the packed
/// layout's rows as its columns: each block is read a cache line (or half
/// of one) down each of 16 runs and written as 16 whole tile rows. The
/// words are the ones the word-by-word loops write.
mod blocks {
    use super::{column_word, Blocking, View};
    use std::ops::Range;

    /// Packs the whole 16 x 16 blocks of rows `rows` of a left operand
    /// stored transposed (`a.rs == 1`) and returns how many rows and pairs
    /// they cover (none without AVX-512).
    pub(super) fn transposed_a(
        g: &Blocking,
        d: &[u16],
        a: &View,
        rows: &Range<usize>,
        packed: &mut [u32],
    ) -> (usize, usize) {
        let covered = (rows.len() / 16 * 16, g.k / 2 / 16 * 16);
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::simd::avx512() {
            debug_assert!(a.rs == 1 && super::CHUNK_PAIRS.is_multiple_of(16));
            let read = a.offset + (2 * covered.1).saturating_sub(1) * a.cs + rows.start + covered.0;
            let written = g.at(covered.0.saturating_sub(1), covered.1.saturating_sub(1));
            assert!(
                covered.0 == 0 || covered.1 == 0 || (read <= d.len() && written < packed.len()),
                "a transposed left operand's blocks lie in its buffer and in the packed block"
            );
            // SAFETY: AVX-512 was detected; every run read lies below
            // `read` and every tile row written at or below `written`
            // (checked: the layout's last word of the blocks).
            unsafe { avx512::transposed_a(g, d, a, rows.start, covered, packed) };
            return covered;
        }
        let _ = (d, a, packed);
        (0, 0)
    }

    /// Packs the whole 16 x 16 blocks of columns `cols` of a right operand
    /// stored transposed (`b.rs == 1`) and returns how many columns and
    /// pairs they cover (none without AVX-512).
    pub(super) fn transposed_b(
        g: &Blocking,
        d: &[u16],
        b: &View,
        cols: &Range<usize>,
        packed: &mut [u32],
    ) -> (usize, usize) {
        let covered = (cols.len() / 16 * 16, g.k / 2 / 16 * 16);
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::simd::avx512() {
            debug_assert!(b.rs == 1);
            let read = b.offset + (cols.start + covered.0).saturating_sub(1) * b.cs + 2 * covered.1;
            let written = column_word(g, covered.0.saturating_sub(1), covered.1.saturating_sub(1));
            assert!(
                covered.0 == 0 || covered.1 == 0 || (read <= d.len() && written < packed.len()),
                "a transposed right operand's blocks lie in its buffer and in the packed block"
            );
            // SAFETY: as in `transposed_a`.
            unsafe { avx512::transposed_b(g, d, b, cols.start, covered, packed) };
            return covered;
        }
        let _ = (d, b, packed);
        (0, 0)
    }

    #[cfg(target_arch = "x86_64")]
    mod avx512 {
        use super::super::{column_word, Blocking, View};
        use crate::kernels::simd::transpose16;
        use std::arch::x86_64::*;

        /// Block `(i0, p0)`: vector `q` interleaves the two runs of `k`
        /// rows `2(p0 + q)` and `2(p0 + q) + 1` over rows `i0..i0 + 16`;
        /// transposed, vector `r` is row `i0 + r`'s 16 pairs.
        ///
        /// # Safety
        /// AVX-512 F and BW; the blocks lie in `d` and `packed`.
        #[target_feature(enable = "avx512f,avx512bw")]
        pub(super) unsafe fn transposed_a(
            g: &Blocking,
            d: &[u16],
            a: &View,
            row0: usize,
            (rows, pairs): (usize, usize),
            packed: &mut [u32],
        ) {
            let run = |c: usize, i: usize| _mm256_loadu_si256(d.as_ptr().add(a.offset + c * a.cs + row0 + i).cast());
            // Pairs outside, so that each of a block's 32 runs goes on
            // along its row of the stored operand in the next block.
            for p0 in (0..pairs).step_by(16) {
                for i0 in (0..rows).step_by(16) {
                    let words: [__m512i; 16] = std::array::from_fn(|q| {
                        let (lo, hi) = (run(2 * (p0 + q), i0), run(2 * (p0 + q) + 1, i0));
                        _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)))
                    });
                    for (r, row) in transpose16(words).iter().enumerate() {
                        _mm512_storeu_si512(packed.as_mut_ptr().add(g.at(i0 + r, p0)).cast(), *row);
                    }
                }
            }
        }

        /// Block `(j0, p0)`: vector `c` is column `j0 + c`'s pairs
        /// `p0..p0 + 16` (32 contiguous values); transposed, vector `r` is
        /// pair `p0 + r` of the 16 columns, one tile row.
        ///
        /// # Safety
        /// AVX-512 F; the blocks lie in `d` and `packed`.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn transposed_b(
            g: &Blocking,
            d: &[u16],
            b: &View,
            col0: usize,
            (cols, pairs): (usize, usize),
            packed: &mut [u32],
        ) {
            for j0 in (0..cols).step_by(16) {
                for p0 in (0..pairs).step_by(16) {
                    let columns: [__m512i; 16] = std::array::from_fn(|c| {
                        _mm512_loadu_si512(d.as_ptr().add(b.offset + (col0 + j0 + c) * b.cs + 2 * p0).cast())
                    });
                    for (r, row) in transpose16(columns).iter().enumerate() {
                        _mm512_storeu_si512(packed.as_mut_ptr().add(column_word(g, j0, p0 + r)).cast(), *row);
                    }
                }
            }
        }
    }
}

/// Where pair `p` of column `j` of a packed right block lies: row `p % 16`,
/// word `j % 16` of its tile.
#[inline(always)]
fn column_word(g: &Blocking, j: usize, p: usize) -> usize {
    let (panel, half, c) = (j / PANEL, (j % PANEL) / 16, j % 16);
    panel * g.panel_words + (p / CHUNK_PAIRS) * 2 * TILE_WORDS + half * TILE_WORDS + (p % CHUNK_PAIRS) * 16 + c
}

/// The tile registers configured as eight 16 x 64-byte tiles for this
/// thread while the value lives, released after.
struct Tiles;

/// The `ldtilecfg` operand: palette 1, bytes per row and rows per tile.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    /// # Safety
    /// [`enable`] returned true.
    unsafe fn configure() -> Tiles {
        let mut config =
            TileConfig { palette: 1, start_row: 0, reserved: [0; 14], bytes_per_row: [0; 16], rows: [0; 16] };
        config.bytes_per_row[..8].fill(64);
        config.rows[..8].fill(16);
        #[cfg(target_arch = "x86_64")]
        std::arch::asm!("ldtilecfg [{}]", in(reg) &config as *const TileConfig, options(nostack, readonly));
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured; releasing returns them to init state.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// `tile = A panel x B panel` over the chunks `chunks` of `k` (`tile +=`
/// when `resume`, loading the sums stored there): four 16 x 16
/// accumulators (rows 0-15 and 16-31 by columns 0-15 and 16-31).
///
/// # Safety
/// The tiles are configured; each panel holds the chunks `chunks`.
#[cfg(target_arch = "x86_64")]
unsafe fn micro_kernel(chunks: std::ops::Range<usize>, a: LeftPanel, b: *const u32, tile: &mut Product, resume: bool) {
    use std::arch::asm;
    const ROW: usize = 64;
    let (sums, row) = (tile.0.as_mut_ptr(), 4 * PANEL);
    match resume {
        true => asm!(
            "tileloadd tmm0, [{t0} + {row}*1]",
            "tileloadd tmm1, [{t1} + {row}*1]",
            "tileloadd tmm2, [{t2} + {row}*1]",
            "tileloadd tmm3, [{t3} + {row}*1]",
            t0 = in(reg) sums,
            t1 = in(reg) sums.add(16),
            t2 = in(reg) sums.add(16 * PANEL),
            t3 = in(reg) sums.add(16 * PANEL + 16),
            row = in(reg) row,
            options(nostack, readonly),
        ),
        false => asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)),
    }
    for c in chunks {
        let (a0, b0) = (a.first.add(c * a.chunk), b.add(c * 2 * TILE_WORDS));
        asm!(
            "tileloadd tmm4, [{a0} + {a_row}*1]",
            "tileloadd tmm5, [{a1} + {a_row}*1]",
            "tileloadd tmm6, [{b0} + {row}*1]",
            "tileloadd tmm7, [{b1} + {row}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a0 = in(reg) a0,
            a1 = in(reg) a0.add(a.half),
            a_row = in(reg) a.row,
            b0 = in(reg) b0,
            b1 = in(reg) b0.add(TILE_WORDS),
            row = in(reg) ROW,
            options(nostack, readonly),
        );
    }
    asm!(
        "tilestored [{t0} + {row}*1], tmm0",
        "tilestored [{t1} + {row}*1], tmm1",
        "tilestored [{t2} + {row}*1], tmm2",
        "tilestored [{t3} + {row}*1], tmm3",
        t0 = in(reg) sums,
        t1 = in(reg) sums.add(16),
        t2 = in(reg) sums.add(16 * PANEL),
        t3 = in(reg) sums.add(16 * PANEL + 16),
        row = in(reg) row,
        options(nostack),
    );
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_kernel(_: std::ops::Range<usize>, _: LeftPanel, _: *const u32, _: &mut Product, _: bool) {
    unreachable!("`enable` is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::super::bf16_arithmetic::Arithmetic;
    use super::super::dot_bf16::tests::{reference, values};
    use super::super::dot_bf16::{matmul_with, Out, OutPtr, View};
    use super::{compute, pack_a, pack_b, Blocking, Shared};
    use half::bf16;

    /// The tile kernel is an f32 matmul of the bf16 inputs (within f32
    /// rounding of the f64 product) whose bits do not depend on the thread
    /// count: one thread, threads splitting the rows over several shared
    /// column blocks, threads splitting the columns; ragged panels, a `k`
    /// tail, odd `k`, transposed operands, and left panels read in place
    /// beside a packed ragged one.
    #[test]
    fn tiles_match_f64_on_any_thread_count() {
        if !Arithmetic::supported().contains(&Arithmetic::Tiles) {
            eprintln!("skipped: this CPU (or OS) runs no AMX tiles");
            return;
        }
        for (m, k, n, transposed) in [
            (1, 1, 1, false),
            (33, 70, 45, false),
            (31, 33, 17, true),
            (130, 1100, 90, false),
            (40, 601, 300, true),
            (97, 1100, 1500, false),
            (97, 1024, 200, false),
            (70, 64, 40, false),
            (300, 2080, 70, false),
            (40, 2100, 64, true),
        ] {
            let (a, b) = (values(m * k, 21), values(k * n, 22));
            let (at, bt) = match transposed {
                true => {
                    let mut at = vec![bf16::ZERO; m * k];
                    let mut bt = vec![bf16::ZERO; k * n];
                    for i in 0..m {
                        for p in 0..k {
                            at[p * m + i] = a[i * k + p];
                        }
                    }
                    for p in 0..k {
                        for j in 0..n {
                            bt[j * k + p] = b[p * n + j];
                        }
                    }
                    (at, bt)
                }
                false => (a.clone(), b.clone()),
            };
            // The left operand from a cache line (read in place when its
            // rows are whole chunks) and one element past it (packed).
            let mut shifted_a = vec![bf16::ZERO; at.len() + 64];
            let line = shifted_a.as_ptr().align_offset(64);
            let mut from_line = None;
            for shift in [line, line + 1] {
                shifted_a[shift..shift + at.len()].copy_from_slice(&at);
                let (a_view, b_view) = match transposed {
                    true => (
                        View { data: &shifted_a, offset: shift, rs: 1, cs: m },
                        View { data: &bt, offset: 0, rs: 1, cs: k },
                    ),
                    false => (
                        View { data: &shifted_a, offset: shift, rs: k, cs: 1 },
                        View { data: &bt, offset: 0, rs: n, cs: 1 },
                    ),
                };
                let run = |threads| {
                    let mut out = vec![0f32; m * n];
                    matmul_with(Arithmetic::Tiles, (m, k, n), a_view, b_view, Out::F32(&mut out), threads);
                    out
                };
                let one = run(1);
                let (exact, magnitude) = reference(m, k, n, &a, &b);
                for i in 0..m * n {
                    let bound = (k as f64 + 2.0) * f64::from(f32::EPSILON) * magnitude[i] + 1e-30;
                    let error = (f64::from(one[i]) - exact[i]).abs();
                    assert!(error <= bound, "{m}x{k}x{n} element {i}: {} vs {}", one[i], exact[i]);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for threads in [2, 3] {
                    assert!(bits(&one) == bits(&run(threads)), "{m}x{k}x{n} on {threads} threads ({transposed})");
                }
                // Packed or read in place, the tiles hold the same words.
                match &from_line {
                    None => from_line = Some(bits(&one)),
                    Some(first) => assert!(*first == bits(&one), "{m}x{k}x{n}: shifted a line ({transposed})"),
                }
            }
        }
    }

    /// An operand stored transposed (packed by whole 16 x 16 blocks through
    /// registers, the rest word by word) packs into the words that the
    /// element-by-element path writes for the same matrix in a strided
    /// layout: whole blocks, ragged rows or columns, odd `k`, ranges that
    /// start past the first row or column. Needs no AMX.
    #[test]
    fn transposed_operands_pack_the_words_of_a_strided_copy() {
        for (len, k) in [(40, 601), (16, 32), (33, 70), (300, 2080)] {
            let g = Blocking::of(k);
            let matrix = values(len * k, 41);
            // Element (i, c) of the `len x k` left operand (or (c, i) of the
            // `k x len` right one): transposed at `c * len + i`, strided at
            // twice that.
            let mut strided = vec![bf16::ZERO; 2 * len * k];
            for (x, &v) in strided.iter_mut().step_by(2).zip(&matrix) {
                *x = v;
            }
            let packed = |pack: &dyn Fn(&mut [u32]), lanes: usize| {
                let mut buffer = Vec::new();
                let words = g.block(&mut buffer, lanes);
                pack(words);
                words.to_vec()
            };
            for first in [0, 5] {
                let lanes = len - first;
                let a = (
                    View { data: &matrix, offset: 0, rs: 1, cs: len },
                    View { data: &strided, offset: 0, rs: 2, cs: 2 * len },
                );
                let (transposed, general) = (
                    packed(&|w| pack_a(&g, &a.0, first..len, w), lanes),
                    packed(&|w| pack_a(&g, &a.1, first..len, w), lanes),
                );
                assert!(transposed == general, "left {len}x{k} from row {first}");
                let b = (
                    View { data: &matrix, offset: 0, rs: 1, cs: k },
                    View { data: &strided, offset: 0, rs: 2, cs: 2 * k },
                );
                let (transposed, general) = (
                    packed(&|w| pack_b(&g, &b.0, first..len, w), lanes),
                    packed(&|w| pack_b(&g, &b.1, first..len, w), lanes),
                );
                assert!(transposed == general, "right {k}x{len} from column {first}");
            }
        }
    }

    /// Blocking `k` stores and reloads each product's sums between
    /// stretches: the same bits as running the whole `k` in the tiles, for
    /// stretches of one chunk, of three (the last one short), over several
    /// blocks of rows, ragged panels and a `k` tail.
    #[test]
    fn blocked_k_gives_the_unblocked_bits() {
        if !Arithmetic::supported().contains(&Arithmetic::Tiles) {
            eprintln!("skipped: this CPU (or OS) runs no AMX tiles");
            return;
        }
        for (m, k, n) in [(70, 300, 50), (300, 250, 40)] {
            let (a, b) = (values(m * k, 31), values(k * n, 32));
            let (a_view, b_view) =
                (View { data: &a, offset: 0, rs: k, cs: 1 }, View { data: &b, offset: 0, rs: n, cs: 1 });
            let run = |kc| {
                let g = Blocking { kc, ..Blocking::of(k) };
                let mut out = vec![0f32; m * n];
                let ptr = OutPtr::F32(out.as_mut_ptr());
                // SAFETY: checked the CPU; `out` holds the product, on this thread only.
                unsafe { compute(&g, n, (a_view, b_view), ptr, 0..m, 0..n, Shared::default()) };
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let whole = run(usize::MAX);
            for kc in [1, 3] {
                assert!(run(kc) == whole, "{m}x{k}x{n} in stretches of {kc} chunks");
            }
        }
    }
}
