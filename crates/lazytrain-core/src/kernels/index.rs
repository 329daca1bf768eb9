//! Indexing kernels: gather (`take_along_axis`) and scatter-add.

use super::numeric::{to_i64_vec, FloatLike, IntLike};
use super::strided::for_each_strided;
use crate::shape::contiguous_strides;
use crate::storage::HostData;

/// For every index element, the offset in the data tensor it addresses.
fn addressed_offsets(
    data_shape: &[usize],
    index: &HostData,
    index_shape: &[usize],
    axis: usize,
) -> Result<Vec<usize>, String> {
    let mut strides = contiguous_strides(data_shape);
    let axis_stride = strides[axis];
    strides[axis] = 0;
    let dim = data_shape[axis] as i64;
    let idx = to_i64_vec(index);
    let mut offsets = vec![0usize; idx.len()];
    let mut bad = None;
    for_each_strided(index_shape, &strides, 0, |i, off| {
        let k = idx[i];
        if (0..dim).contains(&k) {
            offsets[i] = off + k as usize * axis_stride;
        } else if bad.is_none() {
            bad = Some(k);
        }
    });
    match bad {
        Some(k) => Err(format!("index {k} is out of range for axis {axis} of size {dim}")),
        None => Ok(offsets),
    }
}

/// `out[i] = src[offset(i)]`.
pub(crate) fn gather(
    src: &HostData,
    src_shape: &[usize],
    index: &HostData,
    index_shape: &[usize],
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    let offsets = addressed_offsets(src_shape, index, index_shape, axis)?;
    macro_rules! arm {
        ($($v:ident),*) => {
            match (src, out) {
                $((HostData::$v(s), HostData::$v(o)) => o.iter_mut().zip(&offsets).for_each(|(o, &off)| *o = s[off]),)*
                (s, o) => return Err(format!("gather from {} into {}", s.dtype(), o.dtype())),
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}

fn add_float<T: FloatLike>(o: &mut [T], upd: &[T], offsets: &[usize]) {
    for (u, &off) in upd.iter().zip(offsets) {
        o[off] = T::narrow(o[off].widen() + u.widen());
    }
}

fn add_int<T: IntLike>(o: &mut [T], upd: &[T], offsets: &[usize]) {
    for (u, &off) in upd.iter().zip(offsets) {
        o[off] = T::from_i64(o[off].to_i64().wrapping_add(u.to_i64()));
    }
}

/// `out = base; out[offset(i)] += updates[i]`.
pub(crate) fn scatter_add(
    base: &HostData,
    base_shape: &[usize],
    index: &HostData,
    index_shape: &[usize],
    updates: &HostData,
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    super::movement::strided_copy(base, &[base.len()], &[1], 0, out)?;
    scatter_add_inplace(base_shape, index, index_shape, updates, axis, out)
}

/// `out[offset(i)] += updates[i]`, in place: `out` holds the base on entry.
pub(crate) fn scatter_add_inplace(
    base_shape: &[usize],
    index: &HostData,
    index_shape: &[usize],
    updates: &HostData,
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    let offsets = addressed_offsets(base_shape, index, index_shape, axis)?;
    match (updates, out) {
        (HostData::F32(u), HostData::F32(o)) => add_float(o, u, &offsets),
        (HostData::F64(u), HostData::F64(o)) => add_float(o, u, &offsets),
        (HostData::BF16(u), HostData::BF16(o)) => add_float(o, u, &offsets),
        (HostData::F16(u), HostData::F16(o)) => add_float(o, u, &offsets),
        (HostData::I64(u), HostData::I64(o)) => add_int(o, u, &offsets),
        (HostData::I32(u), HostData::I32(o)) => add_int(o, u, &offsets),
        (HostData::U8(u), HostData::U8(o)) => add_int(o, u, &offsets),
        (u, o) => return Err(format!("scatter_add of {} into {}", u.dtype(), o.dtype())),
    }
    Ok(())
}
