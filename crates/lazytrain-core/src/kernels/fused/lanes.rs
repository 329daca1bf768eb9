//! Straight-line programs run a vector of elements at a time.
//!
//! The interpreter makes one pass per instruction over tile-sized registers
//! in memory: a program of twenty instructions reads and writes its tiles
//! twenty times, and copies each input into a tile and each output out of
//! one. A program whose loads read their inputs at the program's own
//! positions, read one value, or read one value per row, whose instructions
//! are plain IEEE arithmetic, comparisons and selections, and which stores
//! every output at its own positions or reduces it over rows (the
//! optimizer's update: AdamW's twenty instructions over four inputs and
//! three outputs; LayerNorm's passes, which also read a value per column)
//! runs here instead: every instruction on [`LANES`] elements, then every
//! instruction on the next, its values in a register file of a few vectors
//! that never leaves the L1 cache, each input read straight from its buffer
//! once (a value loaded twice is read once) and each output written once,
//! in order, as the hardware prefetchers like; immediates and single-value
//! loads are registers set once per run. Measured on a 2-core AMD Zen 4: AdamW over BERT-base's
//! `[30522, 768]` embeddings 36 ms by tiles, 28.5 ms as a lane program (11
//! ms by its own loop, see [`super::adamw`]). Rows of row values and
//! reductions must be whole vectors long (every vector then lies in one
//! row, whose value is one broadcast and whose reduction lanes take the
//! vector whole): a LayerNorm-like program over rows of 128 ran 15 % faster
//! than by tiles. Column sums (LayerNorm's and the biases' gradients) add
//! each vector into the `f64` partial sums the interpreter keeps, rows in
//! the same order: BERT-mini's `sub mul column_sum` 33 % shorter (AMX Xeon,
//! interleaved profiles). Other broadcasts and transposed loads stay with
//! the interpreter, whose index maps cost less on tiles, and so do
//! `exp`, `erf`, `log` and `tanh`, whose loops over whole tiles cost less
//! than a call per vector (a program of exp, erf, a random draw and row
//! reductions ran 7 % slower as lanes). A random draw is one call per
//! vector, the 64 values one AVX-512 batch of Philox blocks draws: the
//! dropout programs (a residual's, with its LayerNorm row sums, as a
//! matmul epilogue; the attention probabilities' in bf16) run here, their
//! kernels 1-6 % shorter in BERT-small's step (interleaved profiled runs).
//!
//! The operations are the interpreter's own, one for one and in the same
//! order (no contracted multiply-adds; row reductions in the same lanes),
//! so the results are the same bits (unit tests below).

use super::adamw::AdamWUpdate;
use super::{round_bf16, to_bool, Instr, OutView, Source, Src};
use crate::ir::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::kernels::elementwise::{compare_lanes, float_binary, float_unary, select_lanes};
use crate::kernels::numeric::{bf16_from_f32, bf16_to_f32};
use crate::kernels::reduce::RowLanes;
use crate::kernels::simd::prefetch_ahead;
use crate::schedule::chain::reads_row_value;
use crate::schedule::{Access, Load};
use crate::storage::HostData;
use half::bf16;

/// Elements each pass through the instructions computes: an instruction's
/// dispatch spread over four AVX-512 vectors (AdamW as a lane program: 16
/// elements 42 ms, 64 28.5 ms, 128 26.5 ms, 256 31 ms).
pub(super) const LANES: usize = 64;

/// The most registers a lane program may use: its own, one per distinct
/// immediate and one per load.
const MAX_REGISTERS: usize = 32;

/// The values of one register, on cache lines of its own: a register
/// straddling lines is read back more slowly than it was written (measured
/// with 16-element registers: AdamW 130 ms unaligned, 47 ms aligned).
#[derive(Clone, Copy)]
#[repr(align(64))]
pub(super) struct Vector(pub(super) [f32; LANES]);

/// One instruction over a vector; registers only (immediates and
/// single-value loads live in registers set before the loop).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Op {
    /// `dst = input[load]` at the vector's positions.
    Load { load: usize, dst: usize },
    /// `dst = op(src)`.
    Unary { op: UnaryOp, src: usize, dst: usize },
    /// `dst = a op b`.
    Binary { op: BinaryOp, a: usize, b: usize, dst: usize },
    /// `dst = (a cmp b) as 0/1`.
    Compare { op: CmpOp, a: usize, b: usize, dst: usize },
    /// `dst = c != 0 ? a : b`.
    Select { c: usize, a: usize, b: usize, dst: usize },
    /// `dst = (src != 0) as 0/1`.
    ToBool { src: usize, dst: usize },
    /// `dst = src` rounded to the nearest bf16.
    RoundBf16 { src: usize, dst: usize },
    /// `output[out] = src` at the vector's positions.
    Store { src: usize, out: usize },
    /// `dst` = the value of load `load` for the row the vector lies in
    /// (one value per row, broadcast along it).
    RowValue { load: usize, dst: usize },
    /// `dst` = load `load`'s values for the vector's columns (one value
    /// per column, the same in every row: a bias, a LayerNorm's weight).
    ColumnValues { load: usize, dst: usize },
    /// Reduce `src` into the total of the row the vector lies in, written
    /// to `output[out]` when the row ends.
    ReduceStore { op: ReduceOp, src: usize, out: usize },
    /// Add `src` into the `f64` partial sums of output `out`'s columns
    /// (the vector's place in its run of [`LaneProgram::column_len`]
    /// elements), as the interpreter's `ColumnSum` adds a tile.
    ColumnSum { src: usize, out: usize },
    /// `dst` = the vector's elements of the uniform draw keyed by the seed
    /// in [`LaneProgram::seed_inputs`]`[seed]` and `stream`.
    Random { seed: usize, stream: u64, dst: usize },
}

/// A fused program compiled to run a vector at a time.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LaneProgram {
    ops: Vec<Op>,
    /// `(register, value)`: registers holding an immediate.
    immediates: Vec<(usize, f32)>,
    /// `(register, load)`: registers holding the one value a load reads.
    single_values: Vec<(usize, usize)>,
    /// The row length of the program's row values and reductions (a whole
    /// number of vectors), 0 when it has neither: every vector then lies
    /// in one row.
    row_width: usize,
    /// The inputs holding the seeds of the program's random draws.
    seed_inputs: Vec<usize>,
    /// The length of the runs the program's column sums add up (a whole
    /// number of vectors), 0 when it sums no columns.
    column_len: usize,
    /// When the program is AdamW's update, which then runs as one loop
    /// with its values in vector registers.
    adamw: Option<Box<AdamWUpdate>>,
}

/// Assembles a [`LaneProgram`] from a program's instructions.
struct Compiler<'a> {
    loads: &'a [Load],
    /// The program's shape.
    shape: &'a [usize],
    /// The row length of its reductions (0: none).
    reduce_inner: usize,
    /// The length of its column sums' runs (0: none).
    column_len: usize,
    next_register: usize,
    /// The register whose value register `r` holds, if it holds a copy:
    /// an immediate's, a load's (each load is read once per vector, into a
    /// register of its own that nothing overwrites).
    copy_of: Vec<Option<usize>>,
    /// The register each load was read into, once read.
    loaded: Vec<Option<usize>>,
    program: LaneProgram,
}

impl Compiler<'_> {
    /// The register to read for register `r`.
    fn read(&self, r: usize) -> usize {
        self.copy_of[r].unwrap_or(r)
    }

    /// The register to read for `src`.
    fn source(&mut self, src: Src) -> usize {
        match src {
            Src::Reg(r) => self.read(r),
            Src::Imm(v) => match self.program.immediates.iter().find(|(_, x)| x.to_bits() == v.to_bits()) {
                Some(&(r, _)) => r,
                None => {
                    let r = self.fresh_register();
                    self.program.immediates.push((r, v));
                    r
                }
            },
        }
    }

    fn fresh_register(&mut self) -> usize {
        self.next_register += 1;
        self.next_register - 1
    }

    /// Emit `op`, which writes `dst` (no longer a copy).
    fn emit(&mut self, op: Op, dst: usize) {
        self.copy_of[dst] = None;
        self.program.ops.push(op);
    }

    /// Register `dst` now holds load `load`'s value, read into its own
    /// register the first time.
    fn load(&mut self, load: usize, dst: usize) -> Option<()> {
        let r = match self.loaded.get(load).copied()? {
            Some(r) => r,
            None => {
                let r = self.fresh_register();
                match &self.loads[load].access {
                    Access::Contiguous => self.program.ops.push(Op::Load { load, dst: r }),
                    Access::Splat => self.program.single_values.push((r, load)),
                    access @ Access::Strided(strides) => {
                        let width = self.shape.last().copied().unwrap_or(0);
                        let rows = self.shape.iter().product::<usize>() / width.max(1);
                        let columns = strides.split_last().is_some_and(|(&last, lead)| {
                            last == 1 && lead.iter().zip(self.shape).all(|(&s, &d)| s == 0 || d == 1)
                        });
                        self.row_width(width)?;
                        match (reads_row_value(access, self.shape, rows), columns) {
                            (true, _) => self.program.ops.push(Op::RowValue { load, dst: r }),
                            (false, true) => self.program.ops.push(Op::ColumnValues { load, dst: r }),
                            (false, false) => return None,
                        }
                    }
                }
                self.loaded[load] = Some(r);
                r
            }
        };
        self.copy_of[dst] = Some(r);
        Some(())
    }

    /// Rows of `width` elements for the program's row values and
    /// reductions: `None` when they are not a whole number of vectors, or
    /// differ from rows already taken.
    fn row_width(&mut self, width: usize) -> Option<()> {
        let fits = width > 0 && width.is_multiple_of(LANES);
        match self.program.row_width {
            _ if !fits => None,
            0 => {
                self.program.row_width = width;
                Some(())
            }
            taken => (taken == width).then_some(()),
        }
    }

    /// Compile `instr`; `None` when the lane loop does not run it.
    fn instr(&mut self, instr: &Instr) -> Option<()> {
        match *instr {
            Instr::Load { load, dst } => self.load(load, dst)?,
            Instr::Unary { op, src, dst } => {
                match op {
                    UnaryOp::Neg | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Abs | UnaryOp::Recip => {}
                    // The interpreter's polynomial loops over whole tiles
                    // compute these faster than on a vector at a time.
                    UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Erf => return None,
                }
                let src = self.read(src);
                self.emit(Op::Unary { op, src, dst }, dst);
            }
            Instr::Binary { op, a, b, dst } => {
                match op {
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min => {}
                    BinaryOp::Pow => return None,
                }
                let (a, b) = (self.source(a), self.source(b));
                self.emit(Op::Binary { op, a, b, dst }, dst);
            }
            Instr::Compare { op, a, b, dst } => {
                let (a, b) = (self.source(a), self.source(b));
                self.emit(Op::Compare { op, a, b, dst }, dst);
            }
            Instr::Select { c, a, b, dst } => {
                let (c, a, b) = (self.source(c), self.source(a), self.source(b));
                self.emit(Op::Select { c, a, b, dst }, dst);
            }
            Instr::ToBool { src, dst } => {
                let src = self.read(src);
                self.emit(Op::ToBool { src, dst }, dst);
            }
            Instr::RoundBf16 { src, dst } => {
                let src = self.read(src);
                self.emit(Op::RoundBf16 { src, dst }, dst);
            }
            Instr::Store { src, out } => {
                let src = self.read(src);
                self.program.ops.push(Op::Store { src, out });
            }
            Instr::ReduceStore { op, src, out } => {
                self.row_width(self.reduce_inner)?;
                let src = self.read(src);
                self.program.ops.push(Op::ReduceStore { op, src, out });
            }
            Instr::Random { input, stream, dst } => {
                let seeds = &mut self.program.seed_inputs;
                let seed = seeds.iter().position(|&i| i == input).unwrap_or_else(|| {
                    seeds.push(input);
                    seeds.len() - 1
                });
                self.emit(Op::Random { seed, stream, dst }, dst);
            }
            Instr::ColumnSum { src, out } => {
                if self.column_len == 0 || !self.column_len.is_multiple_of(LANES) {
                    return None;
                }
                self.program.column_len = self.column_len;
                let src = self.read(src);
                self.program.ops.push(Op::ColumnSum { src, out });
            }
        }
        Some(())
    }
}

impl LaneProgram {
    /// The lane form of a program of `instrs` over `registers` registers
    /// reading `loads`, computing `shape` with reductions over rows of
    /// `reduce_inner` and column sums over runs of `column_len` (0: none),
    /// if this loop runs it: a straight-line program whose row values,
    /// reductions and column sums (if any) are over rows of a whole number
    /// of vectors.
    pub(crate) fn compile(
        instrs: &[Instr],
        loads: &[Load],
        registers: usize,
        shape: &[usize],
        (reduce_inner, column_len): (usize, usize),
    ) -> Option<LaneProgram> {
        let mut compiler = Compiler {
            loads,
            shape,
            reduce_inner,
            column_len,
            next_register: registers,
            copy_of: vec![None; registers],
            loaded: vec![None; loads.len()],
            program: LaneProgram {
                ops: Vec::new(),
                immediates: Vec::new(),
                single_values: Vec::new(),
                row_width: 0,
                seed_inputs: Vec::new(),
                column_len: 0,
                adamw: None,
            },
        };
        for instr in instrs {
            compiler.instr(instr)?;
        }
        let mut program = compiler.program;
        if compiler.next_register > MAX_REGISTERS {
            return None;
        }
        let constants: Vec<usize> =
            program.immediates.iter().map(|&(r, _)| r).chain(program.single_values.iter().map(|&(r, _)| r)).collect();
        program.adamw = AdamWUpdate::recognise(&program.ops, compiler.next_register, &constants).map(Box::new);
        Some(program)
    }

    /// True when the program is AdamW's update (run by a loop of its own).
    pub(crate) fn is_adamw(&self) -> bool {
        self.adamw.is_some()
    }

    /// The program bound to one run's inputs and outputs, or `None` when an
    /// input is not one the loop reads (of another dtype, or a chain's value
    /// read other than at its own positions or as the program's row values):
    /// the interpreter then runs every tile.
    pub(crate) fn bind<'a>(&'a self, loads: &[Load], inputs: &[Source], outs: &'a [OutView]) -> Option<BoundLanes<'a>> {
        let mut registers = [Vector([0f32; LANES]); MAX_REGISTERS];
        for &(r, v) in &self.immediates {
            registers[r] = Vector([v; LANES]);
        }
        for &(r, load) in &self.single_values {
            let value = match inputs.get(loads[load].input)? {
                Source::Data(HostData::F32(x)) => *x.first()?,
                Source::Data(HostData::BF16(x)) => bf16_to_f32(*x.first()?),
                Source::Data(HostData::Bool(x)) => f32::from(u8::from(*x.first()?)),
                Source::Data(_) | Source::Output(_) | Source::Chained { .. } => return None,
            };
            registers[r] = Vector([value; LANES]);
        }
        let broadcast = |l: usize| {
            self.ops
                .iter()
                .any(|op| matches!(op, Op::RowValue { load, .. } | Op::ColumnValues { load, .. } if *load == l))
        };
        let streams = loads
            .iter()
            .enumerate()
            .map(|(l, load)| match (&load.access, inputs.get(load.input)?) {
                (Access::Contiguous, Source::Data(x)) => Stream::of_data(x),
                (Access::Contiguous, Source::Output(k)) => Some(Stream::of_view(outs.get(*k)?)),
                (Access::Contiguous, Source::Chained { view, per_row: 1 }) => Some(Stream::of_view(view)),
                (Access::Contiguous, Source::Chained { .. }) => None,
                // A row value's stream holds one value per row, a column
                // value's one row.
                (Access::Strided(_), source) if broadcast(l) => match source {
                    Source::Data(x) => Stream::of_data(x),
                    Source::Chained { view, per_row } if *per_row == self.row_width => Some(Stream::of_view(view)),
                    Source::Chained { .. } | Source::Output(_) => None,
                },
                (Access::Splat | Access::Strided(_), _) => Some(Stream::Unread),
            })
            .collect::<Option<Vec<_>>>()?;
        // Seeds as the interpreter reads them (it reports any other input).
        let seeds = self
            .seed_inputs
            .iter()
            .map(|&input| match inputs.get(input)? {
                Source::Data(HostData::I64(v)) if v.len() == 1 => Some(v[0] as u64),
                Source::Data(HostData::I32(v)) if v.len() == 1 => Some(v[0] as u32 as u64),
                Source::Data(_) | Source::Output(_) | Source::Chained { .. } => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let rows = vec![RowLanes::default(); outs.len()];
        Some(BoundLanes { program: self, registers, streams, outs, rows, seeds })
    }
}

/// Where a contiguous load reads its elements.
#[derive(Clone, Copy)]
pub(super) enum Stream {
    F32(*const f32),
    BF16(*const bf16),
    Bool(*const bool),
    /// A load the loop never reads element by element.
    Unread,
}

impl Stream {
    /// The stream of a buffer's elements (`None`: a dtype the loop does not read).
    fn of_data(data: &HostData) -> Option<Stream> {
        match data {
            HostData::F32(x) => Some(Stream::F32(x.as_ptr())),
            HostData::BF16(x) => Some(Stream::BF16(x.as_ptr())),
            HostData::Bool(x) => Some(Stream::Bool(x.as_ptr())),
            HostData::F64(_) | HostData::F16(_) | HostData::I64(_) | HostData::I32(_) | HostData::U8(_) => None,
        }
    }

    /// The stream of an output's (or a chain value's) elements.
    fn of_view(view: &OutView) -> Stream {
        match view {
            OutView::F32(p) => Stream::F32(p.cast_const()),
            OutView::BF16(p) => Stream::BF16(p.cast_const()),
            OutView::Bool(p) => Stream::Bool(p.cast_const()),
        }
    }

    /// Elements `at..at + LANES`.
    ///
    /// # Safety
    /// They are in bounds, and no other thread writes them meanwhile.
    #[inline(always)]
    pub(super) unsafe fn read(self, at: usize) -> Vector {
        match self {
            Stream::F32(p) => Vector(p.add(at).cast::<[f32; LANES]>().read_unaligned()),
            Stream::BF16(p) => Vector(p.add(at).cast::<[bf16; LANES]>().read_unaligned().map(bf16_to_f32)),
            Stream::Bool(p) => {
                Vector(p.add(at).cast::<[bool; LANES]>().read_unaligned().map(|b| f32::from(u8::from(b))))
            }
            Stream::Unread => unreachable!("compiled loads read contiguous streams"),
        }
    }

    /// [`Stream::read`] of a stream read in order, asking for its elements
    /// 2 KiB on ([`prefetch_ahead`]); not for a row of column values, read
    /// again and again.
    ///
    /// # Safety
    /// As for [`Stream::read`].
    #[inline(always)]
    pub(super) unsafe fn read_ahead(self, at: usize) -> Vector {
        match self {
            Stream::F32(p) => prefetch_ahead(p, at, LANES),
            Stream::BF16(p) => prefetch_ahead(p, at, LANES),
            Stream::Bool(p) => prefetch_ahead(p, at, LANES),
            Stream::Unread => {}
        }
        self.read(at)
    }

    /// Element `at` (a row's value).
    ///
    /// # Safety
    /// As for [`Stream::read`].
    #[inline(always)]
    pub(super) unsafe fn value(self, at: usize) -> f32 {
        match self {
            Stream::F32(p) => p.add(at).read(),
            Stream::BF16(p) => bf16_to_f32(p.add(at).read()),
            Stream::Bool(p) => f32::from(u8::from(p.add(at).read())),
            Stream::Unread => unreachable!("compiled row values read streams"),
        }
    }
}

/// Write `values` at elements `at..at + LANES` of `out`.
///
/// # Safety
/// They are in bounds, and no other thread accesses them meanwhile.
#[inline(always)]
pub(super) unsafe fn write(out: OutView, at: usize, values: &Vector) {
    match out {
        OutView::F32(p) => p.add(at).cast::<[f32; LANES]>().write_unaligned(values.0),
        OutView::BF16(p) => p.add(at).cast::<[bf16; LANES]>().write_unaligned(values.0.map(bf16_from_f32)),
        OutView::Bool(p) => p.add(at).cast::<[bool; LANES]>().write_unaligned(values.0.map(|v| v != 0.0)),
    }
}

/// A lane program with its constants loaded and its inputs and outputs
/// resolved for one run.
pub(crate) struct BoundLanes<'a> {
    program: &'a LaneProgram,
    registers: [Vector; MAX_REGISTERS],
    streams: Vec<Stream>,
    outs: &'a [OutView],
    /// The running reduction of each output's current row.
    rows: Vec<RowLanes<f32>>,
    /// The seed of each of [`LaneProgram::seed_inputs`].
    seeds: Vec<u64>,
}

#[inline(always)]
pub(super) fn map(x: &Vector, f: impl Fn(f32) -> f32) -> Vector {
    let mut out = Vector([0f32; LANES]);
    for (o, &v) in out.0.iter_mut().zip(&x.0) {
        *o = f(v);
    }
    out
}

#[inline(always)]
pub(super) fn zip(a: &Vector, b: &Vector, f: impl Fn(f32, f32) -> f32) -> Vector {
    let mut out = Vector([0f32; LANES]);
    for ((o, &x), &y) in out.0.iter_mut().zip(&a.0).zip(&b.0) {
        *o = f(x, y);
    }
    out
}

/// `op(x)` by the interpreter's own lanes (`float_unary`).
#[inline(always)]
fn unary(op: UnaryOp, x: &Vector) -> Vector {
    let mut out = Vector([0f32; LANES]);
    float_unary(op, (&x.0[..], &mut out.0[..]));
    out
}

/// `a op b` by the interpreter's own lanes (`float_binary`).
#[inline(always)]
fn binary(op: BinaryOp, a: &Vector, b: &Vector) -> Vector {
    let mut out = Vector([0f32; LANES]);
    float_binary(op, (&a.0[..], &b.0[..], &mut out.0[..]));
    out
}

/// `(a cmp b) as 0/1` by the interpreter's own lanes (`compare_lanes`).
#[inline(always)]
fn compare(op: CmpOp, a: &Vector, b: &Vector) -> Vector {
    let mut out = Vector([0f32; LANES]);
    compare_lanes(op, &a.0, &b.0, &mut out.0, |t| f32::from(u8::from(t)));
    out
}

/// `c != 0 ? a : b` by the interpreter's own lanes (`select_lanes`).
#[inline(always)]
fn select(c: &Vector, a: &Vector, b: &Vector) -> Vector {
    let mut out = Vector([0f32; LANES]);
    select_lanes(&c.0, &a.0, &b.0, &mut out.0, |c| c != 0.0);
    out
}

impl BoundLanes<'_> {
    /// Run the whole vectors of elements `start..end` (of a program over
    /// rows: the whole rows from `start`, a row's first element, else
    /// nothing; of one summing columns, from a vector's first element),
    /// adding column sums into `columns`; returns where the rest, for the
    /// interpreter, starts.
    ///
    /// # Safety
    /// `start..end` is in bounds of every input and output, this thread
    /// owns those elements of every output, and `columns` holds the
    /// program's partial column sums.
    #[inline(always)]
    pub(crate) unsafe fn run(&mut self, start: usize, end: usize, columns: &mut [Vec<f64>]) -> usize {
        if let Some(update) = &self.program.adamw {
            return update.run(&self.streams, &self.registers, self.outs, start, end);
        }
        let column_len = self.program.column_len;
        if column_len > 0 && !start.is_multiple_of(LANES) {
            return start;
        }
        // Rows are run whole, from a row's start (the interpreter runs the rest).
        let width = self.program.row_width;
        let end = match width {
            0 => end,
            _ if !start.is_multiple_of(width) => return start,
            _ => start + (end - start) / width * width,
        };
        let regs = &mut self.registers;
        let mut at = start;
        while at + LANES <= end {
            for op in &self.program.ops {
                match *op {
                    Op::Load { load, dst } => regs[dst] = self.streams[load].read_ahead(at),
                    Op::Unary { op, src, dst } => regs[dst] = unary(op, &regs[src]),
                    Op::Binary { op, a, b, dst } => regs[dst] = binary(op, &regs[a], &regs[b]),
                    Op::Compare { op, a, b, dst } => regs[dst] = compare(op, &regs[a], &regs[b]),
                    Op::Select { c, a, b, dst } => regs[dst] = select(&regs[c], &regs[a], &regs[b]),
                    Op::ToBool { src, dst } => regs[dst] = map(&regs[src], to_bool),
                    Op::RoundBf16 { src, dst } => regs[dst] = map(&regs[src], round_bf16),
                    Op::Store { src, out } => write(self.outs[out], at, &regs[src]),
                    Op::RowValue { load, dst } => regs[dst] = Vector([self.streams[load].value(at / width); LANES]),
                    Op::ColumnValues { load, dst } => regs[dst] = self.streams[load].read(at % width),
                    Op::Random { seed, stream, dst } => {
                        crate::random::uniform_f32_from(self.seeds[seed], stream, at, &mut regs[dst].0)
                    }
                    Op::ColumnSum { src, out } => {
                        let col = at % column_len;
                        let sums = &mut columns[out][col..col + LANES];
                        sums.iter_mut().zip(&regs[src].0).for_each(|(s, &v)| *s += f64::from(v));
                    }
                    Op::ReduceStore { op, src, out } => {
                        let (col, lanes) = (at % width, &mut self.rows[out]);
                        if col == 0 {
                            *lanes = RowLanes::default();
                        }
                        lanes.add(op, col, &regs[src].0);
                        if col + LANES == width {
                            self.outs[out].write(at / width, &[lanes.total(op)]);
                        }
                    }
                }
            }
            at += LANES;
        }
        at
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{FusedProgram, Instr, Src};
    use super::*;
    use crate::dtype::DType;
    use Instr::{Binary, Compare, Load as Read, RoundBf16, Select, Store, ToBool, Unary};
    use Src::{Imm, Reg};

    /// `program` with its loads and output dtypes, as a lane program or not.
    pub(in crate::kernels::fused) fn fused(
        shape: usize,
        loads: &[Access],
        instrs: Vec<Instr>,
        outputs: &[DType],
        lanes: bool,
    ) -> FusedProgram {
        let loads: Vec<Load> =
            loads.iter().enumerate().map(|(input, access)| Load { input, access: access.clone() }).collect();
        let registers = instrs
            .iter()
            .filter_map(|i| match *i {
                Read { dst, .. }
                | Unary { dst, .. }
                | Binary { dst, .. }
                | Compare { dst, .. }
                | Select { dst, .. }
                | ToBool { dst, .. }
                | RoundBf16 { dst, .. }
                | Instr::Random { dst, .. } => Some(dst + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let compiled = LaneProgram::compile(&instrs, &loads, registers, &[shape], (0, 0));
        assert!(compiled.is_some(), "a straight-line program compiles to lanes");
        FusedProgram {
            shape: vec![shape],
            loads,
            instrs,
            registers,
            output_dtypes: outputs.to_vec(),
            reduce_inner: 0,
            column_len: 0,
            gelu: None,
            lanes: compiled.filter(|_| lanes),
        }
    }

    /// Values from -4 to 4 with zeros, infinities and NaNs among them.
    pub(in crate::kernels::fused) fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len)
            .map(|i| match (i * 31 + salt) % 97 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 | 4 => 0.0,
                k => (((i * 7919 + salt * 104_729) % 2003) as f32 / 250.0 - 4.0) * if k % 2 == 0 { 1.0 } else { 0.5 },
            })
            .collect()
    }

    /// The values' bits, every NaN as one: which of two NaNs an addition
    /// keeps (their signs differ: an input's NaN against the CPU's default
    /// one of `inf - inf`) follows the order of its operands, which the
    /// compiler may swap (addition commutes) differently in two builds of
    /// the same code, so no kernel promises it.
    pub(in crate::kernels::fused) fn bits(data: &HostData) -> Vec<u32> {
        match data {
            HostData::F32(v) => v.iter().map(|x| if x.is_nan() { f32::NAN } else { *x }.to_bits()).collect(),
            HostData::BF16(v) => {
                v.iter().map(|x| u32::from(if x.is_nan() { half::bf16::NAN } else { *x }.to_bits())).collect()
            }
            HostData::Bool(v) => v.iter().map(|&x| u32::from(x)).collect(),
            other => panic!("unexpected {}", other.dtype()),
        }
    }

    /// Every instruction the lanes run, every dtype they read and write, a
    /// value read twice, an input overwritten in place.
    fn every_instruction() -> Vec<Instr> {
        let bin = |op, a, b, dst| Binary { op, a, b, dst };
        vec![
            Read { load: 0, dst: 0 },
            Read { load: 1, dst: 1 },
            bin(BinaryOp::Add, Reg(0), Reg(1), 2),
            bin(BinaryOp::Mul, Reg(2), Imm(0.75), 3),
            Read { load: 2, dst: 4 },
            bin(BinaryOp::Div, Reg(3), Reg(4), 5),
            Unary { op: UnaryOp::Abs, src: 0, dst: 6 },
            Unary { op: UnaryOp::Rsqrt, src: 6, dst: 7 },
            Unary { op: UnaryOp::Recip, src: 1, dst: 8 },
            Unary { op: UnaryOp::Neg, src: 8, dst: 9 },
            bin(BinaryOp::Max, Reg(9), Reg(0), 10),
            bin(BinaryOp::Min, Reg(10), Imm(2.0), 11),
            bin(BinaryOp::Sub, Reg(11), Reg(7), 12),
            Read { load: 3, dst: 13 },
            Compare { op: CmpOp::Gt, a: Reg(13), b: Imm(0.0), dst: 14 },
            Read { load: 4, dst: 15 },
            Select { c: Reg(15), a: Reg(12), b: Reg(13), dst: 16 },
            Read { load: 0, dst: 0 },
            bin(BinaryOp::Mul, Reg(16), Reg(0), 17),
            ToBool { src: 14, dst: 18 },
            RoundBf16 { src: 17, dst: 19 },
            Unary { op: UnaryOp::Sqrt, src: 5, dst: 20 },
            Compare { op: CmpOp::Le, a: Reg(20), b: Reg(13), dst: 21 },
            Instr::Random { input: 5, stream: 7, dst: 22 },
            bin(BinaryOp::Add, Reg(21), Reg(22), 23),
            Store { src: 17, out: 0 },
            Store { src: 19, out: 1 },
            Store { src: 18, out: 2 },
            Store { src: 20, out: 3 },
            Store { src: 23, out: 4 },
        ]
    }

    fn run_every_instruction(len: usize, lanes: bool, seed: &HostData) -> Vec<Vec<u32>> {
        use Access::{Contiguous, Splat};
        let outputs = [DType::F32, DType::BF16, DType::Bool, DType::F32, DType::F32];
        let program =
            fused(len, &[Contiguous, Contiguous, Splat, Contiguous, Contiguous], every_instruction(), &outputs, lanes);
        let x = HostData::F32(values(len, 1));
        let y = HostData::BF16(values(len, 2).into_iter().map(bf16_from_f32).collect());
        let s = HostData::F32(vec![-1.5]);
        let mask = HostData::Bool((0..len).map(|i| i % 3 != 0).collect());
        let mut outs = [
            HostData::F32(values(len, 3)),
            HostData::BF16(vec![bf16::ZERO; len]),
            HostData::Bool(vec![false; len]),
            HostData::F32(vec![0.0; len]),
            HostData::F32(vec![0.0; len]),
        ];
        let inputs = [
            Source::Data(&x),
            Source::Data(&y),
            Source::Data(&s),
            Source::Output(0),
            Source::Data(&mask),
            Source::Data(seed),
        ];
        program.run(&inputs, &mut outs).unwrap();
        outs.iter().map(bits).collect()
    }

    #[test]
    fn lane_programs_give_the_interpreters_bits() {
        // Fewer elements than a vector, whole vectors and a rest, and two
        // threads' halves.
        // A random draw's seed of either integer type the interpreter reads.
        for seed in [HostData::I64(vec![-0x5eed]), HostData::I32(vec![-0x5eed])] {
            for len in [5, 3 * LANES + 17, (1 << 16) + 37] {
                let (lanes, interpreted) =
                    (run_every_instruction(len, true, &seed), run_every_instruction(len, false, &seed));
                assert_eq!(lanes, interpreted, "{len} elements, {} seed", seed.dtype());
            }
        }
    }

    #[test]
    fn programs_over_rows_of_whole_vectors_compile_to_lanes() {
        let contiguous = [Load { input: 0, access: Access::Contiguous }];
        let transposed = [Load { input: 0, access: Access::Strided(vec![1, 8]) }];
        let row_values = [Load { input: 0, access: Access::Strided(vec![1, 0]) }];
        let exp = [Read { load: 0, dst: 0 }, Unary { op: UnaryOp::Exp, src: 0, dst: 1 }, Store { src: 1, out: 0 }];
        let neg = [Read { load: 0, dst: 0 }, Unary { op: UnaryOp::Neg, src: 0, dst: 1 }, Store { src: 1, out: 0 }];
        let random = [Instr::Random { input: 0, stream: 1, dst: 0 }, Store { src: 0, out: 0 }];
        let row_sum = [Read { load: 0, dst: 0 }, Instr::ReduceStore { op: ReduceOp::Sum, src: 0, out: 0 }];
        let column_sum = [Read { load: 0, dst: 0 }, Instr::ColumnSum { src: 0, out: 0 }];
        let compile = |instrs: &[Instr], loads: &[Load], width: usize, reduce_inner: usize| {
            LaneProgram::compile(instrs, loads, 2, &[8, width], (reduce_inner, 0))
        };
        assert!(compile(&neg, &contiguous, 8, 0).is_some());
        assert!(compile(&exp, &contiguous, 8, 0).is_none(), "exp keeps the interpreter's loop");
        assert!(compile(&random, &[], 8, 0).is_some(), "a random draw, a vector of it at a time");
        assert!(compile(&neg, &row_values, 2 * LANES, 0).is_some(), "a value per row of whole vectors");
        assert!(compile(&neg, &row_values, LANES + 8, 0).is_none(), "rows that split vectors");
        assert!(compile(&neg, &transposed, 8, 0).is_none(), "a transposed load");
        let columns = [Load { input: 0, access: Access::Strided(vec![0, 1]) }];
        assert!(compile(&neg, &columns, 2 * LANES, 0).is_some(), "a value per column, rows of whole vectors");
        assert!(compile(&row_sum, &contiguous, 2 * LANES, 2 * LANES).is_some(), "a row sum");
        assert!(compile(&row_sum, &contiguous, 24, 24).is_none(), "a row sum over part of a vector");
        assert!(compile(&column_sum, &contiguous, 2 * LANES, 0).is_none(), "a column sum of unknown length");
        let sums = |len| LaneProgram::compile(&column_sum, &contiguous, 2, &[8, 2 * LANES], (0, len));
        assert!(sums(2 * LANES).is_some(), "a column sum over runs of whole vectors");
        assert!(sums(LANES + 8).is_none(), "a column sum over runs that split vectors");
        let many: Vec<Instr> = std::iter::once(Read { load: 0, dst: 0 })
            .chain((1..MAX_REGISTERS).map(|k| Binary { op: BinaryOp::Add, a: Reg(k - 1), b: Imm(k as f32), dst: k }))
            .chain(std::iter::once(Store { src: MAX_REGISTERS - 1, out: 0 }))
            .collect();
        assert!(LaneProgram::compile(&many, &contiguous, MAX_REGISTERS, &[8], (0, 0)).is_none(), "too many registers");
    }

    /// A LayerNorm-like program over `rows` rows of `width`: a value per
    /// row subtracted, a comparison selected on, a value per column
    /// multiplied, a row sum and a row maximum; by lanes or the
    /// interpreter, its inputs as buffers or (but the column values) as a
    /// chain's views.
    fn run_rows(rows: usize, width: usize, lanes: bool, chained: bool) -> Vec<Vec<u32>> {
        let bin = |op, a, b, dst| Binary { op, a, b, dst };
        let instrs = vec![
            Read { load: 0, dst: 0 },
            Read { load: 1, dst: 1 },
            bin(BinaryOp::Sub, Reg(0), Reg(1), 2),
            bin(BinaryOp::Mul, Reg(2), Imm(0.5), 3),
            Compare { op: CmpOp::Ge, a: Reg(3), b: Imm(0.1), dst: 4 },
            Select { c: Reg(4), a: Reg(3), b: Imm(0.0), dst: 5 },
            Store { src: 5, out: 0 },
            Instr::ReduceStore { op: ReduceOp::Sum, src: 3, out: 1 },
            Read { load: 2, dst: 7 },
            bin(BinaryOp::Mul, Reg(3), Reg(7), 6),
            Instr::ReduceStore { op: ReduceOp::Max, src: 6, out: 2 },
        ];
        let program = row_program(instrs, 8, (rows, width), (width, 0), lanes);
        let (mut x, mut row) = (HostData::F32(values(rows * width, 1)), HostData::F32(values(rows, 2)));
        // Finite and nonzero: a product of infinity and zero is the CPU's
        // negative NaN, and which of two NaNs a row maximum keeps depends on
        // where its runs start (as the sign of a zero maximum does).
        let column = HostData::F32((0..width).map(|i| 0.5 + i as f32 / width as f32).collect());
        let mut outs =
            [HostData::F32(vec![0.0; rows * width]), HostData::F32(vec![0.0; rows]), HostData::F32(vec![0.0; rows])];
        let views = [OutView::of(&mut x).unwrap(), OutView::of(&mut row).unwrap()];
        let inputs = match chained {
            true => [
                Source::Chained { view: views[0], per_row: 1 },
                Source::Chained { view: views[1], per_row: width },
                Source::Data(&column),
            ],
            false => [Source::Data(&x), Source::Data(&row), Source::Data(&column)],
        };
        program.run(&inputs, &mut outs).unwrap();
        outs.iter().map(bits).collect()
    }

    /// A program of `instrs` over `rows` rows of `width` reading the
    /// elements, a value per row and a value per column (loads 0, 1, 2)
    /// into three f32 outputs, with row reductions over `reduce_inner` or
    /// column sums over `column_len` (0: none), as a lane program or not.
    fn row_program(
        instrs: Vec<Instr>,
        registers: usize,
        (rows, width): (usize, usize),
        (reduce_inner, column_len): (usize, usize),
        lanes: bool,
    ) -> FusedProgram {
        let loads = vec![
            Load { input: 0, access: Access::Contiguous },
            Load { input: 1, access: Access::Strided(vec![1, 0]) },
            Load { input: 2, access: Access::Strided(vec![0, 1]) },
        ];
        let shape = [rows, width];
        let compiled = LaneProgram::compile(&instrs, &loads, registers, &shape, (reduce_inner, column_len));
        assert!(compiled.is_some(), "rows of whole vectors compile to lanes");
        FusedProgram {
            shape: shape.to_vec(),
            loads,
            instrs,
            registers,
            output_dtypes: vec![DType::F32; 3],
            reduce_inner,
            column_len,
            gelu: None,
            lanes: compiled.filter(|_| lanes),
        }
    }

    /// LayerNorm's gradient sums over `rows` rows of `width`: `x` less a
    /// value per row, its column sums, and its product with a value per
    /// column stored and summed by columns too.
    fn run_column_sums(rows: usize, width: usize, lanes: bool) -> Vec<Vec<u32>> {
        let instrs = vec![
            Read { load: 0, dst: 0 },
            Read { load: 1, dst: 1 },
            Binary { op: BinaryOp::Sub, a: Reg(0), b: Reg(1), dst: 2 },
            Read { load: 2, dst: 3 },
            Binary { op: BinaryOp::Mul, a: Reg(2), b: Reg(3), dst: 4 },
            Store { src: 4, out: 0 },
            Instr::ColumnSum { src: 2, out: 1 },
            Instr::ColumnSum { src: 4, out: 2 },
        ];
        let program = row_program(instrs, 5, (rows, width), (0, width), lanes);
        // Finite, so that every sum depends on the order of its terms.
        let finite = |len: usize, salt: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7919 + salt * 104_729) % 2003) as f32 / 250.0 - 4.0).collect()
        };
        let (x, row) = (HostData::F32(finite(rows * width, 3)), HostData::F32(finite(rows, 4)));
        let column = HostData::F32((0..width).map(|i| 0.25 + i as f32 / width as f32).collect());
        let mut outs =
            [HostData::F32(vec![0.0; rows * width]), HostData::F32(vec![0.0; width]), HostData::F32(vec![0.0; width])];
        program.run(&[Source::Data(&x), Source::Data(&row), Source::Data(&column)], &mut outs).unwrap();
        outs.iter().map(bits).collect()
    }

    #[test]
    fn lane_column_sums_give_the_interpreters_bits() {
        // Two threads' halves of 1 024 rows; 37 rows, halves of 18 and 19.
        for (rows, width) in [(1024, 2 * LANES), (37, 4 * LANES)] {
            assert_eq!(run_column_sums(rows, width, true), run_column_sums(rows, width, false), "{rows} x {width}");
        }
    }

    #[test]
    fn lane_programs_over_rows_give_the_interpreters_bits() {
        // Two threads' halves of 1 024 rows; one thread's 37 rows.
        for (rows, width) in [(1024, 2 * LANES), (37, 4 * LANES)] {
            let interpreted = run_rows(rows, width, false, false);
            assert_eq!(run_rows(rows, width, true, false), interpreted, "{rows} x {width}");
            assert_eq!(run_rows(rows, width, true, true), interpreted, "{rows} x {width}, chained");
        }
    }
}
