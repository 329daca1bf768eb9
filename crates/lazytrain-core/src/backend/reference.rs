//! The reference backend: the oracle the optimised backends are tested
//! against, on the same [`Schedule`] interface. It asks for no fusion, no
//! splats and no in-place kernels, so every node runs its own naive kernel
//! (triple-loop matmuls) into its own slot of the liveness plan.

use super::{Backend, Executable, ExecutableStats};
use crate::collective::RunContext;
use crate::error::{Error, Result};
use crate::ir::{Node, Op};
use crate::kernels::{self, MatmulKernel};
use crate::schedule::{Capabilities, MemoryPlan, Operand, Schedule, Step};
use crate::storage::{Buffer, HostData};
use std::sync::Arc;

/// Runs every node with the reference kernels, one after another.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

/// One node's kernel call.
struct Call {
    index: usize,
    node: Node,
    input_shapes: Vec<Vec<usize>>,
    inputs: Vec<Operand>,
    slot: usize,
}

/// A graph lowered to reference kernel calls.
struct ReferenceExecutable {
    calls: Vec<Call>,
    outputs: Vec<Operand>,
    num_params: usize,
    memory: MemoryPlan,
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::UNFUSED
    }

    fn lower(&self, schedule: &Schedule) -> Result<Arc<dyn Executable>> {
        let graph = schedule.graph;
        let calls = schedule
            .steps
            .iter()
            .map(|step| match step {
                Step::Node { node, inputs, views, slot, in_place: None, splat: false, out_strides: None }
                    if views.iter().all(Option::is_none) =>
                {
                    let n = &graph.nodes[*node];
                    Ok(Call {
                        index: *node,
                        node: n.clone(),
                        input_shapes: n.inputs.iter().map(|id| graph.node(*id).shape.dims().to_vec()).collect(),
                        inputs: inputs.clone(),
                        slot: *slot,
                    })
                }
                Step::Node { node, .. } | Step::Group { group: node, .. } => Err(Error::Execution {
                    node: *node,
                    op: "lower",
                    detail: "the reference backend runs unfused schedules only (no groups, views, splats or in-place kernels)"
                        .into(),
                }),
            })
            .collect::<Result<Vec<Call>>>()?;
        Ok(Arc::new(ReferenceExecutable {
            calls,
            outputs: schedule.outputs.clone(),
            num_params: graph.num_params,
            memory: schedule.memory.clone(),
        }))
    }
}

impl Executable for ReferenceExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>, context: &RunContext) -> Result<Vec<Arc<Buffer>>> {
        if inputs.len() != self.num_params {
            return Err(Error::Execution {
                node: 0,
                op: "parameter",
                detail: format!("the executable takes {} inputs, {} were given", self.num_params, inputs.len()),
            });
        }
        let mut params = Vec::with_capacity(inputs.len());
        for (k, input) in inputs.iter().enumerate() {
            params.push(input.wait().map_err(|message| Error::Execution {
                node: 0,
                op: "parameter",
                detail: format!("input {k} has no value because the step that computes it failed: {message}"),
            })?);
        }
        let mut slots: Vec<Option<HostData>> = vec![None; self.memory.slots.len()];
        for &(k, slot) in &self.memory.donated {
            slots[slot] = Some(params[k].clone());
        }
        for call in &self.calls {
            let mut out = HostData::zeros(call.node.dtype, call.node.shape.numel());
            {
                let operands: Vec<&HostData> = call
                    .inputs
                    .iter()
                    .map(|op| match *op {
                        Operand::Param(k) => params[k],
                        Operand::Slot(s) => slots[s].as_ref().expect("the plan places every input before its reader"),
                        Operand::Fused => unreachable!("an unfused schedule has no fused values"),
                    })
                    .collect();
                let shapes: Vec<&[usize]> = call.input_shapes.iter().map(Vec::as_slice).collect();
                kernels::eval(&call.node, &operands, &shapes, &mut out, MatmulKernel::Naive)
                    .map_err(|detail| Error::Execution { node: call.index, op: call.node.op.name(), detail })?;
            }
            if let Op::AllReduce(op) = call.node.op {
                context.all_reduce_host(&mut out, op).map_err(|detail| Error::Execution {
                    node: call.index,
                    op: "all_reduce",
                    detail,
                })?;
            }
            slots[call.slot] = Some(out);
        }
        Ok(self
            .outputs
            .iter()
            .map(|op| match *op {
                Operand::Param(k) => inputs[k].clone(),
                Operand::Slot(s) => Arc::new(Buffer::new(slots[s].clone().expect("outputs are computed"))),
                Operand::Fused => unreachable!("graph outputs have buffers"),
            })
            .collect())
    }

    fn stats(&self) -> ExecutableStats {
        ExecutableStats {
            kernels: self.calls.len(),
            fused_kernels: 0,
            in_place: 0,
            epilogues: 0,
            row_chains: 0,
            head_chains: 0,
            fast_paths: 0,
            lane_programs: 0,
            buffers: self.memory.slots.len(),
            planned_bytes: self.memory.planned_bytes(),
            unplanned_bytes: self.memory.unplanned_bytes,
            peak_bytes: self.memory.peak_bytes(),
            largest_buffers: self.memory.largest_slots(),
            allocated_bytes: 0,
            kept_bytes: 0,
        }
    }
}
