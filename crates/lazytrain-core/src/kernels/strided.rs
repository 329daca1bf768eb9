//! Strided iteration: the one loop behind permute, expand, slice, pad,
//! reductions and indexing.

/// Call `f(i, offset)` for every element `i` of `shape` in row-major order,
/// where `offset = base + sum(index[d] * strides[d])`.
pub(crate) fn for_each_strided(shape: &[usize], strides: &[usize], base: usize, mut f: impl FnMut(usize, usize)) {
    if shape.contains(&0) {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f(0, base);
        return;
    }
    let inner = shape[rank - 1];
    let inner_stride = strides[rank - 1];
    let mut index = vec![0usize; rank - 1];
    let mut offset = base;
    let mut linear = 0;
    loop {
        for j in 0..inner {
            f(linear, offset + j * inner_stride);
            linear += 1;
        }
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            offset += strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_offsets() {
        let mut offsets = Vec::new();
        for_each_strided(&[3, 2], &[1, 3], 0, |_, o| offsets.push(o));
        assert_eq!(offsets, vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn scalar_and_empty() {
        let mut n = 0;
        for_each_strided(&[], &[], 5, |i, o| {
            assert_eq!((i, o), (0, 5));
            n += 1;
        });
        for_each_strided(&[2, 0], &[0, 1], 0, |_, _| n += 1);
        assert_eq!(n, 1);
    }
}
