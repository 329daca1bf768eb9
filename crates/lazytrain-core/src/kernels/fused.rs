//! Fused elementwise kernels: a chain (or DAG) of elementwise ops runs as
//! one loop over cache-sized tiles of the output. Intermediate values live
//! in tile-sized registers and never reach memory; inputs are read through
//! strided index maps, so broadcasts (`expand`) and reshapes are folded into
//! the loads instead of being materialised.
//!
//! Registers hold `f32`; a bool value is 0.0 or 1.0 and a bf16 value is
//! exact in f32 (casts to bf16 round in a register), which keeps the
//! interpreter monomorphic. The arithmetic is the unfused kernels' own, so a
//! fused program computes bit-identical results.

use super::dot::PanelOut;
use super::elementwise::{compare_lanes, float_binary, float_unary, select_lanes, Lanes1};
use super::numeric::{bf16_from_f32, bf16_to_f32, exp_f32};
#[cfg(target_arch = "x86_64")]
use super::numeric_avx512::{erf_slice, exp_slice};
use super::reduce::RowLanes;
use super::simd;
use crate::dtype::DType;
use crate::ir::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::schedule::{Access, Load};
use crate::storage::HostData;
use half::bf16;

mod adamw;
mod chain;
mod gelu;
mod lanes;
mod softmax_rows;
pub(crate) use chain::{run_chain, ChainLink};
pub(crate) use gelu::Gelu;
pub(crate) use lanes::LaneProgram;

/// Elements per tile: small enough that a program's live registers stay in
/// the L1/L2 caches, large enough to amortise the per-op dispatch.
pub(crate) const TILE: usize = 1024;

/// An operand: a register or an immediate constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Src {
    /// A register.
    Reg(usize),
    /// A constant.
    Imm(f32),
}

/// One instruction of a fused program; every instruction writes a register
/// distinct from its sources.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Instr {
    /// `dst = input[load]` for the tile.
    Load { load: usize, dst: usize },
    /// `dst = op(src)`.
    Unary { op: UnaryOp, src: usize, dst: usize },
    /// `dst = a op b`.
    Binary { op: BinaryOp, a: Src, b: Src, dst: usize },
    /// `dst = (a cmp b) as 0/1`.
    Compare { op: CmpOp, a: Src, b: Src, dst: usize },
    /// `dst = c != 0 ? a : b`.
    Select { c: Src, a: Src, b: Src, dst: usize },
    /// `dst = (src != 0) as 0/1` (a cast to bool).
    ToBool { src: usize, dst: usize },
    /// `dst = src` rounded to the nearest bf16 (a cast from f32 to bf16).
    RoundBf16 { src: usize, dst: usize },
    /// `dst` = the tile's elements of the uniform draw keyed by kernel
    /// input `input` (the seed scalar) in stream `stream`.
    Random { input: usize, stream: u64, dst: usize },
    /// `output[out] = reg` for the tile.
    Store { src: usize, out: usize },
    /// Reduce `src` over rows of [`FusedProgram::reduce_inner`] consecutive
    /// elements into `output[out]` (one element per row), in the order of
    /// the unfused reduction.
    ReduceStore { op: ReduceOp, src: usize, out: usize },
    /// Add `src` into the column sums of `output[out]`: element `i` into
    /// column `i % column_len`, row after row, in `f64` (written when the
    /// run ends, in the unfused kernel's canonical order).
    ColumnSum { src: usize, out: usize },
}

/// A compiled fused program over an output of `shape`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FusedProgram {
    /// The shape every member computes.
    pub shape: Vec<usize>,
    /// The loads.
    pub loads: Vec<Load>,
    /// The instructions, run once per tile.
    pub instrs: Vec<Instr>,
    /// Registers needed.
    pub registers: usize,
    /// The dtype of each output (`F32`, `BF16` or `Bool`).
    pub output_dtypes: Vec<DType>,
    /// The row length of the program's reductions (all reduce the trailing
    /// `reduce_inner` elements of the shape); 0 without reductions.
    pub reduce_inner: usize,
    /// The row length of the program's column sums; 0 without.
    pub column_len: usize,
    /// When the program is one of GELU's, whose arithmetic then runs as
    /// one loop over its operands or per tile (see [`Gelu`]); `None` runs
    /// every program by its instructions.
    pub gelu: Option<Gelu>,
    /// When the program is a straight-line one, its form that runs a
    /// vector of elements through all its instructions at a time (see
    /// [`LaneProgram`]); `None` runs it by tiles.
    pub lanes: Option<LaneProgram>,
}

/// The buffers a program's tiles run in (registers, a multi-index, row
/// reductions' lanes), kept by a caller that runs many ranges on one
/// thread: a head chain runs each program once per attention head.
#[derive(Default)]
pub(crate) struct TileWork {
    regs: Vec<Vec<f32>>,
    index: Vec<usize>,
    rows: Vec<RowLanes<f32>>,
}

/// Where a kernel input's data is: its own buffer, or an output buffer the
/// output overwrites in place (read tile by tile before being written).
pub(crate) enum Source<'a> {
    /// A separate buffer.
    Data(&'a HostData),
    /// The buffer of output `k`, holding this input on entry.
    Output(usize),
    /// A buffer an earlier kernel of a row chain or head chain is writing:
    /// element `i` reads element `i / per_row` (1: the reader's own
    /// positions; the row length: one value per row, broadcast along it).
    Chained {
        /// The buffer.
        view: OutView,
        /// Reader elements per element read.
        per_row: usize,
    },
}

impl FusedProgram {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when a loop of the kernels' own runs the program (GELU's,
    /// AdamW's) rather than its instructions.
    pub(crate) fn runs_own_loop(&self) -> bool {
        self.gelu.is_some() || self.lanes.as_ref().is_some_and(LaneProgram::is_adamw)
    }

    /// True when output `k` is a reduction (one element per row).
    fn is_reduced(&self, k: usize) -> bool {
        self.instrs.iter().any(|i| matches!(*i, Instr::ReduceStore { out, .. } if out == k))
    }

    /// True when output `k` is a column sum (one element per column).
    fn is_column_sum(&self, k: usize) -> bool {
        self.instrs.iter().any(|i| matches!(*i, Instr::ColumnSum { out, .. } if out == k))
    }

    /// The number of elements output `k` holds.
    pub(crate) fn output_len(&self, k: usize) -> usize {
        if self.is_reduced(k) {
            self.numel() / self.reduce_inner.max(1)
        } else if self.is_column_sum(k) {
            self.column_len
        } else {
            self.numel()
        }
    }

    /// A one-line summary for the profile report: shape, loads, outputs,
    /// the ops the program computes (in order, repeats collapsed) and the
    /// loop that runs it, where not the tile interpreter.
    pub(crate) fn describe(&self) -> String {
        let mut ops: Vec<&str> = Vec::new();
        for instr in &self.instrs {
            let name = match instr {
                Instr::Unary { op, .. } => op.name(),
                Instr::Binary { op, .. } => op.name(),
                Instr::Compare { op, .. } => op.name(),
                Instr::Select { .. } => "select",
                Instr::ToBool { .. } => "to_bool",
                Instr::RoundBf16 { .. } => "to_bf16",
                Instr::Random { .. } => "rand",
                Instr::ReduceStore { op: ReduceOp::Sum, .. } => "row_sum",
                Instr::ReduceStore { op: ReduceOp::Max, .. } => "row_max",
                Instr::ColumnSum { .. } => "column_sum",
                Instr::Load { .. } | Instr::Store { .. } => continue,
            };
            if ops.last() != Some(&name) {
                ops.push(name);
            }
        }
        let loads: Vec<&str> = self
            .loads
            .iter()
            .map(|load| match load.access {
                Access::Contiguous => "contiguous",
                Access::Splat => "splat",
                Access::Strided(_) => "strided",
            })
            .collect();
        let outputs: Vec<String> = self.output_dtypes.iter().map(ToString::to_string).collect();
        let how = match (self.gelu, &self.lanes) {
            (Some(_), _) => " (GELU loop)",
            (None, Some(lanes)) if lanes.is_adamw() => " (AdamW loop)",
            (None, Some(_)) => " (lanes)",
            (None, None) => "",
        };
        let (loads, outputs) = (loads.join(", "), outputs.join(", "));
        format!("fused {:?} ({loads}) -> ({outputs}): {}{how}", self.shape, ops.join(" "))
    }

    /// Run over all tiles. `outputs` are sized for the shape (in-place
    /// outputs hold their input on entry). Large outputs are split into two
    /// halves run on two threads; the loop is also compiled for AVX2 and
    /// AVX-512 (the widest this CPU has is picked at run time).
    pub(crate) fn run(&self, inputs: &[Source], outputs: &mut [HostData]) -> Result<(), String> {
        let outs = self.out_views(outputs)?;
        if self.column_len > 0 {
            return self.run_column_sums(inputs, &outs, None);
        }
        // Each row of a reduction is reduced by one thread.
        let unit = if self.reduce_inner > 0 { self.reduce_inner } else { TILE };
        self.run_halves(inputs, &outs, unit, self.numel() >= PARALLEL_MIN, None)
    }

    /// Elements `start..end` on the calling thread (a whole number of the
    /// program's reduction rows; the program sums no columns), reading and
    /// writing the buffers of `outputs`, sized for the program.
    ///
    /// # Safety
    /// `outputs` address live buffers sized for the program; no other
    /// thread touches these elements of them meanwhile.
    pub(crate) unsafe fn run_elements(
        &self,
        inputs: &[Source],
        outputs: &[OutView],
        (start, end): (usize, usize),
        work: &mut TileWork,
    ) -> Result<(), String> {
        if self.column_len > 0 {
            return Err("a program summing columns runs over all its rows".into());
        }
        self.run_range(inputs, &OutViews(outputs.to_vec()), (start, end), None, &mut [], work)
    }

    /// Ask the CPU to bring elements `start..end` of the inputs read at
    /// the program's own positions into its L2 cache (a hint; nothing is
    /// read): a head chain prefetches the next head's inputs.
    pub(crate) fn prefetch_elements(&self, inputs: &[Source], (start, end): (usize, usize)) {
        for load in self.loads.iter().filter(|l| l.access == Access::Contiguous) {
            let len = end.min(self.numel()).saturating_sub(start);
            match inputs.get(load.input) {
                Some(Source::Data(HostData::F32(x))) => simd::prefetch_l2(x.as_ptr().wrapping_add(start), len),
                Some(Source::Data(HostData::BF16(x))) => simd::prefetch_l2(x.as_ptr().wrapping_add(start), len),
                Some(Source::Data(HostData::Bool(x))) => simd::prefetch_l2(x.as_ptr().wrapping_add(start), len),
                Some(Source::Data(_) | Source::Output(_) | Source::Chained { .. }) | None => {}
            }
        }
    }

    /// Run as the epilogue of a product: output `product` (which the
    /// program loads at its own positions and never stores) is computed
    /// `panel` elements at a time by `compute(product, start, end)`, and
    /// the program's tiles over each panel run right after it on the same
    /// thread, while the panel is still in cache. `panel` is a whole number
    /// of the program's reduction rows. Threads take contiguous runs of
    /// panels.
    pub(crate) fn run_after_panels(
        &self,
        inputs: &[Source],
        outputs: &mut [HostData],
        product: usize,
        panel: usize,
        compute: &(dyn Fn(PanelOut, usize, usize) + Sync),
    ) -> Result<(), String> {
        let numel = self.numel();
        if panel == 0 || (self.reduce_inner > 0 && !panel.is_multiple_of(self.reduce_inner)) {
            return Err(format!("panels of {panel} elements split the rows of {}", self.reduce_inner));
        }
        let outs = self.out_views(outputs)?;
        let target = match outs.0.get(product) {
            Some(OutView::F32(p)) => PanelOut::F32(*p),
            Some(OutView::BF16(p)) => PanelOut::BF16(*p),
            Some(OutView::Bool(_)) | None => return Err(format!("output {product} is not a matmul product")),
        };
        let panels = Panels { size: panel, compute: &|start, end| compute(target, start, end) };
        match self.column_len {
            0 => self.run_halves(inputs, &outs, panel, numel > panel, Some(&panels)),
            _ => self.run_column_sums(inputs, &outs, Some(&panels)),
        }
    }

    /// Run a program with column sums: the rows split at the middle row (as
    /// the unfused kernel's canonical order has it), each half summed into
    /// its own partial sums on its own thread (or one after the other), the
    /// two added at the end. As an epilogue, each half computes its panels
    /// of the product from its first row on.
    fn run_column_sums(&self, inputs: &[Source], outs: &OutViews, panels: Option<&Panels>) -> Result<(), String> {
        let (numel, len) = (self.numel(), self.column_len);
        let (mut first, mut second) = (self.column_partials(outs.0.len()), self.column_partials(outs.0.len()));
        let mid = numel / len / 2 * len;
        let parallel = match panels {
            Some(p) => numel > p.size,
            None => numel >= PARALLEL_MIN,
        };
        if parallel && rayon::current_num_threads() > 1 {
            let (a, b) = rayon::join(
                || self.run_range(inputs, outs, (0, mid), panels, &mut first, &mut TileWork::default()),
                || self.run_range(inputs, outs, (mid, numel), panels, &mut second, &mut TileWork::default()),
            );
            a.and(b)?;
        } else {
            self.run_range(inputs, outs, (0, mid), panels, &mut first, &mut TileWork::default())?;
            self.run_range(inputs, outs, (mid, numel), panels, &mut second, &mut TileWork::default())?;
        }
        // SAFETY: both halves have finished.
        unsafe { self.write_column_sums(&outs.0, &first, &second) };
        Ok(())
    }

    /// Empty `f64` partial sums for each of `outputs` outputs (a column's
    /// worth for a column sum, none for the others).
    fn column_partials(&self, outputs: usize) -> Vec<Vec<f64>> {
        (0..outputs).map(|k| if self.is_column_sum(k) { vec![0.0; self.column_len] } else { Vec::new() }).collect()
    }

    /// Write each column sum as the sum of its two halves' partial sums.
    ///
    /// # Safety
    /// `outs` are this program's output views, sized for it, and no thread
    /// touches them meanwhile.
    unsafe fn write_column_sums(&self, outs: &[OutView], first: &[Vec<f64>], second: &[Vec<f64>]) {
        for (k, (a, b)) in first.iter().zip(second).enumerate().filter(|(k, _)| self.is_column_sum(*k)) {
            let sums: Vec<f32> = a.iter().zip(b).map(|(x, y)| (x + y) as f32).collect();
            // SAFETY: the caller's; output `k` holds `column_len` elements.
            unsafe { outs[k].write(0, &sums) }
        }
    }

    /// Run all elements, split between two threads at a multiple of `unit`
    /// when `parallel` and the pool has more than one thread.
    fn run_halves(
        &self,
        inputs: &[Source],
        outs: &OutViews,
        unit: usize,
        parallel: bool,
        panels: Option<&Panels>,
    ) -> Result<(), String> {
        let numel = self.numel();
        if parallel && rayon::current_num_threads() > 1 {
            let mid = (numel / 2).div_ceil(unit) * unit;
            let (a, b) = rayon::join(
                || self.run_range(inputs, outs, (0, mid), panels, &mut Vec::new(), &mut TileWork::default()),
                || self.run_range(inputs, outs, (mid, numel), panels, &mut Vec::new(), &mut TileWork::default()),
            );
            return a.and(b);
        }
        self.run_range(inputs, outs, (0, numel), panels, &mut Vec::new(), &mut TileWork::default())
    }

    /// Raw views of `outputs`, checked against the program's output sizes.
    fn out_views(&self, outputs: &mut [HostData]) -> Result<OutViews, String> {
        let numel = self.numel();
        Ok(OutViews(
            outputs
                .iter_mut()
                .enumerate()
                .map(|(k, o)| {
                    // Reductions and column sums are f32; every other output is full size.
                    let len = if matches!(o, HostData::F32(_)) { self.output_len(k) } else { numel };
                    match o.len() == len {
                        true => OutView::of(o),
                        false => Err(format!("a fused kernel cannot write {} x {}", o.len(), o.dtype())),
                    }
                })
                .collect::<Result<_, _>>()?,
        ))
    }

    fn run_range(
        &self,
        inputs: &[Source],
        outs: &OutViews,
        range: (usize, usize),
        panels: Option<&Panels>,
        columns: &mut [Vec<f64>],
        work: &mut TileWork,
    ) -> Result<(), String> {
        // The same loop compiled for AVX2 and AVX-512 too (exp and erf on
        // wider lanes), the widest this CPU has picked at run time.
        simd::widest!(self.run_tiles(inputs, outs, range, panels, columns, work))
    }

    /// Elements `start..end` (a multiple of the tile size apart, except at
    /// the end); with `panels`, each panel is computed before its tiles
    /// (tiles never straddle two panels).
    #[inline(always)]
    fn run_tiles(
        &self,
        inputs: &[Source],
        outs: &OutViews,
        (start, end): (usize, usize),
        panels: Option<&Panels>,
        columns: &mut [Vec<f64>],
        work: &mut TileWork,
    ) -> Result<(), String> {
        let TileWork { regs, index: scratch, rows } = work;
        scratch.resize(self.shape.len(), 0);
        rows.resize(outs.0.len(), RowLanes::default());
        let mut lanes = self.lanes.as_ref().and_then(|l| l.bind(&self.loads, inputs, &outs.0));
        let direct = self.gelu.and_then(|g| g.bind_direct(self, inputs, &outs.0));
        let mut at = start;
        let mut panel_end = if panels.is_some() { start } else { end };
        while at < end {
            if let Some(p) = panels.filter(|_| at == panel_end) {
                panel_end = (at + p.size).min(end);
                (p.compute)(at, panel_end);
            }
            if let Some(lanes) = lanes.as_mut() {
                // SAFETY: this thread owns elements at..panel_end of every
                // output, and every input holds them.
                at = unsafe { lanes.run(at, panel_end, columns) };
                if at == panel_end {
                    continue;
                }
            }
            if let Some(direct) = direct.as_ref() {
                // SAFETY: as for the lanes above; `bind_direct` checked the
                // operands, and `columns` holds the program's column sums.
                unsafe { direct.run(at, panel_end, columns) };
                at = panel_end;
                continue;
            }
            if regs.len() < self.registers {
                // The tile registers, made when a tile first runs (a lane
                // program whose range is whole vectors never needs them).
                regs.resize(self.registers, vec![0f32; TILE]);
            }
            let len = TILE.min(panel_end - at);
            let (before, after) = match self.gelu {
                Some(gelu) => gelu.loads_and_stores(),
                None => (&self.instrs[..], &[][..]),
            };
            for instr in before {
                self.step(instr, at, len, inputs, outs, regs, scratch, rows, columns)?;
            }
            if let Some(gelu) = self.gelu {
                gelu.arithmetic(regs, len);
            }
            for instr in after {
                self.step(instr, at, len, inputs, outs, regs, scratch, rows, columns)?;
            }
            at += len;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn step(
        &self,
        instr: &Instr,
        start: usize,
        len: usize,
        inputs: &[Source],
        outs: &OutViews,
        regs: &mut [Vec<f32>],
        scratch: &mut [usize],
        rows: &mut [RowLanes<f32>],
        columns: &mut [Vec<f64>],
    ) -> Result<(), String> {
        match *instr {
            Instr::Load { load, dst } => {
                let spec = &self.loads[load];
                match inputs[spec.input] {
                    Source::Data(d) => load_tile(d, &spec.access, &self.shape, start, &mut regs[dst][..len], scratch)?,
                    Source::Output(k) if spec.access == Access::Contiguous => {
                        // SAFETY: this thread owns elements start..start + len
                        // of every output; they are read here before the
                        // tile's stores write them.
                        unsafe { outs.0[k].read(start, &mut regs[dst][..len]) }
                    }
                    Source::Output(_) => return Err("an in-place input must be read at its own positions".into()),
                    // SAFETY: a row chain reads only rows its thread has
                    // already computed (the schedule checked the accesses).
                    Source::Chained { view, per_row } => unsafe {
                        view.read_rows(start, per_row, &mut regs[dst][..len])
                    },
                }
            }
            Instr::Unary { op, src, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                let x = &regs[src][..len];
                match op {
                    // SAFETY: AVX-512 was detected on this CPU.
                    #[cfg(target_arch = "x86_64")]
                    UnaryOp::Exp if simd::avx512() => unsafe { exp_slice(x, &mut out[..len]) },
                    // SAFETY: as above.
                    #[cfg(target_arch = "x86_64")]
                    UnaryOp::Erf if simd::avx512() => unsafe { erf_slice(x, &mut out[..len]) },
                    // A direct loop over the inlined polynomial vectorises.
                    UnaryOp::Exp => out[..len].iter_mut().zip(x).for_each(|(o, &v)| *o = exp_f32(v)),
                    _ => float_unary(op, (x, &mut out[..len])),
                }
                regs[dst] = out;
            }
            Instr::Binary { op, a, b, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                let (ia, ib) = (imm(a), imm(b));
                float_binary(op, (operand(regs, a, &ia, len), operand(regs, b, &ib, len), &mut out[..len]));
                regs[dst] = out;
            }
            Instr::Compare { op, a, b, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                let (ia, ib) = (imm(a), imm(b));
                let (a, b) = (operand(regs, a, &ia, len), operand(regs, b, &ib, len));
                compare_lanes(op, a, b, &mut out[..len], |x| f32::from(u8::from(x)));
                regs[dst] = out;
            }
            Instr::Select { c, a, b, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                let (ic, ia, ib) = (imm(c), imm(a), imm(b));
                let (c, a, b) = (operand(regs, c, &ic, len), operand(regs, a, &ia, len), operand(regs, b, &ib, len));
                select_lanes(c, a, b, &mut out[..len], |c| c != 0.0);
                regs[dst] = out;
            }
            Instr::ToBool { src, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                (&regs[src][..len], &mut out[..len]).apply(to_bool);
                regs[dst] = out;
            }
            Instr::Random { input, stream, dst } => {
                let seed = match inputs[input] {
                    Source::Data(HostData::I64(v)) if v.len() == 1 => v[0] as u64,
                    Source::Data(HostData::I32(v)) if v.len() == 1 => v[0] as u32 as u64,
                    _ => return Err("a random draw's seed must be one integer".into()),
                };
                crate::random::uniform_f32_from(seed, stream, start, &mut regs[dst][..len]);
            }
            Instr::RoundBf16 { src, dst } => {
                let mut out = std::mem::take(&mut regs[dst]);
                (&regs[src][..len], &mut out[..len]).apply(round_bf16);
                regs[dst] = out;
            }
            Instr::Store { src, out } => {
                // SAFETY: as for in-place loads, this thread owns these elements.
                unsafe { outs.0[out].write(start, &regs[src][..len]) }
            }
            Instr::ColumnSum { src, out } => {
                let len_c = self.column_len;
                let values = &regs[src][..len];
                let sums = &mut columns[out];
                let mut done = 0;
                while done < len {
                    let col = (start + done) % len_c;
                    let run = (len_c - col).min(len - done);
                    sums[col..col + run]
                        .iter_mut()
                        .zip(&values[done..done + run])
                        .for_each(|(a, &v)| *a += f64::from(v));
                    done += run;
                }
            }
            Instr::ReduceStore { op, src, out } => {
                let inner = self.reduce_inner;
                let values = &regs[src][..len];
                let lanes = &mut rows[out];
                let mut done = 0;
                while done < len {
                    let (row, col) = ((start + done) / inner, (start + done) % inner);
                    let run = (inner - col).min(len - done);
                    if col == 0 {
                        *lanes = RowLanes::default();
                    }
                    lanes.add(op, col, &values[done..done + run]);
                    if col + run == inner {
                        // SAFETY: threads split at row boundaries, so this
                        // thread owns the row's output element.
                        unsafe { outs.0[out].write(row, &[lanes.total(op)]) }
                    }
                    done += run;
                }
            }
        }
        Ok(())
    }
}

/// Outputs at least this large run on two threads. With the pool's threads
/// kept awake during a step (`backend/cpu/warm.rs`) a split costs little:
/// at 64 Ki elements BERT-tiny's optimizer updates of `[512, 128]` and the
/// masked-LM head's `[800, 128]` kernels ran 1.3-1.9x faster split than on
/// one thread (the threshold was 256 Ki while waking a thread took a futex).
const PARALLEL_MIN: usize = 1 << 16;

/// Where an output's elements are written (the buffer outlives the run).
#[derive(Clone, Copy, Debug)]
pub(crate) enum OutView {
    /// An f32 buffer.
    F32(*mut f32),
    /// A bf16 buffer.
    BF16(*mut bf16),
    /// A bool buffer.
    Bool(*mut bool),
}

// SAFETY: an `OutView` is only dereferenced by the threads of one run, which
// touch disjoint element ranges (or ranges a chain has finished writing).
unsafe impl Send for OutView {}
// SAFETY: as for `Send`.
unsafe impl Sync for OutView {}

impl OutView {
    /// A view of `data`'s elements (f32, bf16 or bool), valid while `data`
    /// is neither moved nor resized.
    pub(crate) fn of(data: &mut HostData) -> Result<OutView, String> {
        match data {
            HostData::F32(v) => Ok(OutView::F32(v.as_mut_ptr())),
            HostData::BF16(v) => Ok(OutView::BF16(v.as_mut_ptr())),
            HostData::Bool(v) => Ok(OutView::Bool(v.as_mut_ptr())),
            other => Err(format!("a fused kernel cannot write {} values", other.dtype())),
        }
    }

    /// Fill `out` with reader elements `start..` where reader element `i`
    /// reads element `i / per_row`.
    ///
    /// # Safety
    /// As for [`OutView::read`], for the elements read.
    unsafe fn read_rows(self, start: usize, per_row: usize, out: &mut [f32]) {
        if per_row == 1 {
            return self.read(start, out);
        }
        let mut done = 0;
        while done < out.len() {
            let at = start + done;
            let run = (per_row - at % per_row).min(out.len() - done);
            let mut value = [0f32];
            self.read(at / per_row, &mut value);
            out[done..done + run].fill(value[0]);
            done += run;
        }
    }

    /// Copy elements `start..start + out.len()` into `out`.
    ///
    /// # Safety
    /// The range is in bounds and no other thread accesses it meanwhile.
    unsafe fn read(self, start: usize, out: &mut [f32]) {
        match self {
            OutView::F32(p) => {
                prefetch_next_tile(p, start, out.len());
                out.copy_from_slice(std::slice::from_raw_parts(p.add(start), out.len()))
            }
            OutView::BF16(p) => {
                prefetch_next_tile(p, start, out.len());
                let values = std::slice::from_raw_parts(p.add(start), out.len());
                out.iter_mut().zip(values).for_each(|(o, &v)| *o = bf16_to_f32(v));
            }
            OutView::Bool(p) => {
                prefetch_next_tile(p, start, out.len());
                let values = std::slice::from_raw_parts(p.add(start), out.len());
                out.iter_mut().zip(values).for_each(|(o, &v)| *o = f32::from(u8::from(v)));
            }
        }
    }

    /// Write `values` at `start..`.
    ///
    /// # Safety
    /// As for [`OutView::read`].
    unsafe fn write(self, start: usize, values: &[f32]) {
        match self {
            OutView::F32(p) => std::slice::from_raw_parts_mut(p.add(start), values.len()).copy_from_slice(values),
            OutView::BF16(p) => std::slice::from_raw_parts_mut(p.add(start), values.len())
                .iter_mut()
                .zip(values)
                .for_each(|(o, &v)| *o = bf16_from_f32(v)),
            OutView::Bool(p) => std::slice::from_raw_parts_mut(p.add(start), values.len())
                .iter_mut()
                .zip(values)
                .for_each(|(o, &v)| *o = v != 0.0),
        }
    }
}

/// The outputs of one run, shared by its threads, which write disjoint ranges.
struct OutViews(Vec<OutView>);

/// How [`FusedProgram::run_after_panels`] computes its product: panels of
/// `size` elements, each by `compute(start, end)`.
struct Panels<'p> {
    size: usize,
    compute: &'p (dyn Fn(usize, usize) + Sync),
}

// SAFETY: the threads of one run touch disjoint element ranges of each output.
unsafe impl Sync for OutViews {}

fn imm(src: Src) -> [f32; 1] {
    match src {
        Src::Imm(v) => [v],
        Src::Reg(_) => [0.0],
    }
}

/// The tile of `src`: a register, or a one-element slice for an immediate
/// (the lanes broadcast one-element operands).
fn operand<'a>(regs: &'a [Vec<f32>], src: Src, imm: &'a [f32; 1], len: usize) -> &'a [f32] {
    match src {
        Src::Reg(r) => &regs[r][..len],
        Src::Imm(_) => imm,
    }
}

/// Read `out.len()` elements of the output tile starting at `start`.
#[inline(always)]
fn load_tile(
    data: &HostData,
    access: &Access,
    shape: &[usize],
    start: usize,
    out: &mut [f32],
    index: &mut [usize],
) -> Result<(), String> {
    match data {
        HostData::F32(x) => load_with(x, access, shape, start, out, index, |v| v),
        HostData::Bool(x) => load_with(x, access, shape, start, out, index, |v| f32::from(u8::from(v))),
        HostData::BF16(x) => load_with(x, access, shape, start, out, index, bf16_to_f32),
        other => return Err(format!("a fused kernel cannot load {} values", other.dtype())),
    }
    Ok(())
}

/// [`Instr::ToBool`] on one value: 1 for any value but zero (NaN too), else 0.
#[inline(always)]
fn to_bool(x: f32) -> f32 {
    f32::from(u8::from(x != 0.0))
}

/// [`Instr::RoundBf16`] on one value: `x` rounded to the nearest bf16.
#[inline(always)]
fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_from_f32(x))
}

/// Ask the CPU to start loading the next tile of a buffer read at
/// elements `start..start + len`, `base` being its first element. A program
/// reads each input a tile at a time between passes of arithmetic over the
/// registers, a pattern the hardware prefetchers (which follow steady
/// streams) do not run ahead of: a kernel whose inputs come from memory,
/// such as the optimizer's update, waited on every tile's loads (14 % of
/// its time at BERT-base's shapes).
#[inline(always)]
fn prefetch_next_tile<T>(base: *const T, start: usize, len: usize) {
    super::simd::prefetch(base.wrapping_add(start + len), len);
}

#[inline(always)]
fn load_with<T: Copy>(
    x: &[T],
    access: &Access,
    shape: &[usize],
    start: usize,
    out: &mut [f32],
    index: &mut [usize],
    convert: impl Fn(T) -> f32,
) {
    match access {
        Access::Contiguous => {
            let len = out.len();
            prefetch_next_tile(x.as_ptr(), start, len);
            out.iter_mut().zip(&x[start..start + len]).for_each(|(o, &v)| *o = convert(v))
        }
        Access::Splat => out.fill(convert(x[0])),
        Access::Strided(strides) => {
            // The multi-index of `start`, then runs along the innermost axis.
            let rank = shape.len();
            let mut rest = start;
            for d in (0..rank).rev() {
                index[d] = rest % shape[d];
                rest /= shape[d];
            }
            let inner = shape[rank - 1];
            let inner_stride = strides[rank - 1];
            let mut done = 0;
            while done < out.len() {
                let base: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
                let run = (inner - index[rank - 1]).min(out.len() - done);
                let dst = &mut out[done..done + run];
                match inner_stride {
                    0 => dst.fill(convert(x[base])),
                    1 => dst.iter_mut().zip(&x[base..base + run]).for_each(|(o, &v)| *o = convert(v)),
                    s => dst.iter_mut().enumerate().for_each(|(k, o)| *o = convert(x[base + k * s])),
                }
                done += run;
                index[rank - 1] += run;
                for d in (1..rank).rev() {
                    if index[d] < shape[d] {
                        break;
                    }
                    index[d] = 0;
                    index[d - 1] += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_loads_broadcast_rows_and_columns() {
        let shape = vec![3, 4];
        let row = HostData::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let col = HostData::F32(vec![10.0, 20.0, 30.0]);
        let mut out = vec![0f32; 7];
        let mut index = vec![0; 2];
        load_tile(&row, &Access::Strided(vec![0, 1]), &shape, 3, &mut out, &mut index).unwrap();
        assert_eq!(out, [4.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0]);
        load_tile(&col, &Access::Strided(vec![1, 0]), &shape, 3, &mut out, &mut index).unwrap();
        assert_eq!(out, [10.0, 20.0, 20.0, 20.0, 20.0, 30.0, 30.0]);
        let t = HostData::F32((0..12).map(|v| v as f32).collect());
        load_tile(&t, &Access::Strided(vec![1, 3]), &shape, 0, &mut out, &mut index).unwrap();
        assert_eq!(out, [0.0, 3.0, 6.0, 9.0, 1.0, 4.0, 7.0], "a transposed read");
    }
}
