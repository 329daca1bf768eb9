//! Running a CPU program: planned slots kept between runs, donated inputs
//! taken over, kernels called in order.

use super::{CpuExecutable, Kernel, Step};
use crate::backend::{profile, Executable, ExecutableStats};
use crate::collective::RunContext;
use crate::error::{Error, Result};
use crate::ir::Op;
use crate::kernels::fused::{ChainLink, FusedProgram, OutView, Source};
use crate::kernels::{self, MatmulKernel};
use crate::schedule::{ChainRead, Operand};
use crate::storage::{Buffer, HostData};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A fused step's program, output slots and in-place inputs.
type FusedParts<'s> = (&'s FusedProgram, &'s [usize], &'s [Option<usize>]);

/// The parts of a fused step (a row chain's member).
fn fused_parts(step: &Step) -> FusedParts<'_> {
    match &step.kernel {
        Kernel::Fused { program, outputs, alias } => (program, outputs, alias),
        Kernel::Primitive { .. } | Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => {
            unreachable!("a row chain's members are fused groups")
        }
    }
}

impl CpuExecutable {
    /// A slot's buffer, at its planned capacity: every value the slot holds
    /// fits without reallocating (no heap churn, no copies). A spare buffer
    /// of the same dtype that is large enough (but not wastefully so) is
    /// reused, else one is allocated.
    pub(super) fn fresh_slot(&self, slot: usize, spare: &mut Vec<HostData>) -> HostData {
        match self.take_fitting(slot, spare) {
            Some(buffer) => buffer,
            None => {
                let (dtype, capacity) = self.plan.slots[slot];
                self.allocated.fetch_add((capacity * dtype.size_in_bytes()) as u64, Ordering::Relaxed);
                HostData::with_capacity(dtype, capacity)
            }
        }
    }

    /// The smallest buffer out of `spare` of `slot`'s dtype that holds its
    /// planned capacity without being wastefully larger (at most twice).
    fn take_fitting(&self, slot: usize, spare: &mut Vec<HostData>) -> Option<HostData> {
        let (dtype, capacity) = self.plan.slots[slot];
        let fits = |b: &HostData| b.dtype() == dtype && (capacity..=capacity.saturating_mul(2)).contains(&b.capacity());
        let (pos, _) = spare.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.capacity())?;
        Some(spare.swap_remove(pos))
    }
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>, context: &RunContext) -> Result<Vec<Arc<Buffer>>> {
        self.run_on(inputs, context, None)
    }

    fn stats(&self) -> ExecutableStats {
        self.stats_now()
    }
}

impl CpuExecutable {
    /// Run on `inputs`. `last_run` is the device's record of the executable
    /// that ran before (see [`release_one_off_pool`]); without it this
    /// executable keeps its buffers whatever ran before.
    pub(super) fn run_on(
        &self,
        inputs: Vec<Arc<Buffer>>,
        context: &RunContext,
        last_run: Option<&LastRun>,
    ) -> Result<Vec<Arc<Buffer>>> {
        check_inputs(&inputs, self.num_params)?;
        // Reuse the previous run's intermediate buffers: no allocation and no
        // page faults in steady state. A one-off graph's buffers that ran
        // just before become this run's spares.
        let handed_over = last_run.map(|last_run| release_one_off_pool(&self.pool, last_run)).unwrap_or_default();
        let mut run = self.begin(inputs, handed_over);
        for step in &self.steps {
            self.run_step(step, &mut run, context)?;
        }
        let outputs = self.hand_out_outputs(&mut run);
        if !last_run.is_some_and(|last| overtaken_one_off(&self.pool, last)) {
            if let Ok(mut pool) = self.pool.sets.lock() {
                pool.push(run.slots);
            }
        }
        Ok(outputs)
    }

    /// Run one step (recorded in the profile when it is on).
    pub(super) fn run_step(&self, step: &Step, run: &mut RunBuffers, context: &RunContext) -> Result<()> {
        if let Kernel::Heads { members, deferred, .. } = &step.kernel {
            if !super::heads::runs_by_heads_here(members) {
                // A pool with more threads than the one that lowered the
                // chain splits its products: run the steps in order.
                for part in members.iter().chain(deferred) {
                    self.run_step(part, run, context)?;
                }
                return Ok(());
            }
        }
        let started = profile::enabled().then(|| (std::time::Instant::now(), profile::idle_nanos()));
        let (result, kind) = match &step.kernel {
            Kernel::Primitive { node, .. } => {
                let result = self.run_primitive(step, run, context);
                (result.map_err(|detail| (node.op.name(), detail)), profile::kind_of(&node.op))
            }
            Kernel::Fused { .. } => {
                (self.run_fused(step, run).map_err(|detail| ("fused", detail)), "fused elementwise")
            }
            Kernel::Epilogue { .. } => {
                let result = self.run_epilogue(step, run, context);
                (result.map_err(|detail| ("dot + epilogue", detail)), "matmul + epilogue")
            }
            Kernel::Chain { .. } => {
                (self.run_chain(step, run).map_err(|detail| ("row chain", detail)), "fused row chains")
            }
            Kernel::Heads { .. } => (self.run_heads(step, run).map_err(|detail| ("head chain", detail)), "head chains"),
        };
        result.map_err(|(op, detail)| Error::Execution { node: step.node_index, op, detail })?;
        if let Some((t, idle)) = started {
            let idle = profile::idle_nanos().saturating_sub(idle);
            profile::record(kind, &step.label, t.elapsed().as_nanos() as u64, idle);
        }
        if let Kernel::Heads { deferred, .. } = &step.kernel {
            for step in deferred {
                self.run_step(step, run, context)?;
            }
        }
        Ok(())
    }

    /// A run's buffers: a kept slot set (or an empty one), with the donated
    /// inputs' memory taken over into their slots, and the empty slots
    /// filled from `handed_over` where a buffer fits (the rest is freed).
    fn begin(&self, inputs: Vec<Arc<Buffer>>, mut handed_over: Vec<HostData>) -> RunBuffers {
        let mut slots: Vec<Option<HostData>> = self.pool.sets.lock().ok().and_then(|mut p| p.pop()).unwrap_or_default();
        slots.resize(self.plan.slots.len(), None);
        let mut spare = Vec::new();
        let mut inputs: Vec<Option<Arc<Buffer>>> = inputs.into_iter().map(Some).collect();
        // Buffers the last run left in donated slots: graph outputs took
        // other slots' buffers out of the pool, and these replace them (in
        // steady state the sizes pair up), so a run allocates nothing.
        for &(k, slot) in &self.plan.donated {
            // Take the memory over when nothing else holds it; copy otherwise.
            let donated = inputs[k].take().map(|buffer| match Arc::try_unwrap(buffer) {
                Ok(buffer) => buffer.into_host().expect("run checks that every input has a value"),
                Err(shared) => ready(&shared).clone(),
            });
            spare.extend(std::mem::replace(&mut slots[slot], donated));
        }
        if !handed_over.is_empty() {
            // The slots still empty, largest first, each with the smallest
            // handed-over buffer that fits.
            let mut empty: Vec<usize> = (0..slots.len()).filter(|&s| slots[s].is_none()).collect();
            empty.sort_by_key(|&s| {
                let (dtype, capacity) = self.plan.slots[s];
                std::cmp::Reverse(capacity * dtype.size_in_bytes())
            });
            for slot in empty {
                slots[slot] = self.take_fitting(slot, &mut handed_over);
            }
        }
        RunBuffers { slots, inputs, spare }
    }

    /// One primitive kernel (and the replicas' reduction of an all-reduce).
    fn run_primitive(
        &self,
        step: &Step,
        run: &mut RunBuffers,
        context: &RunContext,
    ) -> std::result::Result<(), String> {
        let Kernel::Primitive { node, input_shapes, views, slot, in_place, out_strides } = &step.kernel else {
            unreachable!("called for primitive kernels")
        };
        let mut out = run.slots[*slot].take().unwrap_or_else(|| self.fresh_slot(*slot, &mut run.spare));
        let operands: Vec<&HostData> = step
            .inputs
            .iter()
            .enumerate()
            .filter(|(pos, _)| Some(*pos) != *in_place)
            .map(|(_, op)| operand(op, &run.inputs, &run.slots))
            .collect();
        let shapes: Vec<&[usize]> = input_shapes.iter().map(Vec::as_slice).collect();
        let views: Vec<Option<&[usize]>> = views.iter().map(|v| v.as_deref()).collect();
        let result = match in_place {
            Some(position) => kernels::eval_in_place(node, *position, &operands, &shapes, &views, &mut out),
            None => {
                out.reset(node.dtype, node.shape.numel());
                match out_strides {
                    Some(strides) => {
                        let out = (&mut out, Some(strides.as_slice()));
                        kernels::eval_dot(node, &operands, &shapes, &views, out, MatmulKernel::Gemm)
                    }
                    None => kernels::eval_with_views(node, &operands, &shapes, &views, &mut out, MatmulKernel::Gemm),
                }
            }
        };
        let result = match (result, &node.op) {
            (Ok(()), Op::AllReduce(op)) => context.all_reduce_host(&mut out, *op),
            (result, _) => result,
        };
        run.slots[*slot] = Some(out);
        result
    }

    /// One fused kernel; an input its output overwrites in place is read
    /// from that output.
    fn run_fused(&self, step: &Step, run: &mut RunBuffers) -> std::result::Result<(), String> {
        let Kernel::Fused { program, outputs, alias } = &step.kernel else { unreachable!("called for fused kernels") };
        let mut outs: Vec<HostData> = outputs
            .iter()
            .map(|&s| run.slots[s].take().unwrap_or_else(|| self.fresh_slot(s, &mut run.spare)))
            .collect();
        for (k, out) in outs.iter_mut().enumerate() {
            if !alias.contains(&Some(k)) {
                out.reset(program.output_dtypes[k], program.output_len(k));
            }
        }
        let sources: Vec<Source> = step
            .inputs
            .iter()
            .zip(alias)
            .map(|(op, a)| match a {
                Some(k) => Source::Output(*k),
                None => Source::Data(operand(op, &run.inputs, &run.slots)),
            })
            .collect();
        let result = program.run(&sources, &mut outs);
        drop(sources);
        for (&s, out) in outputs.iter().zip(outs) {
            run.slots[s] = Some(out);
        }
        result
    }

    /// A matmul and its epilogue: the product is computed a row panel at a
    /// time and the epilogue's tiles over each panel follow on the same
    /// thread. The product lands in its own slot, or in the epilogue output
    /// that overwrites it in place. A product the CPU does not compute by
    /// panels runs as the two kernels in order.
    fn run_epilogue(&self, step: &Step, run: &mut RunBuffers, context: &RunContext) -> std::result::Result<(), String> {
        let Kernel::Epilogue { product, epilogue, product_input } = &step.kernel else {
            unreachable!("called for epilogue kernels")
        };
        let (Kernel::Primitive { node, input_shapes, views, slot, .. }, Kernel::Fused { program, outputs, alias }) =
            (&product.kernel, &epilogue.kernel)
        else {
            unreachable!("an epilogue pairs a primitive matmul with a fused group")
        };
        let product_alias = alias[*product_input];
        let mut outs: Vec<HostData> = outputs
            .iter()
            .map(|&s| run.slots[s].take().unwrap_or_else(|| self.fresh_slot(s, &mut run.spare)))
            .collect();
        if product_alias.is_none() {
            outs.push(run.slots[*slot].take().unwrap_or_else(|| self.fresh_slot(*slot, &mut run.spare)));
        }
        let put_back = |run: &mut RunBuffers, mut outs: Vec<HostData>| {
            if product_alias.is_none() {
                run.slots[*slot] = outs.pop();
            }
            for (&s, out) in outputs.iter().zip(outs) {
                run.slots[s] = Some(out);
            }
        };
        let dtype_fits = product_alias.is_none_or(|k| program.output_dtypes[k] == node.dtype);
        let operands: Vec<&HostData> = product.inputs.iter().map(|op| operand(op, &run.inputs, &run.slots)).collect();
        let shapes: Vec<&[usize]> = input_shapes.iter().map(Vec::as_slice).collect();
        let strides: Vec<Option<&[usize]>> = views.iter().map(|v| v.as_deref()).collect();
        let panels = match dtype_fits {
            true => kernels::dot_panels(node, &operands, &shapes, &strides)?,
            false => None,
        };
        let Some(panels) = panels else {
            drop(operands);
            put_back(run, outs);
            self.run_primitive(product, run, context)?;
            return self.run_fused(epilogue, run);
        };
        let (numel, row_len) = (node.shape.numel(), node.shape.dims().last().copied().unwrap_or(1));
        let product_out = product_alias.unwrap_or(outputs.len());
        for (k, out) in outs.iter_mut().enumerate() {
            let holds_input = alias.iter().enumerate().any(|(j, a)| *a == Some(k) && j != *product_input);
            match k == product_out {
                true => out.reset(node.dtype, numel),
                false if !holds_input => out.reset(program.output_dtypes[k], program.output_len(k)),
                false => {}
            }
        }
        let sources: Vec<Source> = epilogue
            .inputs
            .iter()
            .zip(alias)
            .enumerate()
            .map(|(j, (op, a))| match (j == *product_input, a) {
                (true, _) => Source::Output(product_out),
                (false, Some(k)) => Source::Output(*k),
                (false, None) => Source::Data(operand(op, &run.inputs, &run.slots)),
            })
            .collect();
        let rows = numel / row_len.max(1);
        let panel_rows = panel_rows(rows, row_len, program.reduce_inner, rayon::current_num_threads());
        let result =
            program.run_after_panels(&sources, &mut outs, product_out, panel_rows * row_len, &|out, start, end| {
                // SAFETY: `run_after_panels` hands each panel's rows to one thread,
                // and `out` is the product's buffer of rows x row_len elements.
                unsafe { panels.compute(start / row_len, end / row_len, out) }
            });
        drop(sources);
        drop(operands);
        put_back(run, outs);
        result
    }

    /// A row chain: its members' output buffers (each slot once) are taken
    /// out of the slots, members read earlier members' values through
    /// views of them, and the chain runs a block of rows at a time.
    fn run_chain(&self, step: &Step, run: &mut RunBuffers) -> std::result::Result<(), String> {
        let Kernel::Chain { members, reads, rows } = &step.kernel else { unreachable!("called for row chains") };
        let fused: Vec<FusedParts> = members.iter().map(fused_parts).collect();
        let mut slots: Vec<usize> = Vec::new();
        for &s in fused.iter().flat_map(|&(_, outputs, _)| outputs) {
            if !slots.contains(&s) {
                slots.push(s);
            }
        }
        let mut buffers: Vec<HostData> =
            slots.iter().map(|&s| run.slots[s].take().unwrap_or_else(|| self.fresh_slot(s, &mut run.spare))).collect();
        let at = |s: usize| slots.iter().position(|&x| x == s).expect("a chain output's slot");
        for &(program, outputs, alias) in &fused {
            for (k, &s) in outputs.iter().enumerate() {
                if !alias.contains(&Some(k)) {
                    buffers[at(s)].reset(program.output_dtypes[k], program.output_len(k));
                }
            }
        }
        let views = buffers.iter_mut().map(OutView::of).collect::<std::result::Result<Vec<_>, _>>();
        let result = views.and_then(|views| {
            let mut links = Vec::with_capacity(members.len());
            for ((member, &(program, outputs, alias)), member_reads) in members.iter().zip(&fused).zip(reads) {
                for (k, &s) in outputs.iter().enumerate() {
                    if buffers[at(s)].len() != program.output_len(k) {
                        return Err(format!(
                            "a chain output holds {} elements, not {}",
                            buffers[at(s)].len(),
                            program.output_len(k)
                        ));
                    }
                }
                let width = program.shape.iter().product::<usize>() / rows;
                let chained = |op: &Operand, per_row: usize| match op {
                    Operand::Slot(s) => slots
                        .iter()
                        .position(|x| x == s)
                        .map(|at| Source::Chained { view: views[at], per_row })
                        .ok_or_else(|| {
                            format!("slot {s} is read as a chain value but no kernel of the chain writes it")
                        }),
                    Operand::Param(_) | Operand::Fused => Err("a chain value has no slot".to_string()),
                };
                let inputs = member
                    .inputs
                    .iter()
                    .zip(alias)
                    .zip(member_reads)
                    .map(|((op, a), read)| match (a, read) {
                        (Some(k), _) => Ok(Source::Output(*k)),
                        // A value from before the chain in a slot a later
                        // kernel overwrites in place (read at its own positions).
                        (None, ChainRead::Before) if matches!(op, Operand::Slot(s) if slots.contains(s)) => {
                            chained(op, 1)
                        }
                        (None, ChainRead::Before) => Ok(Source::Data(operand(op, &run.inputs, &run.slots))),
                        (None, ChainRead::Rows) => chained(op, 1),
                        (None, ChainRead::RowValue) => chained(op, width),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                links.push(ChainLink { program, inputs, outputs: outputs.iter().map(|&s| views[at(s)]).collect() });
            }
            kernels::fused::run_chain(&links, *rows)
        });
        for (s, buffer) in slots.into_iter().zip(buffers) {
            run.slots[s] = Some(buffer);
        }
        result
    }

    /// The graph outputs as buffers (a slot read by two outputs is one buffer).
    fn hand_out_outputs(&self, run: &mut RunBuffers) -> Vec<Arc<Buffer>> {
        let mut taken: Vec<Option<Arc<Buffer>>> = vec![None; run.slots.len()];
        self.outputs
            .iter()
            .map(|op| match *op {
                Operand::Param(k) => run.inputs[k].clone().expect("only donated inputs are taken"),
                Operand::Slot(s) => taken[s]
                    .get_or_insert_with(|| Arc::new(Buffer::new(run.slots[s].take().expect("outputs are computed"))))
                    .clone(),
                Operand::Fused => unreachable!("graph outputs have buffers"),
            })
            .collect()
    }

    fn stats_now(&self) -> ExecutableStats {
        ExecutableStats {
            kernels: self.steps.iter().map(|s| s.parts().len()).sum(),
            fused_kernels: self
                .steps
                .iter()
                .flat_map(Step::parts)
                .filter(|s| matches!(s.kernel, Kernel::Fused { .. }))
                .count(),
            in_place: self
                .steps
                .iter()
                .flat_map(Step::parts)
                .filter(|s| match &s.kernel {
                    Kernel::Primitive { in_place, .. } => in_place.is_some(),
                    Kernel::Fused { alias, .. } => alias.iter().any(Option::is_some),
                    Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => {
                        unreachable!("parts are single kernels")
                    }
                })
                .count(),
            epilogues: self.steps.iter().filter(|s| matches!(s.kernel, Kernel::Epilogue { .. })).count(),
            row_chains: self.steps.iter().filter(|s| matches!(s.kernel, Kernel::Chain { .. })).count(),
            head_chains: self.steps.iter().filter(|s| matches!(s.kernel, Kernel::Heads { .. })).count(),
            fast_paths: self
                .steps
                .iter()
                .flat_map(Step::parts)
                .filter(|s| matches!(&s.kernel, Kernel::Fused { program, .. } if program.runs_own_loop()))
                .count(),
            lane_programs: self
                .steps
                .iter()
                .flat_map(Step::parts)
                .filter(|s| {
                    matches!(&s.kernel, Kernel::Fused { program, .. }
                        if !program.runs_own_loop() && program.lanes.is_some())
                })
                .count(),
            buffers: self.plan.slots.len(),
            planned_bytes: self.plan.planned_bytes(),
            unplanned_bytes: self.plan.unplanned_bytes,
            peak_bytes: self.plan.peak_bytes(),
            largest_buffers: self.plan.largest_slots(),
            allocated_bytes: self.allocated.load(Ordering::Relaxed),
            kept_bytes: self.pool.sets.lock().map_or(0, |sets| {
                sets.iter().flatten().flatten().map(|b| (b.capacity() * b.dtype().size_in_bytes()) as u64).sum()
            }),
        }
    }
}

/// Intermediate buffers an executable keeps between runs (one set per
/// concurrent run), and how many runs it has started.
#[derive(Default)]
pub(super) struct SlotPool {
    sets: Mutex<Vec<Vec<Option<HostData>>>>,
    runs: AtomicU64,
}

/// The slot pool of the executable that started a run last on one device.
pub(super) type LastRun = Mutex<Option<Weak<SlotPool>>>;

/// Count a run of `current`'s executable, and take the buffers kept by the
/// executable that ran before it on the same device if that was another
/// graph that has run only once (the first training step, which creates
/// the optimizer state): its intermediates are not kept alive beside the
/// next graph's but handed to it, whose first run fills its own slots with
/// those that fit instead of faulting in fresh memory (BERT-base on a 2-core
/// virtual machine: 260 thousand fewer page faults, the first four steps
/// 1.5-2 s shorter; the largest slots taking the smallest buffers that fit
/// keeps the peak RSS where it was). Graphs that recur (steady steps,
/// gradient-accumulation micro-steps, evaluation) keep theirs, so
/// alternating between them allocates nothing.
fn release_one_off_pool(current: &Arc<SlotPool>, last_run: &LastRun) -> Vec<HostData> {
    current.runs.fetch_add(1, Ordering::Relaxed);
    let mut last = last_run.lock().unwrap_or_else(|p| p.into_inner());
    let previous = last.replace(Arc::downgrade(current));
    match previous.and_then(|weak| weak.upgrade()) {
        Some(previous) if !Arc::ptr_eq(&previous, current) && previous.runs.load(Ordering::Relaxed) <= 1 => {
            let mut sets = previous.sets.lock().unwrap_or_else(|p| p.into_inner());
            sets.drain(..).flatten().flatten().collect()
        }
        Some(_) | None => Vec::new(),
    }
}

/// True when `pool`'s graph has run only once and another graph started a
/// run meanwhile: its buffers are not kept (see [`release_one_off_pool`]).
fn overtaken_one_off(pool: &Arc<SlotPool>, last_run: &LastRun) -> bool {
    let last = last_run.lock().unwrap_or_else(|p| p.into_inner());
    pool.runs.load(Ordering::Relaxed) <= 1
        && !last.as_ref().is_some_and(|l| std::ptr::eq(l.as_ptr(), Arc::as_ptr(pool)))
}

/// The buffers of one run: planned slots, the inputs not taken over, and
/// spare buffers that refill slots the graph outputs took.
pub(super) struct RunBuffers {
    pub(super) slots: Vec<Option<HostData>>,
    pub(super) inputs: Vec<Option<Arc<Buffer>>>,
    pub(super) spare: Vec<HostData>,
}

/// Check the number of inputs and that every one has a value.
fn check_inputs(inputs: &[Arc<Buffer>], expected: usize) -> Result<()> {
    if inputs.len() != expected {
        return Err(Error::Execution {
            node: 0,
            op: "parameter",
            detail: format!("the executable takes {expected} inputs, {} were given", inputs.len()),
        });
    }
    for (k, input) in inputs.iter().enumerate() {
        input.wait().map_err(|message| Error::Execution {
            node: 0,
            op: "parameter",
            detail: format!("input {k} has no value because the step that computes it failed: {message}"),
        })?;
    }
    Ok(())
}

/// The data of an operand.
pub(super) fn operand<'a>(
    op: &Operand,
    inputs: &'a [Option<Arc<Buffer>>],
    slots: &'a [Option<HostData>],
) -> &'a HostData {
    match *op {
        Operand::Param(k) => ready(inputs[k].as_ref().expect("only donated inputs are taken")),
        Operand::Slot(s) => slots[s].as_ref().expect("the plan places every input before its reader"),
        Operand::Fused => unreachable!("kernels read buffers, never fused values"),
    }
}

/// Rows a panel of a product has: each panel repacks the right operand, and
/// `gemm` called on fewer rows at a time lost 3–7 % of its speed on this
/// machine's products (2048 × 512 × 512 and larger), about nothing at 1024.
pub(super) const PANEL_ROWS: usize = 1024;

/// Rows per panel of a product of `rows` rows of `row_len` elements whose
/// epilogue reduces rows of `reduce_inner` elements (0: none), run on
/// `threads` threads: [`PANEL_ROWS`], fewer when the product has fewer than
/// that per thread (every thread gets a panel: a product of one panel ran
/// on one core), rounded up to whole reduction rows.
fn panel_rows(rows: usize, row_len: usize, reduce_inner: usize, threads: usize) -> usize {
    let target = PANEL_ROWS.min(rows.div_ceil(threads.max(1))).max(1);
    match reduce_inner > row_len {
        true => {
            let unit = reduce_inner / row_len;
            target.div_ceil(unit) * unit
        }
        false => target,
    }
}

/// The data of an input buffer `run` has already waited for.
fn ready(buffer: &Buffer) -> &HostData {
    buffer.wait().expect("run checks that every input has a value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_gets_a_panel_of_whole_reduction_rows() {
        assert_eq!(panel_rows(4096, 512, 0, 2), PANEL_ROWS, "large products: full panels");
        assert_eq!(panel_rows(1024, 768, 0, 2), 512, "one panel would run on one core");
        assert_eq!(panel_rows(800, 128, 0, 2), 400);
        assert_eq!(panel_rows(3, 64, 0, 2), 2);
        assert_eq!(panel_rows(1, 64, 0, 4), 1);
        assert_eq!(panel_rows(1024, 64, 256, 2), 512, "already whole rows of 4 product rows");
        assert_eq!(panel_rows(10, 64, 256, 2), 8, "5 product rows rounded up to 2 reduction rows");
    }
}
