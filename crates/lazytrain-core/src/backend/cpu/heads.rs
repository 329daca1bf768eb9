//! Running a head chain (see [`crate::schedule::heads`]): the members'
//! output buffers are taken out of their slots, members read earlier
//! members' values through views of them, and two threads take the heads a
//! few at a time, running every member in turn on one head before the next
//! head, so that a head's values are read back from cache.

use super::executable::{operand, RunBuffers};
use super::{CpuExecutable, Kernel, Step};
use crate::ir::{Op, UnaryOp};
use crate::kernels;
use crate::kernels::dot::{HeadProducts, RawOperand};
use crate::kernels::fused::{FusedProgram, OutView, Source, TileWork};
use crate::schedule::{HeadRead, Operand};
use crate::storage::HostData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Heads a thread takes at a time: few enough that the threads finish
/// together, enough that the next head's operands are usually its own.
const HEADS_PER_TAKE: usize = 4;

/// What one member computes for each head.
enum Member<'a> {
    /// A matmul's matrix of the head.
    Product { products: HeadProducts, out: *mut f32 },
    /// A unary op over the head's elements, from `input` (`None`: in place).
    Unary { op: UnaryOp, input: Option<*const f32>, out: *mut f32, per_head: usize },
    /// A fused program over the head's elements.
    Fused { program: &'a FusedProgram, inputs: Vec<Source<'a>>, outputs: Vec<OutView>, per_head: usize },
}

// SAFETY: the pointers address buffers alive for the run, and the threads
// of a chain touch disjoint heads of every buffer a member writes.
unsafe impl Sync for Member<'_> {}

impl Member<'_> {
    /// Ask the CPU to bring head `i`'s operands into its L2 cache (a hint):
    /// those from before the chain come from memory; a product's operand
    /// an earlier member writes is not written yet, and the hint is lost.
    fn prefetch(&self, i: usize, batch: usize) {
        match self {
            Member::Product { products, .. } => products.prefetch(i),
            Member::Unary { .. } => {}
            Member::Fused { program, inputs, per_head, .. } if i < batch => {
                program.prefetch_elements(inputs, (i * per_head, (i + 1) * per_head))
            }
            Member::Fused { .. } => {}
        }
    }

    /// Compute head `i` (a fused program in `work`, kept between heads).
    ///
    /// # Safety
    /// No other thread touches head `i` of the buffers meanwhile, and the
    /// members before this one have computed head `i`.
    unsafe fn run(&self, i: usize, work: &mut TileWork) -> Result<(), String> {
        match self {
            Member::Product { products, out } => products.compute(i, *out),
            Member::Unary { op, input, out, per_head } => {
                let out = std::slice::from_raw_parts_mut(out.add(i * per_head), *per_head);
                let input = input.map(|x| std::slice::from_raw_parts(x.add(i * per_head), *per_head));
                kernels::unary_f32(*op, input, out);
            }
            Member::Fused { program, inputs, outputs, per_head } => {
                program.run_elements(inputs, outputs, (i * per_head, (i + 1) * per_head), work)?
            }
        }
        Ok(())
    }
}

/// True when every matmul member's matrices run on one thread each in the
/// current pool (the chain then gives their bits); otherwise the members
/// run one after the other.
pub(super) fn runs_by_heads_here(members: &[Step]) -> bool {
    members.iter().all(|m| match &m.kernel {
        Kernel::Primitive { node, input_shapes, .. } => {
            kernels::dot_matrix_macs(node, &input_shapes[0]).is_none_or(kernels::dot::matrices_run_alone)
        }
        Kernel::Fused { .. } | Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => true,
    })
}

/// The slots a member writes.
fn written_slots(step: &Step) -> Vec<usize> {
    match &step.kernel {
        Kernel::Primitive { slot, .. } => vec![*slot],
        Kernel::Fused { outputs, .. } => outputs.clone(),
        Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => Vec::new(),
    }
}

impl CpuExecutable {
    /// A head chain's members, head by head on two threads (its deferred
    /// steps run after it, see `run_step`).
    pub(super) fn run_heads(&self, step: &Step, run: &mut RunBuffers) -> Result<(), String> {
        let Kernel::Heads { members, reads, batch, .. } = &step.kernel else { unreachable!("called for head chains") };
        let mut slots: Vec<usize> = Vec::new();
        for s in members.iter().flat_map(written_slots) {
            if !slots.contains(&s) {
                slots.push(s);
            }
        }
        let mut buffers: Vec<HostData> =
            slots.iter().map(|&s| run.slots[s].take().unwrap_or_else(|| self.fresh_slot(s, &mut run.spare))).collect();
        let at = |s: usize| slots.iter().position(|&x| x == s).expect("a member's output slot");
        for member in members {
            match &member.kernel {
                Kernel::Primitive { node, slot, in_place: None, .. } => {
                    buffers[at(*slot)].reset(node.dtype, node.shape.numel())
                }
                Kernel::Fused { program, outputs, alias } => {
                    for (k, &s) in outputs.iter().enumerate().filter(|(k, _)| !alias.contains(&Some(*k))) {
                        buffers[at(s)].reset(program.output_dtypes[k], program.output_len(k));
                    }
                }
                Kernel::Primitive { .. } | Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => {}
            }
        }
        let lens: Vec<usize> = buffers.iter().map(HostData::len).collect();
        let views = buffers.iter_mut().map(OutView::of).collect::<Result<Vec<_>, _>>();
        let result = views.and_then(|views| {
            let chained = |op: &Operand| match op {
                Operand::Slot(s) if slots.contains(s) => Ok((views[at(*s)], lens[at(*s)])),
                _ => Err("a head chain value has no slot of the chain".to_string()),
            };
            let f32_view = |op: &Operand| match chained(op)? {
                (OutView::F32(p), len) => Ok((p, len)),
                (OutView::BF16(_) | OutView::Bool(_), _) => Err("a head chain reads an f32 value".to_string()),
            };
            let mut runners = Vec::with_capacity(members.len());
            for (member, member_reads) in members.iter().zip(reads) {
                runners.push(match &member.kernel {
                    Kernel::Primitive { node, input_shapes, views: strides, slot, in_place, out_strides } => {
                        let (out, out_len) = f32_view(&Operand::Slot(*slot))?;
                        match node.op {
                            Op::Dot { .. } => {
                                let raw = |j: usize| -> Result<RawOperand, String> {
                                    let (ptr, len) = match member_reads[j] {
                                        HeadRead::Heads => {
                                            f32_view(&member.inputs[j]).map(|(p, len)| (p.cast_const(), len))?
                                        }
                                        HeadRead::Before => match operand(&member.inputs[j], &run.inputs, &run.slots) {
                                            HostData::F32(v) => (v.as_ptr(), v.len()),
                                            other => {
                                                return Err(format!("a head chain's product reads {}", other.dtype()))
                                            }
                                        },
                                        HeadRead::RowValue => return Err("a product reads whole matrices".into()),
                                    };
                                    Ok(RawOperand { ptr, len, shape: &input_shapes[j], strides: strides[j].as_deref() })
                                };
                                let stored = RawOperand {
                                    ptr: out.cast_const(),
                                    len: out_len,
                                    shape: node.shape.dims(),
                                    strides: out_strides.as_deref(),
                                };
                                let products = kernels::head_products(node, [raw(0)?, raw(1)?], stored)?
                                    .ok_or("a head chain's product does not run a matrix per thread")?;
                                if products.batch() != *batch {
                                    return Err(format!(
                                        "{} matrices of a product in a chain of {batch}",
                                        products.batch()
                                    ));
                                }
                                Member::Product { products, out }
                            }
                            Op::Unary(op) => {
                                let input = match in_place {
                                    Some(_) => None,
                                    None => Some(f32_view(&member.inputs[0])?.0.cast_const()),
                                };
                                Member::Unary { op, input, out, per_head: out_len / batch }
                            }
                            ref other => return Err(format!("{} in a head chain", other.name())),
                        }
                    }
                    Kernel::Fused { program, outputs, alias } => {
                        let width = program.shape.last().copied().unwrap_or(1);
                        let inputs = member
                            .inputs
                            .iter()
                            .zip(alias)
                            .zip(member_reads)
                            .map(|((op, a), read)| match (a, read) {
                                (Some(k), _) => Ok(Source::Output(*k)),
                                (None, HeadRead::Before) => Ok(Source::Data(operand(op, &run.inputs, &run.slots))),
                                (None, HeadRead::Heads) => Ok(Source::Chained { view: chained(op)?.0, per_row: 1 }),
                                (None, HeadRead::RowValue) => {
                                    Ok(Source::Chained { view: chained(op)?.0, per_row: width })
                                }
                            })
                            .collect::<Result<Vec<_>, String>>()?;
                        let outputs = outputs.iter().map(|&s| views[at(s)]).collect();
                        let per_head = program.shape.iter().product::<usize>() / batch;
                        Member::Fused { program, inputs, outputs, per_head }
                    }
                    Kernel::Epilogue { .. } | Kernel::Chain { .. } | Kernel::Heads { .. } => {
                        return Err("a head chain runs single kernels".into())
                    }
                });
            }
            // Threads take the heads a few at a time, the next few when
            // done, so neither waits for the other at the end.
            let next = AtomicUsize::new(0);
            let grab = || {
                let first = next.fetch_add(HEADS_PER_TAKE, Ordering::Relaxed);
                (first < *batch).then(|| first..(first + HEADS_PER_TAKE).min(*batch))
            };
            let worker = || -> Result<(), String> {
                let mut work: Vec<TileWork> = runners.iter().map(|_| TileWork::default()).collect();
                let mut taken = grab();
                while let Some(heads) = taken {
                    let mut following = None;
                    for i in heads.clone() {
                        // The next head's operands from before the chain
                        // come from memory while this head computes.
                        let next_head = match i + 1 < heads.end {
                            true => Some(i + 1),
                            false => {
                                following = grab();
                                following.as_ref().map(|h| h.start)
                            }
                        };
                        if let Some(n) = next_head {
                            runners.iter().for_each(|r| r.prefetch(n, *batch));
                        }
                        for (runner, work) in runners.iter().zip(&mut work) {
                            // SAFETY: this thread took head i (no other
                            // thread touches it), and the members run in order.
                            unsafe { runner.run(i, work)? };
                        }
                    }
                    taken = following;
                }
                Ok(())
            };
            match rayon::current_num_threads() > 1 {
                true => {
                    let (a, b) = rayon::join(worker, worker);
                    a.and(b)
                }
                false => worker(),
            }
        });
        for (s, buffer) in slots.into_iter().zip(buffers) {
            run.slots[s] = Some(buffer);
        }
        result
    }
}
