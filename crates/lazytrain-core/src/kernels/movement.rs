//! Data movement kernels: strided copies, concat, pad.

use super::numeric::fill_literal;
use super::strided::for_each_strided;
use crate::dtype::Literal;
use crate::shape::contiguous_strides;
use crate::storage::HostData;

fn gather_strided<T: Copy>(x: &[T], shape: &[usize], strides: &[usize], base: usize, o: &mut [T]) {
    // Rows that are contiguous (or broadcast) in the input copy (or fill) as a block.
    if let (Some(&inner), Some(&step)) = (shape.last(), strides.last()) {
        if inner > 0 && step <= 1 {
            let rank = shape.len();
            for_each_strided(&shape[..rank - 1], &strides[..rank - 1], base, |row, off| {
                let dst = &mut o[row * inner..(row + 1) * inner];
                if step == 1 {
                    dst.copy_from_slice(&x[off..off + inner]);
                } else {
                    dst.fill(x[off]);
                }
            });
            return;
        }
    }
    for_each_strided(shape, strides, base, |i, off| o[i] = x[off]);
}

/// `out[i] = x[base + index(i) . strides]` over `out_shape`: the kernel of
/// reshape (contiguous strides), permute, expand (zero strides) and slice.
pub(crate) fn strided_copy(
    x: &HostData,
    out_shape: &[usize],
    strides: &[usize],
    base: usize,
    out: &mut HostData,
) -> Result<(), String> {
    macro_rules! arm {
        ($($v:ident),*) => {
            match (x, out) {
                $((HostData::$v(x), HostData::$v(o)) => gather_strided(x, out_shape, strides, base, o),)*
                (x, o) => return Err(format!("copy from {} into {}", x.dtype(), o.dtype())),
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}

/// Strides that read an input of `in_shape` as a permutation `perm`.
pub(crate) fn permuted_strides(in_shape: &[usize], perm: &[usize]) -> Vec<usize> {
    let s = contiguous_strides(in_shape);
    perm.iter().map(|&p| s[p]).collect()
}

/// Strides that read an input of `in_shape` broadcast to its expanded shape.
pub(crate) fn expanded_strides(in_shape: &[usize]) -> Vec<usize> {
    let s = contiguous_strides(in_shape);
    in_shape.iter().zip(s).map(|(&d, s)| if d == 1 { 0 } else { s }).collect()
}

fn concat_typed<T: Copy>(parts: &[(&[T], usize)], outer: usize, o: &mut [T]) {
    let mut pos = 0;
    for row in 0..outer {
        for (data, chunk) in parts {
            o[pos..pos + chunk].copy_from_slice(&data[row * chunk..(row + 1) * chunk]);
            pos += chunk;
        }
    }
}

/// Join `xs` (with shapes `shapes`) along `axis` into `out`.
pub(crate) fn concat(xs: &[&HostData], shapes: &[&[usize]], axis: usize, out: &mut HostData) -> Result<(), String> {
    let outer: usize = shapes[0][..axis].iter().product();
    let chunk = |s: &[usize]| s[axis..].iter().product::<usize>();
    macro_rules! arm {
        ($($v:ident),*) => {
            match out {
                $(HostData::$v(o) => {
                    let mut parts = Vec::with_capacity(xs.len());
                    for (x, s) in xs.iter().zip(shapes) {
                        let HostData::$v(d) = x else { return Err("concat inputs differ in dtype".into()) };
                        parts.push((d.as_slice(), chunk(s)));
                    }
                    concat_typed(&parts, outer, o);
                })*
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}

fn scatter_strided<T: Copy>(x: &[T], shape: &[usize], strides: &[usize], base: usize, o: &mut [T]) {
    for_each_strided(shape, strides, base, |i, off| o[off] = x[i]);
}

/// Fill `out` with `value`, then place `x` (shape `in_shape`) at offset `low`.
pub(crate) fn pad(
    x: &HostData,
    in_shape: &[usize],
    out_shape: &[usize],
    low: &[usize],
    value: Literal,
    out: &mut HostData,
) -> Result<(), String> {
    fill_literal(out, value);
    let out_strides = contiguous_strides(out_shape);
    let base: usize = low.iter().zip(&out_strides).map(|(l, s)| l * s).sum();
    macro_rules! arm {
        ($($v:ident),*) => {
            match (x, out) {
                $((HostData::$v(x), HostData::$v(o)) => scatter_strided(x, in_shape, &out_strides, base, o),)*
                (x, o) => return Err(format!("pad from {} into {}", x.dtype(), o.dtype())),
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}
