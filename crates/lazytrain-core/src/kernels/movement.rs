//! Data movement kernels: strided copies, concat, pad.

use super::numeric::fill_literal;
use super::strided::for_each_strided;
use crate::dtype::Literal;
use crate::shape::contiguous_strides;
use crate::storage::HostData;

/// Copies of at least this many elements are split in two along their
/// first axis longer than one and run on two threads (a permute of
/// BERT-tiny's attention heads, 2 MB, ran on one core at 6.5 GB/s).
const PARALLEL_COPY_MIN: usize = 1 << 17;

fn gather_strided<T: Copy + Send + Sync>(x: &[T], shape: &[usize], strides: &[usize], base: usize, o: &mut [T]) {
    // Leading axes of one element move no offset: split the first longer one.
    let lead = shape.iter().take_while(|&&d| d == 1).count();
    let (shape, strides) = (&shape[lead..], &strides[lead..]);
    if o.len() >= PARALLEL_COPY_MIN && shape.first().is_some_and(|&d| d >= 2) && rayon::current_num_threads() > 1 {
        let (outer, inner) = (shape[0], o.len() / shape[0]);
        let mid = outer / 2;
        let (first, second) = o.split_at_mut(mid * inner);
        let (first_shape, second_shape) = ([&[mid], &shape[1..]].concat(), [&[outer - mid], &shape[1..]].concat());
        rayon::join(
            || gather_rows(x, &first_shape, strides, base, first),
            || gather_rows(x, &second_shape, strides, base + mid * strides[0], second),
        );
        return;
    }
    gather_rows(x, shape, strides, base, o)
}

/// [`gather_strided`] on this thread.
fn gather_rows<T: Copy>(x: &[T], shape: &[usize], strides: &[usize], base: usize, o: &mut [T]) {
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

/// The concatenation of `parts` (each a slice and the elements it gives
/// every row) into `o`, which holds whole rows; two threads take half the
/// rows each when the output is large.
fn concat_typed<T: Copy + Send + Sync>(parts: &[(&[T], usize)], o: &mut [T]) {
    let row: usize = parts.iter().map(|(_, chunk)| chunk).sum();
    let rows = o.len() / row.max(1);
    if o.len() >= PARALLEL_COPY_MIN && rows >= 2 && rayon::current_num_threads() > 1 {
        let (top, bottom) = o.split_at_mut(rows / 2 * row);
        rayon::join(|| concat_rows(parts, 0..rows / 2, top), || concat_rows(parts, rows / 2..rows, bottom));
        return;
    }
    concat_rows(parts, 0..rows, o)
}

/// Rows `rows` of a concatenation of `parts` into `o` (whole rows), on
/// this thread.
fn concat_rows<T: Copy>(parts: &[(&[T], usize)], rows: std::ops::Range<usize>, o: &mut [T]) {
    let mut pos = 0;
    for r in rows {
        for (data, chunk) in parts {
            o[pos..pos + chunk].copy_from_slice(&data[r * chunk..(r + 1) * chunk]);
            pos += chunk;
        }
    }
}

/// Join `xs` (with shapes `shapes`) along `axis` into `out`.
pub(crate) fn concat(xs: &[&HostData], shapes: &[&[usize]], axis: usize, out: &mut HostData) -> Result<(), String> {
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
                    concat_typed(&parts, o);
                })*
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}

/// `o[base + index(i) . strides] = x[i]` over `shape`, a row of the
/// innermost axis at a time where it lies contiguous in `o`.
fn scatter_strided<T: Copy>(x: &[T], shape: &[usize], strides: &[usize], base: usize, o: &mut [T]) {
    if let (Some(&inner), Some(&1)) = (shape.last(), strides.last()) {
        let rank = shape.len();
        for_each_strided(&shape[..rank - 1], &strides[..rank - 1], base, |row, off| {
            o[off..off + inner].copy_from_slice(&x[row * inner..(row + 1) * inner]);
        });
        return;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A permute large enough to be split over two threads (behind a
    /// leading axis of one element) writes what the one-thread copy writes,
    /// and that is the permutation itself.
    #[test]
    fn split_copies_match_the_one_thread_copy() {
        let in_shape = [1, 8, 2, 128, 64];
        let out_shape = [1, 8, 128, 2, 64];
        let x: Vec<f32> = (0..in_shape.iter().product::<usize>()).map(|i| i as f32).collect();
        let strides = permuted_strides(&in_shape, &[0, 1, 3, 2, 4]);
        let numel = x.len();
        assert!(numel >= PARALLEL_COPY_MIN);
        let mut one_thread = vec![0f32; numel];
        gather_rows(&x, &out_shape, &strides, 0, &mut one_thread);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut split = vec![0f32; numel];
        pool.install(|| gather_strided(&x, &out_shape, &strides, 0, &mut split));
        assert_eq!(split, one_thread);
        // out[0, b, t, h, d] = x[0, b, h, t, d]
        let (b, t, h, d) = (5, 77, 1, 9);
        assert_eq!(split[((b * 128 + t) * 2 + h) * 64 + d], x[((b * 2 + h) * 128 + t) * 64 + d]);
    }

    /// A concatenation large enough for two threads writes every element
    /// where the join along the last axis puts it, from the right part.
    #[test]
    fn large_concatenations_put_every_part_in_its_columns() {
        let rows = 600;
        let widths = [256usize, 128, 64];
        let parts: Vec<Vec<f32>> = widths
            .iter()
            .enumerate()
            .map(|(k, &w)| (0..rows * w).map(|i| (k * 1_000_000 + i) as f32).collect())
            .collect();
        let row: usize = widths.iter().sum();
        assert!(rows * row >= PARALLEL_COPY_MIN);
        let inputs: Vec<HostData> = parts.iter().cloned().map(HostData::F32).collect();
        let refs: Vec<&HostData> = inputs.iter().collect();
        let shapes: Vec<Vec<usize>> = widths.iter().map(|&w| vec![rows, w]).collect();
        let shape_refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = HostData::F32(vec![0.0; rows * row]);
            pool.install(|| concat(&refs, &shape_refs, 1, &mut out)).unwrap();
            let HostData::F32(out) = out else { unreachable!() };
            for r in [0, 1, rows / 2 - 1, rows / 2, rows - 1] {
                let mut column = 0;
                for (k, &w) in widths.iter().enumerate() {
                    for c in [0, w / 2, w - 1] {
                        assert_eq!(
                            out[r * row + column + c],
                            parts[k][r * w + c],
                            "{threads} threads, row {r}, part {k}"
                        );
                    }
                    column += w;
                }
            }
        }
    }

    /// A pad copies each contiguous row of its input into the window and
    /// fills the rest with its value.
    #[test]
    fn pads_place_each_input_row_in_the_window() {
        let x = HostData::F32((0..15).map(|i| i as f32).collect());
        let mut out = HostData::F32(vec![0.0; 4 * 9]);
        pad(&x, &[3, 5], &[4, 9], &[1, 2], Literal::new(-1.0, crate::dtype::DType::F32), &mut out).unwrap();
        let HostData::F32(out) = out else { unreachable!() };
        for r in 0..4 {
            for c in 0..9 {
                let inside = (1..4).contains(&r) && (2..7).contains(&c);
                let expected = if inside { ((r - 1) * 5 + (c - 2)) as f32 } else { -1.0 };
                assert_eq!(out[r * 9 + c], expected, "row {r}, column {c}");
            }
        }
    }
}
