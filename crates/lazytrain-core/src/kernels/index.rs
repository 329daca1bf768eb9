//! Indexing kernels: gather (`take_along_axis`) and scatter-add.

use super::numeric::{to_i64_vec, FloatLike, IntLike};
use super::strided::for_each_strided;
use crate::shape::contiguous_strides;
use crate::storage::HostData;

/// The index operand of a gather or scatter: its buffer, its shape, and
/// its element strides when it is a strided view of the buffer (`None`:
/// contiguous).
pub(crate) struct IndexOperand<'a> {
    pub data: &'a HostData,
    pub shape: &'a [usize],
    pub strides: Option<&'a [usize]>,
}

impl IndexOperand<'_> {
    /// The index values in row-major order over the index shape.
    fn values(&self) -> Vec<i64> {
        let all = to_i64_vec(self.data);
        match self.strides {
            None => all,
            Some(strides) => {
                let mut values = vec![0i64; self.shape.iter().product()];
                for_each_strided(self.shape, strides, 0, |i, off| values[i] = all[off]);
                values
            }
        }
    }

    /// For an index of shape `[rows, cols]` read as a view that repeats one
    /// value along each row (an embedding's row ids broadcast along the
    /// hidden axis), the stride between the rows' values.
    fn row_stride(&self) -> Option<usize> {
        match (self.shape, self.strides) {
            (&[_, _], Some(&[rs, 0])) => Some(rs),
            _ => None,
        }
    }

    /// The value at element `offset` of the buffer.
    fn at(&self, offset: usize) -> i64 {
        match self.data {
            HostData::I64(v) => v[offset],
            HostData::I32(v) => i64::from(v[offset]),
            HostData::U8(v) => i64::from(v[offset]),
            HostData::Bool(v) => i64::from(v[offset]),
            // Indices are integers (the shape rules say so); a float index
            // reads as its truncation, as `to_i64_vec` has it.
            HostData::F32(v) => v[offset] as i64,
            HostData::F64(v) => v[offset] as i64,
            HostData::BF16(v) => v[offset].to_f32() as i64,
            HostData::F16(v) => v[offset].to_f32() as i64,
        }
    }
}

/// For every index element, the offset in the data tensor it addresses.
fn addressed_offsets(data_shape: &[usize], index: &IndexOperand, axis: usize) -> Result<Vec<usize>, String> {
    let mut strides = contiguous_strides(data_shape);
    let axis_stride = strides[axis];
    strides[axis] = 0;
    let dim = data_shape[axis] as i64;
    let idx = index.values();
    let mut offsets = vec![0usize; idx.len()];
    let mut bad = None;
    for_each_strided(index.shape, &strides, 0, |i, off| {
        let k = idx[i];
        if (0..dim).contains(&k) {
            offsets[i] = off + k as usize * axis_stride;
        } else if bad.is_none() {
            bad = Some(k);
        }
    });
    match bad {
        Some(k) => Err(out_of_range(k, axis, dim)),
        None => Ok(offsets),
    }
}

fn out_of_range(k: i64, axis: usize, dim: i64) -> String {
    format!("index {k} is out of range for axis {axis} of size {dim}")
}

/// When `index` is a row index along axis 0 of a `[rows, cols]` table (see
/// [`IndexOperand::row_stride`]) whose columns it spans, the table rows it
/// picks, checked against the table's rows, and `cols`.
fn row_picks(index: &IndexOperand, axis: usize, data_shape: &[usize]) -> Result<Option<(Vec<usize>, usize)>, String> {
    let (Some(row_stride), 0, &[dim, cols]) = (index.row_stride(), axis, data_shape) else { return Ok(None) };
    if index.shape[1] != cols {
        return Ok(None);
    }
    let rows = (0..index.shape[0])
        .map(|r| {
            let k = index.at(r * row_stride);
            usize::try_from(k).ok().filter(|&k| k < dim).ok_or_else(|| out_of_range(k, 0, dim as i64))
        })
        .collect::<Result<_, _>>()?;
    Ok(Some((rows, cols)))
}

/// `out[i] = src[offset(i)]`; a row index along axis 0 copies whole rows.
pub(crate) fn gather(
    src: &HostData,
    src_shape: &[usize],
    index: IndexOperand,
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    if let Some((rows, cols)) = row_picks(&index, axis, src_shape)? {
        macro_rules! rows_arm {
            ($($v:ident),*) => {
                match (src, out) {
                    $((HostData::$v(s), HostData::$v(o)) => copy_rows(s, o, &rows, cols),)*
                    (s, o) => return Err(format!("gather from {} into {}", s.dtype(), o.dtype())),
                }
            };
        }
        rows_arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
        return Ok(());
    }
    let offsets = addressed_offsets(src_shape, &index, axis)?;
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

/// Elements (of updates, or of a gather's output) from which row adds and
/// row copies share their work between the pool's threads: an embedding's
/// gradient (`[2048, 512]` rows into `[8192, 512]`) ran on one thread
/// while the other waited.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// Row `r` of `o` (rows of `cols`) is row `rows[r]` of `s`; large copies on
/// the pool's threads, blocks of rows each.
fn copy_rows<T: Copy + Send + Sync>(s: &[T], o: &mut [T], rows: &[usize], cols: usize) {
    use rayon::prelude::*;
    let copy = |(o, &k): (&mut [T], &usize)| o.copy_from_slice(&s[k * cols..(k + 1) * cols]);
    match rayon::current_num_threads() > 1 && o.len() >= PARALLEL_ELEMENTS && cols > 0 {
        true => o.par_chunks_exact_mut(cols).zip(rows.par_iter()).with_min_len(64).for_each(copy),
        false => o.chunks_exact_mut(cols.max(1)).zip(rows).for_each(copy),
    }
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
    index: IndexOperand,
    updates: &HostData,
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    super::movement::strided_copy(base, &[base.len()], &[1], 0, out)?;
    scatter_add_inplace(base_shape, index, updates, axis, out)
}

/// `out[offset(i)] += updates[i]`, in place: `out` holds the base on entry.
/// A row index along axis 0 adds whole rows, in the same order.
pub(crate) fn scatter_add_inplace(
    base_shape: &[usize],
    index: IndexOperand,
    updates: &HostData,
    axis: usize,
    out: &mut HostData,
) -> Result<(), String> {
    if let Some((rows, cols)) = row_picks(&index, axis, base_shape)? {
        macro_rules! rows_arm {
            ($($v:ident),*) => {
                match (updates, &mut *out) {
                    $((HostData::$v(u), HostData::$v(o)) => {
                        add_rows(o, u, &rows, cols);
                        return Ok(());
                    })*
                    // Integer (or mismatched) updates take the elementwise loop.
                    (_, _) => {}
                }
            };
        }
        rows_arm!(F32, F64, BF16, F16);
    }
    let offsets = addressed_offsets(base_shape, &index, axis)?;
    add_at(updates, out, &offsets)
}

/// Row `r` of `upd` added to row `rows[r]` of `o` (rows of `cols`), in the
/// order of the elementwise loop. Large ones split `o`'s rows between the
/// pool's threads, each adding in order the updates of the rows it holds:
/// every element's terms are added in the same order, so the same bits.
fn add_rows<T: FloatLike + Send + Sync>(o: &mut [T], upd: &[T], rows: &[usize], cols: usize) {
    use rayon::prelude::*;
    let (threads, out_rows) = (rayon::current_num_threads(), o.len() / cols.max(1));
    if threads < 2 || upd.len() < PARALLEL_ELEMENTS || out_rows < 2 {
        return add_held_rows(o, upd, rows, cols, 0);
    }
    let share = out_rows.div_ceil(threads);
    o.par_chunks_mut(share * cols).enumerate().for_each(|(t, held)| add_held_rows(held, upd, rows, cols, t * share));
}

/// [`add_rows`] for the updates whose rows lie in `held`, rows `first..` of
/// the output.
fn add_held_rows<T: FloatLike>(held: &mut [T], upd: &[T], rows: &[usize], cols: usize, first: usize) {
    let count = held.len() / cols.max(1);
    for (u, &k) in upd.chunks_exact(cols.max(1)).zip(rows) {
        if let Some(r) = k.checked_sub(first).filter(|&r| r < count) {
            for (o, u) in held[r * cols..(r + 1) * cols].iter_mut().zip(u) {
                *o = T::narrow(o.widen() + u.widen());
            }
        }
    }
}

/// `out[offsets[i]] += updates[i]`.
fn add_at(updates: &HostData, out: &mut HostData, offsets: &[usize]) -> Result<(), String> {
    match (updates, out) {
        (HostData::F32(u), HostData::F32(o)) => add_float(o, u, offsets),
        (HostData::F64(u), HostData::F64(o)) => add_float(o, u, offsets),
        (HostData::BF16(u), HostData::BF16(o)) => add_float(o, u, offsets),
        (HostData::F16(u), HostData::F16(o)) => add_float(o, u, offsets),
        (HostData::I64(u), HostData::I64(o)) => add_int(o, u, offsets),
        (HostData::I32(u), HostData::I32(o)) => add_int(o, u, offsets),
        (HostData::U8(u), HostData::U8(o)) => add_int(o, u, offsets),
        (u, o) => return Err(format!("scatter_add of {} into {}", u.dtype(), o.dtype())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row ids `[3]` broadcast to `[3, 4]` (view strides `[1, 0]`) against
    /// the same index materialised: the row copies and row adds give the
    /// elementwise loop's values; a bad id is an error either way.
    #[test]
    fn row_indices_read_through_a_view_match_the_materialised_index() {
        let table = HostData::F32((0..20).map(|v| v as f32 * 0.5).collect());
        let ids = HostData::I64(vec![4, 0, 4]);
        let view = IndexOperand { data: &ids, shape: &[3, 4], strides: Some(&[1, 0]) };
        let full = HostData::I64(vec![4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4]);
        let dense = IndexOperand { data: &full, shape: &[3, 4], strides: None };
        let (mut a, mut b) = (HostData::F32(vec![0.0; 12]), HostData::F32(vec![0.0; 12]));
        gather(&table, &[5, 4], view, 0, &mut a).unwrap();
        gather(&table, &[5, 4], dense, 0, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_f64_vec()[..4], [8.0, 8.5, 9.0, 9.5]);

        let updates = HostData::F32((0..12).map(|v| v as f32 + 0.25).collect());
        let (mut a, mut b) = (table.clone(), table.clone());
        let view = IndexOperand { data: &ids, shape: &[3, 4], strides: Some(&[1, 0]) };
        let dense = IndexOperand { data: &full, shape: &[3, 4], strides: None };
        scatter_add_inplace(&[5, 4], view, &updates, 0, &mut a).unwrap();
        scatter_add_inplace(&[5, 4], dense, &updates, 0, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_f64_vec()[16], 8.0 + 0.25 + 8.25, "row 4 gets rows 0 and 2 of the updates");

        let bad = HostData::I64(vec![1, 5, 0]);
        let view = IndexOperand { data: &bad, shape: &[3, 4], strides: Some(&[1, 0]) };
        let err = gather(&table, &[5, 4], view, 0, &mut HostData::F32(vec![0.0; 12])).unwrap_err();
        assert!(err.contains("index 5 is out of range for axis 0 of size 5"), "{err}");
    }

    /// Row adds and row copies large enough to share out between threads
    /// (on 1, 2 and 3) give the one-thread loop's values: every row's
    /// updates added in their order, repeated rows included.
    #[test]
    fn large_row_adds_and_copies_do_not_depend_on_the_thread_count() {
        let (table_rows, cols, picks) = (300, 256, 1000);
        let table: Vec<f32> = (0..table_rows * cols).map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0).collect();
        let ids: Vec<i64> = (0..picks).map(|r| ((r * 104_729) % table_rows) as i64).collect();
        let updates: Vec<f32> = (0..picks * cols).map(|i| ((i * 31) % 509) as f32 / 61.0 - 4.0).collect();
        let mut expected_sums = table.clone();
        for (r, &k) in ids.iter().enumerate() {
            for c in 0..cols {
                expected_sums[k as usize * cols + c] += updates[r * cols + c];
            }
        }
        let expected_rows: Vec<f32> =
            ids.iter().flat_map(|&k| table[k as usize * cols..(k as usize + 1) * cols].to_vec()).collect();
        let index = HostData::I64(ids);
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let (shape, strides) = ([picks, cols], [1, 0]);
                let view = || IndexOperand { data: &index, shape: &shape, strides: Some(&strides) };
                let mut sums = HostData::F32(table.clone());
                scatter_add_inplace(&[table_rows, cols], view(), &HostData::F32(updates.clone()), 0, &mut sums)
                    .unwrap();
                assert!(sums == HostData::F32(expected_sums.clone()), "row adds on {threads} threads");
                let mut rows = HostData::F32(vec![0.0; picks * cols]);
                gather(&HostData::F32(table.clone()), &[table_rows, cols], view(), 0, &mut rows).unwrap();
                assert!(rows == HostData::F32(expected_rows.clone()), "row copies on {threads} threads");
            });
        }
    }
}
