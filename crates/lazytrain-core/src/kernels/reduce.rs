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

fn reduce_float<T: FloatLike>(op: ReduceOp, x: &[T], in_shape: &[usize], axes: &[usize], o: &mut [T]) {
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
