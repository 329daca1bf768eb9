//! Reductions over axes (kept as size-1 dimensions).

use super::numeric::{FloatLike, IntLike, Real};
use super::strided::for_each_strided;
use crate::ir::ReduceOp;
use crate::shape::contiguous_strides;
use crate::storage::HostData;

/// For each input element, the offset of the output element it reduces into.
fn out_strides(in_shape: &[usize], axes: &[usize]) -> Vec<usize> {
    let out_shape: Vec<usize> =
        in_shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
    let mut s = contiguous_strides(&out_shape);
    for &a in axes {
        s[a] = 0;
    }
    s
}

/// How the reduced axes sit in the shape: `rows x inner` with the inner
/// block reduced (trailing axes) or the rows reduced (leading axes).
enum Layout {
    /// Reduce each contiguous row of `inner` elements.
    Trailing { inner: usize },
    /// Reduce `outer` rows of `inner` elements into one row.
    Leading { outer: usize, inner: usize },
    /// Any other axis set.
    General,
}

fn layout(in_shape: &[usize], axes: &[usize]) -> Layout {
    let rank = in_shape.len();
    let k = axes.len();
    let numel: usize = in_shape.iter().product();
    let inner: usize = in_shape[rank - k..].iter().product();
    // Rows of no elements take the general path, which writes the identity.
    if k > 0 && inner > 0 && axes.iter().enumerate().all(|(i, &a)| a == rank - k + i) {
        return Layout::Trailing { inner };
    }
    if k > 0 && axes.iter().enumerate().all(|(i, &a)| a == i) {
        let outer: usize = in_shape[..k].iter().product();
        return Layout::Leading { outer, inner: numel / outer.max(1) };
    }
    Layout::General
}

/// The eight interleaved lanes of a row being reduced: element `c` of the
/// row goes to lane `c % 8` (sums in `f64`, maxima in the math type `R`),
/// and the lanes are combined in a fixed order, so results are
/// reproducible and the independent chains vectorise. The unfused kernel
/// fills them a row at a time; fused kernels reducing rows tile by tile
/// fill the same lanes, so both give the same bits.
#[derive(Clone, Copy)]
pub(super) struct RowLanes<R> {
    sums: [f64; 8],
    maxima: [R; 8],
}

impl<R: Real> Default for RowLanes<R> {
    fn default() -> RowLanes<R> {
        RowLanes { sums: [0.0; 8], maxima: [R::NEG_INFINITY; 8] }
    }
}

impl<R: Real> RowLanes<R> {
    /// Add the row's elements `col..col + values.len()`.
    #[inline(always)]
    pub(super) fn add<T: FloatLike<Math = R>>(&mut self, op: ReduceOp, col: usize, values: &[T]) {
        let lead = ((8 - col % 8) % 8).min(values.len());
        let (head, rest) = values.split_at(lead);
        match op {
            ReduceOp::Sum => {
                // The sums live in a local (registers) while the chunks are
                // added (30 % faster row sums).
                let mut s = self.sums;
                let mut chunks = rest.chunks_exact(8);
                head.iter().enumerate().for_each(|(i, v)| s[(col + i) % 8] += v.widen().to_f64());
                for chunk in &mut chunks {
                    s.iter_mut().zip(chunk).for_each(|(a, v)| *a += v.widen().to_f64());
                }
                s.iter_mut().zip(chunks.remainder()).for_each(|(a, v)| *a += v.widen().to_f64());
                self.sums = s;
            }
            ReduceOp::Max => {
                // Likewise in a local (written back to `self` every chunk,
                // the lanes were compared one at a time), and in eight sets
                // of lanes over runs of 64 elements: one set waited on each
                // comparison. The maximum does not depend on the order (but
                // for the sign of a zero maximum among zeros of both signs);
                // BERT-tiny's vocabulary row maxima ran 5 % faster.
                let mut m = self.maxima;
                head.iter().enumerate().for_each(|(i, v)| m[(col + i) % 8] = pick(m[(col + i) % 8], v.widen()));
                let mut sets = [m; 8];
                let mut runs = rest.chunks_exact(64);
                for run in &mut runs {
                    for (set, chunk) in sets.iter_mut().zip(run.chunks_exact(8)) {
                        set.iter_mut().zip(chunk).for_each(|(a, v)| *a = pick(*a, v.widen()));
                    }
                }
                m = sets[0];
                for set in &sets[1..] {
                    m.iter_mut().zip(set).for_each(|(a, &v)| *a = pick(*a, v));
                }
                let mut chunks = runs.remainder().chunks_exact(8);
                for chunk in &mut chunks {
                    m.iter_mut().zip(chunk).for_each(|(a, v)| *a = pick(*a, v.widen()));
                }
                m.iter_mut().zip(chunks.remainder()).for_each(|(a, v)| *a = pick(*a, v.widen()));
                self.maxima = m;
            }
        }
    }

    /// The row's result: the lanes' sum (added in a fixed tree) or maximum
    /// (NaN if any element is NaN).
    pub(super) fn total(&self, op: ReduceOp) -> R {
        let s = &self.sums;
        match op {
            ReduceOp::Sum => R::from_f64(((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))),
            ReduceOp::Max => {
                self.maxima.into_iter().fold(R::NEG_INFINITY, |m, v| if m.is_nan() { m } else { pick(m, v) })
            }
        }
    }
}

/// The running maximum `m` after seeing `v` (NaN wins).
#[inline(always)]
fn pick<R: Real>(m: R, v: R) -> R {
    // `|`, not `||`: both comparisons, no branch, so the lanes vectorise.
    if (v > m) | v.is_nan() {
        v
    } else {
        m
    }
}

/// Inputs at least this large are reduced on all of the pool's threads.
const PARALLEL_MIN: usize = 1 << 18;

/// Output elements per thread (a multiple of `align`) when `x_len` input
/// elements reduce into `out_len` outputs; `None` runs on one thread.
fn chunk_per_thread(x_len: usize, out_len: usize, align: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (threads > 1 && x_len >= PARALLEL_MIN && out_len >= 2 * align)
        .then(|| out_len.div_ceil(threads).div_ceil(align) * align)
}

/// How many rows ahead a column sum asks for the columns it will read
/// ([`super::simd::prefetch`]): BERT-tiny's bias-gradient sums 25 % shorter
/// on the AMX Xeon (interleaved profiles).
const ROWS_AHEAD: usize = 4;

/// Sum `outer` rows of `inner` elements of `x` column by column into `o`
/// (columns `cols` of each row) in the canonical order of column sums:
/// the first `outer / 2` rows in order, the rest in order, then the two
/// partial sums added (fused kernels summing columns on two threads, one
/// half each, give the same bits; see `kernels::fused`).
fn sum_columns<T: FloatLike>(x: &[T], inner: usize, cols: std::ops::Range<usize>, o: &mut [T]) {
    super::simd::widest!(sum_columns_in(x, inner, cols, o))
}

#[inline(always)]
fn sum_columns_in<T: FloatLike>(x: &[T], inner: usize, cols: std::ops::Range<usize>, o: &mut [T]) {
    let rows = x.len() / inner.max(1);
    let (first, second) = x.split_at(rows / 2 * inner);
    let mut halves = [vec![0f64; cols.len()], vec![0f64; cols.len()]];
    for (acc, part) in halves.iter_mut().zip([first, second]) {
        for (r, row) in part.chunks_exact(inner).enumerate() {
            super::simd::prefetch(part.as_ptr().wrapping_add((r + ROWS_AHEAD) * inner + cols.start), cols.len());
            for (a, v) in acc.iter_mut().zip(&row[cols.clone()]) {
                *a += v.widen().to_f64();
            }
        }
    }
    for ((o, a), b) in o.iter_mut().zip(&halves[0]).zip(&halves[1]) {
        *o = T::narrow(T::Math::from_f64(a + b));
    }
}

/// Reduce each row of `inner` elements of `x` into its element of `o`.
#[inline(always)]
fn reduce_rows<T: FloatLike>(op: ReduceOp, o: &mut [T], x: &[T], inner: usize) {
    for (o, row) in o.iter_mut().zip(x.chunks_exact(inner)) {
        let mut lanes = RowLanes::default();
        lanes.add(op, 0, row);
        *o = T::narrow(lanes.total(op));
    }
}

/// Each output element is reduced by one thread in the same order as on
/// one thread, so splitting the work never changes a bit.
fn reduce_float<T: FloatLike>(op: ReduceOp, x: &[T], in_shape: &[usize], axes: &[usize], o: &mut [T]) {
    use rayon::prelude::*;
    match (layout(in_shape, axes), op) {
        (Layout::Trailing { inner }, ReduceOp::Sum | ReduceOp::Max) => {
            let rows = |o: &mut [T], x: &[T]| super::simd::widest!(reduce_rows(op, o, x, inner));
            match chunk_per_thread(x.len(), o.len(), 1) {
                Some(chunk) => o.par_chunks_mut(chunk).zip(x.par_chunks(chunk * inner)).for_each(|(o, x)| rows(o, x)),
                None => rows(o, x),
            }
            return;
        }
        (Layout::Leading { outer, inner }, ReduceOp::Sum) if outer > 0 => {
            match chunk_per_thread(x.len(), inner, 16) {
                Some(chunk) => o.par_chunks_mut(chunk).enumerate().for_each(|(t, o)| {
                    let start = t * chunk;
                    sum_columns(x, inner, start..start + o.len(), o)
                }),
                None => sum_columns(x, inner, 0..inner, o),
            }
            return;
        }
        _ => {}
    }
    let strides = out_strides(in_shape, axes);
    match op {
        ReduceOp::Sum => {
            let mut acc = vec![0f64; o.len()];
            for_each_strided(in_shape, &strides, 0, |i, off| acc[off] += x[i].widen().to_f64());
            for (o, a) in o.iter_mut().zip(acc) {
                *o = T::narrow(T::Math::from_f64(a));
            }
        }
        ReduceOp::Max => {
            let mut acc = vec![T::Math::NEG_INFINITY; o.len()];
            for_each_strided(in_shape, &strides, 0, |i, off| {
                let v = x[i].widen();
                if v > acc[off] || v.is_nan() {
                    acc[off] = v;
                }
            });
            for (o, a) in o.iter_mut().zip(acc) {
                *o = T::narrow(a);
            }
        }
    }
}

fn reduce_int<T: IntLike>(op: ReduceOp, x: &[T], in_shape: &[usize], axes: &[usize], o: &mut [T]) {
    let strides = out_strides(in_shape, axes);
    let init = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => i64::MIN,
    };
    let mut acc = vec![init; o.len()];
    for_each_strided(in_shape, &strides, 0, |i, off| {
        let v = x[i].to_i64();
        acc[off] = match op {
            ReduceOp::Sum => acc[off].wrapping_add(v),
            ReduceOp::Max => acc[off].max(v),
        };
    });
    for (o, a) in o.iter_mut().zip(acc) {
        *o = T::from_i64(a);
    }
}

/// Reduce `x` (shape `in_shape`) over `axes` into `out`. Float sums accumulate in `f64`.
pub(crate) fn reduce(
    op: ReduceOp,
    x: &HostData,
    in_shape: &[usize],
    axes: &[usize],
    out: &mut HostData,
) -> Result<(), String> {
    match (x, out) {
        (HostData::F32(x), HostData::F32(o)) => reduce_float(op, x, in_shape, axes, o),
        (HostData::F64(x), HostData::F64(o)) => reduce_float(op, x, in_shape, axes, o),
        (HostData::BF16(x), HostData::BF16(o)) => reduce_float(op, x, in_shape, axes, o),
        (HostData::F16(x), HostData::F16(o)) => reduce_float(op, x, in_shape, axes, o),
        (HostData::I64(x), HostData::I64(o)) => reduce_int(op, x, in_shape, axes, o),
        (HostData::I32(x), HostData::I32(o)) => reduce_int(op, x, in_shape, axes, o),
        (HostData::U8(x), HostData::U8(o)) => reduce_int(op, x, in_shape, axes, o),
        (x, _) => return Err(format!("cannot reduce {}", x.dtype())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows and columns of a large input reduced on one thread and on
    /// three: the same bits, and the f64 reference within f32 rounding.
    #[test]
    fn threads_split_reductions_without_changing_a_bit() {
        let (rows, cols) = (700, 1003);
        let mut x = vec![0f32; rows * cols];
        crate::random::uniform_f32(3, 0, &mut x);
        let x: Vec<f32> = x.iter().map(|v| 8.0 * v - 4.0).collect();
        let run = |threads: usize, op: ReduceOp, axis: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0f32; if axis == 1 { rows } else { cols }];
            pool.install(|| reduce_float(op, &x, &[rows, cols], &[axis], &mut out));
            out
        };
        for (op, axis) in [(ReduceOp::Sum, 1), (ReduceOp::Max, 1), (ReduceOp::Sum, 0)] {
            let one = run(1, op, axis);
            assert_eq!(one, run(3, op, axis), "{op:?} over axis {axis}");
            for (j, &got) in one.iter().enumerate() {
                let lane = |i: usize| f64::from(if axis == 1 { x[j * cols + i] } else { x[i * cols + j] });
                let n = if axis == 1 { cols } else { rows };
                let exact = match op {
                    ReduceOp::Sum => (0..n).map(lane).sum::<f64>(),
                    ReduceOp::Max => (0..n).map(lane).fold(f64::MIN, f64::max),
                };
                assert!((f64::from(got) - exact).abs() <= 1e-6 * exact.abs().max(1.0), "{op:?} {axis} {j}");
            }
        }
    }

    /// Row maxima (compared eight lanes at once, in eight sets of lanes
    /// over runs of 64): the largest element wherever it sits, NaN when any
    /// element is NaN, `-inf` rows stay `-inf`, and rows starting mid-lane
    /// (fused tiles) agree.
    #[test]
    fn row_maxima_find_the_largest_element_and_propagate_nan() {
        let cols = 237;
        let specials = [(0, f32::NAN), (13, f32::NAN), (36, f32::NAN), (20, f32::INFINITY), (8, 1e30)];
        let far = [(70, f32::NAN), (129, 1e30), (200, f32::INFINITY), (236, f32::NAN), (236, 7.5)];
        for (place, special) in specials.into_iter().chain(far) {
            let mut row: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            row[place] = special;
            let mut whole = RowLanes::<f32>::default();
            whole.add(ReduceOp::Max, 0, &row);
            let mut pieces = RowLanes::<f32>::default();
            pieces.add(ReduceOp::Max, 0, &row[..5]);
            pieces.add(ReduceOp::Max, 5, &row[5..22]);
            pieces.add(ReduceOp::Max, 22, &row[22..157]);
            pieces.add(ReduceOp::Max, 157, &row[157..]);
            for got in [whole.total(ReduceOp::Max), pieces.total(ReduceOp::Max)] {
                match special.is_nan() {
                    true => assert!(got.is_nan(), "NaN at {place}: {got}"),
                    false => assert_eq!(got, special, "{special} at {place}"),
                }
            }
        }
        let mut lanes = RowLanes::<f32>::default();
        lanes.add(ReduceOp::Max, 0, &[f32::NEG_INFINITY; 19]);
        assert_eq!(lanes.total(ReduceOp::Max), f32::NEG_INFINITY);
    }
}
