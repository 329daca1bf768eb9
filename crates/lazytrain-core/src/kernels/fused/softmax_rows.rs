//! The row chain of a softmax's forward and backward over wide rows (the
//! masked-LM head's vocabulary logits), run as three fused loops over each
//! row instead of programs interpreted tile by tile.
//!
//! The chain, as the schedule builds it for `log_softmax(x + bias)` and its
//! gradient: (1) `m = row_max(x + bias)`; (2) `e = exp(x + bias - m)`,
//! `s = row_sum(e)`; (3) `r = g / s` (one value per row); (4) `d = r * e`
//! and `column_sum(d)` (the bias's gradient). Where the logits `x + bias`
//! are stored (their row maxima then come from before the chain), the
//! chain starts at (2) with `e = exp(t - m)`. The interpreter runs each
//! program over tiles of registers in memory, every instruction a loop of
//! its own; here each row goes through three loops that keep the values
//! in registers (BERT-tiny's dense head: 4 096 rows of 8 192 logits).
//!
//! The arithmetic is the interpreter's own, element by element and in the
//! same order: the same `exp`, the row sums in the same lanes and order,
//! the column sums in `f64` row after row with the rows split at the middle
//! one. The results are the same bits (unit test), but for the sign of a
//! row maximum of zero among zeros of both signs (the interpreter's tiles
//! can straddle rows, and which zero a maximum keeps depends on where its
//! runs start), which no later value reads differently.

use super::{ChainLink, OutView, Source, TILE};
use crate::dtype::DType;
use crate::ir::{BinaryOp, ReduceOp, UnaryOp};
use crate::kernels::numeric::exp_f32;
use crate::kernels::reduce::RowLanes;
use crate::kernels::simd;
use crate::schedule::Access;
use crate::storage::HostData;

use super::Instr::{Binary, ColumnSum, Load, ReduceStore, Store, Unary};
use super::Src::Reg;

/// How a program reads one of its inputs at element `(row, column)`.
#[derive(Clone, Copy)]
enum Reader {
    /// At `row * width + column`.
    Rows(*const f32),
    /// At `row`: one value per row.
    RowValue(*const f32),
    /// At `column`: one value per column.
    ColumnValue(*const f32),
}

impl Reader {
    /// The reader of input `load` of `link` over rows of `width`, when the
    /// input is f32 and read in one of [`Reader`]'s ways.
    fn of(link: &ChainLink, load: usize, (rows, width): (usize, usize)) -> Option<Reader> {
        let spec = link.program.loads.get(load)?;
        let f32_view = |view: &OutView| match view {
            OutView::F32(p) => Some(p.cast_const()),
            OutView::BF16(_) | OutView::Bool(_) => None,
        };
        match (link.inputs.get(spec.input)?, &spec.access) {
            (Source::Data(HostData::F32(v)), Access::Contiguous) if v.len() == rows * width => {
                Some(Reader::Rows(v.as_ptr()))
            }
            (Source::Data(HostData::F32(v)), Access::Strided(s)) if s[..] == [0, 1] && v.len() >= width => {
                Some(Reader::ColumnValue(v.as_ptr()))
            }
            (Source::Data(HostData::F32(v)), Access::Strided(s)) if s[..] == [1, 0] && v.len() >= rows => {
                Some(Reader::RowValue(v.as_ptr()))
            }
            (Source::Output(k), Access::Contiguous) => f32_view(link.outputs.get(*k)?).map(Reader::Rows),
            (Source::Chained { view, per_row: 1 }, Access::Contiguous) => f32_view(view).map(Reader::Rows),
            (Source::Chained { view, per_row }, Access::Strided(s)) if *per_row == width && s[..] == [1, 0] => {
                f32_view(view).map(Reader::RowValue)
            }
            _ => None,
        }
    }

    /// The buffer of a reader at `row * width + column`.
    fn rows(self) -> Option<*const f32> {
        match self {
            Reader::Rows(p) => Some(p),
            Reader::RowValue(_) | Reader::ColumnValue(_) => None,
        }
    }

    /// The buffer of a reader at `row`.
    fn row_value(self) -> Option<*const f32> {
        match self {
            Reader::RowValue(p) => Some(p),
            Reader::Rows(_) | Reader::ColumnValue(_) => None,
        }
    }

    /// The buffer of a reader at `column`.
    fn column_value(self) -> Option<*const f32> {
        match self {
            Reader::ColumnValue(p) => Some(p),
            Reader::Rows(_) | Reader::RowValue(_) => None,
        }
    }
}

/// The four links of a softmax row chain, ready to run.
pub(crate) struct SoftmaxRows {
    rows: usize,
    width: usize,
    /// (1), when the chain starts with it.
    maxima: Option<RowMaxima>,
    /// (2) reads the logits and the row maxima through its own inputs, and
    /// writes `e` and the row sums.
    logits: Logits,
    max_in: *const f32,
    exp_out: *mut f32,
    sum_out: *mut f32,
    /// (3) reads `g` and the row sums (one per row) and writes the ratios.
    numerator: *const f32,
    sum_in: *const f32,
    ratio_out: *mut f32,
    /// (4) reads the ratios (one per row) and `e`, and writes `d`.
    ratio_in: *const f32,
    exp_in: *const f32,
    grad_out: *mut f32,
}

/// Link (1): reads `x` (rows) and the bias (one value per column) and
/// writes the row maxima of `x + bias`.
struct RowMaxima {
    x: *const f32,
    bias: *const f32,
    max_out: *mut f32,
}

/// How link (2) reads the logits.
#[derive(Clone, Copy)]
enum Logits {
    /// `x + bias`, added again (the sum is never stored).
    Biased { x: *const f32, bias: *const f32 },
    /// Stored logits (their row maxima come from before the chain).
    Stored(*const f32),
}

/// A program's instructions: its first two inputs loaded into registers 0
/// and 1, then `rest`.
fn after_two_loads(rest: impl IntoIterator<Item = super::Instr>) -> Vec<super::Instr> {
    [Load { load: 0, dst: 0 }, Load { load: 1, dst: 1 }].into_iter().chain(rest).collect()
}

/// The instructions of (1): `row_max(x + bias)`.
fn row_maxima() -> Vec<super::Instr> {
    after_two_loads([
        Binary { op: BinaryOp::Add, a: Reg(0), b: Reg(1), dst: 2 },
        ReduceStore { op: ReduceOp::Max, src: 2, out: 0 },
    ])
}

/// The instructions of (2) over biased logits: `e = exp(x + bias - m)`
/// and `row_sum(e)`.
fn biased_exponentials() -> Vec<super::Instr> {
    after_two_loads([
        Binary { op: BinaryOp::Add, a: Reg(0), b: Reg(1), dst: 2 },
        Load { load: 2, dst: 1 },
        Binary { op: BinaryOp::Sub, a: Reg(2), b: Reg(1), dst: 0 },
        Unary { op: UnaryOp::Exp, src: 0, dst: 1 },
        Store { src: 1, out: 0 },
        ReduceStore { op: ReduceOp::Sum, src: 1, out: 1 },
    ])
}

/// The instructions of (2) over stored logits: `e = exp(t - m)` and
/// `row_sum(e)`.
fn stored_exponentials() -> Vec<super::Instr> {
    after_two_loads([
        Binary { op: BinaryOp::Sub, a: Reg(0), b: Reg(1), dst: 2 },
        Unary { op: UnaryOp::Exp, src: 2, dst: 1 },
        Store { src: 1, out: 0 },
        ReduceStore { op: ReduceOp::Sum, src: 1, out: 1 },
    ])
}

/// The instructions of (3): `g / s`.
fn ratios() -> Vec<super::Instr> {
    after_two_loads([Binary { op: BinaryOp::Div, a: Reg(0), b: Reg(1), dst: 2 }, Store { src: 2, out: 0 }])
}

/// The output of (4) that holds its column sums.
const COLUMN_SUMS: usize = 1;

/// The instructions of (4): `d = r * e` and `column_sum(d)`.
fn gradient() -> Vec<super::Instr> {
    after_two_loads([
        Binary { op: BinaryOp::Mul, a: Reg(0), b: Reg(1), dst: 2 },
        Store { src: 2, out: 0 },
        ColumnSum { src: 2, out: COLUMN_SUMS },
    ])
}

// SAFETY: the threads of one run read the shared inputs and write
// disjoint rows of the outputs (see `SoftmaxRows::run_rows`).
unsafe impl Sync for SoftmaxRows {}

impl SoftmaxRows {
    /// The chain `links` over `rows` rows when it is exactly a softmax row
    /// chain of f32 values, from (1) or from (2) over stored logits; `None`
    /// otherwise (the interpreter runs it).
    pub(crate) fn of(links: &[ChainLink], rows: usize) -> Option<SoftmaxRows> {
        let (first, [b, c, d]) = match links {
            [a, b, c, d] => (Some(a), [b, c, d]),
            [b, c, d] => (None, [b, c, d]),
            _ => return None,
        };
        let width = b.program.shape.last().copied()?;
        let wide = [rows, width];
        let exponentials = if first.is_some() { biased_exponentials() } else { stored_exponentials() };
        let fits =
            |link: &ChainLink, shape: &[usize], instrs: Vec<super::Instr>, reduce_inner: usize, column_len: usize| {
                let p = link.program;
                p.shape == shape
                    && p.instrs == instrs
                    && p.reduce_inner == reduce_inner
                    && p.column_len == column_len
                    && p.output_dtypes.iter().all(|t| *t == DType::F32)
            };
        let all_fit = width > 0
            && first.is_none_or(|a| fits(a, &wide, row_maxima(), width, 0))
            && fits(b, &wide, exponentials, width, 0)
            && fits(c, &[rows, 1], ratios(), 0, 0)
            && fits(d, &wide, gradient(), 0, width);
        if !all_fit {
            return None;
        }
        let out = |link: &ChainLink, k: usize| match link.outputs.get(k)? {
            OutView::F32(p) => Some(*p),
            OutView::BF16(_) | OutView::Bool(_) => None,
        };
        let (dims, narrow) = ((rows, width), (rows, 1));
        let (maxima, logits, max_load) = match first {
            Some(a) => {
                let maxima = RowMaxima {
                    x: Reader::of(a, 0, dims)?.rows()?,
                    bias: Reader::of(a, 1, dims)?.column_value()?,
                    max_out: out(a, 0)?,
                };
                let logits = Logits::Biased {
                    x: Reader::of(b, 0, dims)?.rows()?,
                    bias: Reader::of(b, 1, dims)?.column_value()?,
                };
                (Some(maxima), logits, 2)
            }
            None => (None, Logits::Stored(Reader::of(b, 0, dims)?.rows()?), 1),
        };
        Some(SoftmaxRows {
            rows,
            width,
            maxima,
            logits,
            max_in: Reader::of(b, max_load, dims)?.row_value()?,
            exp_out: out(b, 0)?,
            sum_out: out(b, 1)?,
            numerator: Reader::of(c, 0, narrow)?.rows()?,
            sum_in: Reader::of(c, 1, narrow)?.rows()?,
            ratio_out: out(c, 0)?,
            ratio_in: Reader::of(d, 0, dims)?.row_value()?,
            exp_in: Reader::of(d, 1, dims)?.rows()?,
            grad_out: out(d, 0)?,
        })
    }

    /// Rows `lo..hi`, one after another, adding (4)'s values into its
    /// column sums' `f64` partials (`partials`: one per output of (4), as
    /// `FusedProgram::column_partials` makes them).
    ///
    /// # Safety
    /// The pointers address buffers sized for the chain, alive and touched
    /// by no other thread in these rows.
    pub(crate) unsafe fn run_rows(&self, lo: usize, hi: usize, partials: &mut [Vec<f64>]) {
        let columns = &mut partials[COLUMN_SUMS];
        simd::widest!(self.rows_inline(lo, hi, columns))
    }

    /// [`SoftmaxRows::run_rows`], inlined into each SIMD copy.
    ///
    /// # Safety
    /// As for [`SoftmaxRows::run_rows`].
    #[inline(always)]
    unsafe fn rows_inline(&self, lo: usize, hi: usize, columns: &mut [f64]) {
        debug_assert!(hi <= self.rows && columns.len() == self.width);
        let w = self.width;
        // SAFETY: the caller's: every buffer holds the rows' elements (or
        // the row's or column's value) read or written below; a tile read
        // is dead before the same elements are written.
        let tile_at = |p: *const f32, at: usize, len: usize| unsafe { std::slice::from_raw_parts(p.add(at), len) };
        let tile_mut = |p: *mut f32, at: usize, len: usize| unsafe { std::slice::from_raw_parts_mut(p.add(at), len) };
        let mut whole = [0f32; TILE];
        for row in lo..hi {
            // (1) The row maximum of x + bias, fed to the lanes a tile at a time.
            if let Some(first) = &self.maxima {
                let mut lanes = RowLanes::<f32>::default();
                for col in (0..w).step_by(TILE) {
                    let (len, tile) = (TILE.min(w - col), &mut whole);
                    // The next tile of logits (the row's or the next row's):
                    // the chain 8 % shorter on BERT-tiny's dense head.
                    simd::prefetch(first.x.wrapping_add(row * w + col + TILE), TILE);
                    let (x, bias) = (tile_at(first.x, row * w + col, len), tile_at(first.bias, col, len));
                    tile.iter_mut().zip(x).zip(bias).for_each(|((t, &x), &b)| *t = x + b);
                    lanes.add(ReduceOp::Max, col, &tile[..len]);
                }
                // SAFETY: as above, for the one-per-row values.
                unsafe { *first.max_out.add(row) = lanes.total(ReduceOp::Max) };
            }
            // (2) e = exp(logits - m) and its row sum.
            // SAFETY: as above.
            let max = unsafe { *self.max_in.add(row) };
            let mut lanes = RowLanes::<f32>::default();
            for col in (0..w).step_by(TILE) {
                let len = TILE.min(w - col);
                let tile = &mut whole[..len];
                match self.logits {
                    Logits::Biased { x, bias } => {
                        let (x, bias) = (tile_at(x, row * w + col, len), tile_at(bias, col, len));
                        tile.iter_mut().zip(x).zip(bias).for_each(|((t, &x), &b)| *t = (x + b) - max);
                    }
                    Logits::Stored(logits) => {
                        let logits = tile_at(logits, row * w + col, len);
                        tile.iter_mut().zip(logits).for_each(|(t, &x)| *t = x - max);
                    }
                }
                exp_tile(tile);
                tile_mut(self.exp_out, row * w + col, len).copy_from_slice(tile);
                lanes.add(ReduceOp::Sum, col, tile);
            }
            // SAFETY: as above.
            unsafe {
                *self.sum_out.add(row) = lanes.total(ReduceOp::Sum);
                // (3) The row's ratio.
                *self.ratio_out.add(row) = *self.numerator.add(row) / *self.sum_in.add(row);
            }
            // (4) d = r * e, and the column sums.
            // SAFETY: as above.
            let ratio = unsafe { *self.ratio_in.add(row) };
            for col in (0..w).step_by(TILE) {
                let len = TILE.min(w - col);
                let tile = &mut whole[..len];
                let e = tile_at(self.exp_in, row * w + col, len);
                tile.iter_mut().zip(e).for_each(|(t, &e)| *t = ratio * e);
                tile_mut(self.grad_out, row * w + col, len).copy_from_slice(tile);
                columns[col..col + len].iter_mut().zip(&*tile).for_each(|(s, &v)| *s += f64::from(v));
            }
        }
    }
}

/// `e^x` of each value, in place: 16 AVX-512 lanes at a time where the CPU
/// has them (the same bits, see [`crate::kernels::numeric_avx512`]).
#[inline(always)]
fn exp_tile(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx512() {
        // SAFETY: AVX-512 was detected on this CPU.
        return unsafe { crate::kernels::numeric_avx512::exp_in_place(values) };
    }
    values.iter_mut().for_each(|v| *v = exp_f32(*v));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fused::{run_chain, FusedProgram};
    use crate::schedule::Load as Spec;

    fn program(shape: &[usize], loads: Vec<Access>, k: usize, outputs: usize) -> FusedProgram {
        let width = shape[1];
        FusedProgram {
            shape: shape.to_vec(),
            loads: loads.into_iter().enumerate().map(|(input, access)| Spec { input, access }).collect(),
            instrs: [row_maxima(), biased_exponentials(), ratios(), gradient()][k].clone(),
            registers: 3,
            output_dtypes: vec![DType::F32; outputs],
            reduce_inner: if k < 2 { width } else { 0 },
            column_len: if k == 3 { width } else { 0 },
            gelu: None,
            lanes: None,
        }
    }

    /// The four programs of a softmax row chain over `rows x width`.
    fn programs(rows: usize, width: usize) -> [FusedProgram; 4] {
        let (wide, column, row) = ([rows, width], Access::Strided(vec![0, 1]), Access::Strided(vec![1, 0]));
        [
            program(&wide, vec![Access::Contiguous, column.clone()], 0, 1),
            program(&wide, vec![Access::Contiguous, column, row.clone()], 1, 2),
            program(&[rows, 1], vec![Access::Contiguous, Access::Contiguous], 2, 1),
            program(&wide, vec![row, Access::Contiguous], 3, 2),
        ]
    }

    fn values(len: usize, salt: usize, spread: f32) -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * spread).collect()
    }

    fn f32s(data: &HostData) -> &[f32] {
        match data {
            HostData::F32(v) => v,
            other => panic!("unexpected {}", other.dtype()),
        }
    }

    fn view(data: &mut HostData) -> OutView {
        OutView::of(data).unwrap()
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Each program run whole, one after the other: the row maxima, the
    /// exponentials' row sums, the ratios, the gradient and its column sums.
    fn one_by_one(p: &[FusedProgram; 4], x: &HostData, bias: &HostData, g: &HostData) -> [HostData; 5] {
        let (rows, width) = (p[0].shape[0], p[0].shape[1]);
        let mut max = [HostData::F32(vec![0.0; rows])];
        p[0].run(&[Source::Data(x), Source::Data(bias)], &mut max).unwrap();
        let mut exp_sum = [HostData::F32(vec![0.0; rows * width]), HostData::F32(vec![0.0; rows])];
        p[1].run(&[Source::Data(x), Source::Data(bias), Source::Data(&max[0])], &mut exp_sum).unwrap();
        let mut ratio = [HostData::F32(vec![0.0; rows])];
        p[2].run(&[Source::Data(g), Source::Data(&exp_sum[1])], &mut ratio).unwrap();
        let mut grad = [HostData::F32(vec![0.0; rows * width]), HostData::F32(vec![0.0; width])];
        p[3].run(&[Source::Data(&ratio[0]), Source::Data(&exp_sum[0])], &mut grad).unwrap();
        let [max] = max;
        let [_, sum] = exp_sum;
        let [ratio] = ratio;
        let [grad, columns] = grad;
        [max, sum, ratio, grad, columns]
    }

    /// The chain as the model's step has it: the exponentials, then the
    /// gradient, overwrite the logits in place; the ratios overwrite `g`.
    #[test]
    fn the_fused_rows_give_the_interpreters_bits_in_place() {
        // Rows of whole tiles, and rows ending in a part of a tile (of a
        // length that is not a multiple of eight either).
        for width in [2 * TILE, 1500] {
            fused_rows_in_place(301, width);
        }
    }

    fn fused_rows_in_place(rows: usize, width: usize) {
        let p = programs(rows, width);
        let x = HostData::F32(values(rows * width, 1, 8.0));
        let bias = HostData::F32(values(width, 2, 1.0));
        let g = HostData::F32(values(rows, 3, 2.0));
        let want = one_by_one(&p, &x, &bias, &g);

        let mut logits = x.clone();
        let mut ratio = g.clone();
        let (mut max, mut sum) = (HostData::F32(vec![0.0; rows]), HostData::F32(vec![0.0; rows]));
        let mut columns = HostData::F32(vec![0.0; width]);
        let (lv, rv, mv, sv) = (view(&mut logits), view(&mut ratio), view(&mut max), view(&mut sum));
        let links = [
            ChainLink {
                program: &p[0],
                inputs: vec![Source::Chained { view: lv, per_row: 1 }, Source::Data(&bias)],
                outputs: vec![mv],
            },
            ChainLink {
                program: &p[1],
                inputs: vec![Source::Output(0), Source::Data(&bias), Source::Chained { view: mv, per_row: width }],
                outputs: vec![lv, sv],
            },
            ChainLink {
                program: &p[2],
                inputs: vec![Source::Output(0), Source::Chained { view: sv, per_row: 1 }],
                outputs: vec![rv],
            },
            ChainLink {
                program: &p[3],
                inputs: vec![Source::Chained { view: rv, per_row: width }, Source::Output(0)],
                outputs: vec![lv, view(&mut columns)],
            },
        ];
        assert!(SoftmaxRows::of(&links, rows).is_some(), "the chain is recognised");
        run_chain(&links, rows).unwrap();
        let got = [&max, &sum, &ratio, &logits, &columns];
        for (k, (got, want)) in got.iter().zip(&want).enumerate() {
            let (got, want) = (bits(f32s(got)), bits(f32s(want)));
            assert_eq!(got.len(), want.len(), "width {width}, output {k}");
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(first, None, "width {width}, output {k}: the first element that differs");
        }
        // The gradient's rows sum to each row's g (the softmax sums to one).
        let gs = f32s(&g);
        for (row, chunk) in f32s(&logits).chunks(width).enumerate() {
            let total: f64 = chunk.iter().map(|&v| f64::from(v)).sum();
            assert!((total - f64::from(gs[row])).abs() < 1e-4, "row {row}: {total}");
        }
    }

    /// Other chains are left to the interpreter: a program computing
    /// something else.
    #[test]
    fn only_the_softmax_chain_is_recognised() {
        fn links_of<'a>(p: &'a [FusedProgram; 4], data: &'a [HostData; 3], outs: &[OutView; 6]) -> Vec<ChainLink<'a>> {
            let width = p[0].shape[1];
            vec![
                ChainLink {
                    program: &p[0],
                    inputs: vec![Source::Data(&data[0]), Source::Data(&data[1])],
                    outputs: vec![outs[0]],
                },
                ChainLink {
                    program: &p[1],
                    inputs: vec![
                        Source::Data(&data[0]),
                        Source::Data(&data[1]),
                        Source::Chained { view: outs[0], per_row: width },
                    ],
                    outputs: vec![outs[1], outs[2]],
                },
                ChainLink {
                    program: &p[2],
                    inputs: vec![Source::Data(&data[2]), Source::Chained { view: outs[2], per_row: 1 }],
                    outputs: vec![outs[3]],
                },
                ChainLink {
                    program: &p[3],
                    inputs: vec![
                        Source::Chained { view: outs[3], per_row: width },
                        Source::Chained { view: outs[1], per_row: 1 },
                    ],
                    outputs: vec![outs[4], outs[5]],
                },
            ]
        }
        for (width, changed, recognised) in [(TILE, false, true), (TILE + 16, false, true), (TILE, true, false)] {
            let rows = 3;
            let mut p = programs(rows, width);
            if changed {
                p[3].instrs[2] = Binary { op: BinaryOp::Add, a: Reg(0), b: Reg(1), dst: 2 };
            }
            let data = [
                HostData::F32(values(rows * width, 1, 1.0)),
                HostData::F32(values(width, 2, 1.0)),
                HostData::F32(values(rows, 3, 1.0)),
            ];
            let mut bufs = [
                HostData::F32(vec![0.0; rows]),
                HostData::F32(vec![0.0; rows * width]),
                HostData::F32(vec![0.0; rows]),
                HostData::F32(vec![0.0; rows]),
                HostData::F32(vec![0.0; rows * width]),
                HostData::F32(vec![0.0; width]),
            ];
            let outs = bufs.each_mut().map(view);
            let links = links_of(&p, &data, &outs);
            assert_eq!(SoftmaxRows::of(&links, rows).is_some(), recognised, "width {width}, changed {changed}");
        }
    }
}
