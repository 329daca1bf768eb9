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
    if k > 0 && axes.iter().enumerate().all(|(i, &a)| a == rank - k + i) {
        return Layout::Trailing { inner: in_shape[rank - k..].iter().product::<usize>().max(1) };
    }
    if k > 0 && axes.iter().enumerate().all(|(i, &a)| a == i) {
        let outer: usize = in_shape[..k].iter().product();
        return Layout::Leading { outer, inner: numel / outer.max(1) };
    }
    Layout::General
}

/// The sum of `row` in `f64` with eight interleaved accumulators (a fixed
/// order, so the result is reproducible, and independent chains that
/// vectorise instead of one serial dependency).
fn sum_f64<T: FloatLike>(row: &[T]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, v) in acc.iter_mut().zip(chunk) {
            *a += v.widen().to_f64();
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += v.widen().to_f64();
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// The maximum of `row` (NaN if any element is NaN) over eight interleaved
/// lanes, which vectorise.
fn max_lanes<T: FloatLike>(row: &[T]) -> T::Math {
    let pick = |m: T::Math, v: T::Math| if v > m || v.is_nan() { v } else { m };
    let mut acc = [T::Math::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, v) in acc.iter_mut().zip(chunk) {
            *a = pick(*a, v.widen());
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = pick(*a, v.widen());
    }
    acc.into_iter().fold(T::Math::NEG_INFINITY, |m, v| if m.is_nan() { m } else { pick(m, v) })
}

fn reduce_float<T: FloatLike>(op: ReduceOp, x: &[T], in_shape: &[usize], axes: &[usize], o: &mut [T]) {
    match (layout(in_shape, axes), op) {
        (Layout::Trailing { inner }, ReduceOp::Sum) => {
            for (o, row) in o.iter_mut().zip(x.chunks_exact(inner)) {
                *o = T::narrow(T::Math::from_f64(sum_f64(row)));
            }
            return;
        }
        (Layout::Trailing { inner }, ReduceOp::Max) => {
            for (o, row) in o.iter_mut().zip(x.chunks_exact(inner)) {
                *o = T::narrow(max_lanes(row));
            }
            return;
        }
        (Layout::Leading { outer, inner }, ReduceOp::Sum) if outer > 0 => {
            let mut acc = vec![0f64; inner];
            for row in x.chunks_exact(inner) {
                for (a, v) in acc.iter_mut().zip(row) {
                    *a += v.widen().to_f64();
                }
            }
            for (o, a) in o.iter_mut().zip(acc) {
                *o = T::narrow(T::Math::from_f64(a));
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
