//! The CPU backend: a flat list of kernel calls over planned buffers, with
//! `gemm` for matmuls.

use super::plan::{MemoryPlan, Operand};
use super::{profile, Backend, Executable, ExecutableStats};
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, Op};
use crate::kernels::{self, MatmulKernel};
use crate::shape::Shape;
use crate::storage::{Buffer, HostData};
use std::sync::Arc;

/// Runs graphs on the host CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// One kernel call.
struct Step {
    node_index: usize,
    node: Node,
    inputs: Vec<Operand>,
    input_shapes: Vec<Vec<usize>>,
    slot: usize,
    in_place: Option<usize>,
}

/// A compiled CPU program.
struct CpuExecutable {
    steps: Vec<Step>,
    outputs: Vec<Operand>,
    num_params: usize,
    plan: MemoryPlan,
    /// Intermediate buffers kept between runs.
    pool: std::sync::Mutex<Vec<Option<HostData>>>,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        let splat = splat_nodes(graph);
        let lengths: Vec<usize> =
            graph.nodes.iter().zip(&splat).map(|(n, &s)| if s { 1 } else { n.shape.numel() }).collect();
        let plan = MemoryPlan::new(graph, &lengths);
        let mut steps = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            if let (Operand::Slot(slot), false) = (plan.operands[i], matches!(node.op, Op::Parameter(_))) {
                let lowered = if splat[i] { Node { shape: Shape::scalar(), ..node.clone() } } else { node.clone() };
                steps.push(Step {
                    node_index: i,
                    node: lowered,
                    inputs: node.inputs.iter().map(|id| plan.operands[id.index()]).collect(),
                    input_shapes: node.inputs.iter().map(|id| graph.node(*id).shape.dims().to_vec()).collect(),
                    slot,
                    in_place: plan.in_place[i],
                });
            }
        }
        let outputs = graph.outputs.iter().map(|id| plan.operands[id.index()]).collect();
        Ok(Arc::new(CpuExecutable { steps, outputs, num_params: graph.num_params, plan, pool: Default::default() }))
    }
}

/// Nodes the backend keeps as one element: splat constants and broadcasts
/// of a single value, read only by elementwise kernels (which broadcast a
/// one-element operand). They are never materialised at full size.
fn splat_nodes(graph: &Graph) -> Vec<bool> {
    let mut only_elementwise_readers = vec![true; graph.nodes.len()];
    for node in &graph.nodes {
        let broadcasting_reader = matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Compare(_));
        for input in &node.inputs {
            only_elementwise_readers[input.index()] &= broadcasting_reader;
        }
    }
    for out in &graph.outputs {
        only_elementwise_readers[out.index()] = false;
    }
    let mut single_value = vec![false; graph.nodes.len()];
    let mut splat = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        single_value[i] = match node.op {
            Op::Constant(_) => true,
            Op::Expand | Op::Reshape => {
                let input = node.inputs[0].index();
                single_value[input] || graph.nodes[input].shape.numel() == 1
            }
            _ => node.shape.numel() == 1,
        };
        splat[i] = single_value[i] && only_elementwise_readers[i] && node.shape.numel() > 1;
    }
    splat
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        if inputs.len() != self.num_params {
            return Err(Error::Execution {
                node: 0,
                op: "parameter",
                detail: format!("the executable takes {} inputs, {} were given", self.num_params, inputs.len()),
            });
        }
        // Reuse the previous run's intermediate buffers: no allocation and no
        // page faults in steady state.
        let mut slots: Vec<Option<HostData>> =
            self.pool.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default();
        slots.resize(self.plan.slots.len(), None);
        let mut inputs: Vec<Option<Arc<Buffer>>> = inputs.into_iter().map(Some).collect();
        for &(k, slot) in &self.plan.donated {
            // Take the memory over when nothing else holds it; copy otherwise.
            slots[slot] = inputs[k].take().map(|buffer| match Arc::try_unwrap(buffer) {
                Ok(buffer) => buffer.into_host(),
                Err(shared) => shared.host().clone(),
            });
        }
        for step in &self.steps {
            let mut out = slots[step.slot].take().unwrap_or_else(|| HostData::zeros(step.node.dtype, 0));
            let operands: Vec<&HostData> = step
                .inputs
                .iter()
                .enumerate()
                .filter(|(pos, _)| Some(*pos) != step.in_place)
                .map(|(_, op)| match *op {
                    Operand::Param(k) => inputs[k].as_ref().expect("only donated inputs are taken").host(),
                    Operand::Slot(s) => slots[s].as_ref().expect("the plan places every input before its reader"),
                })
                .collect();
            let started = profile::enabled().then(std::time::Instant::now);
            let result = match step.in_place {
                Some(position) => kernels::eval_in_place(&step.node, position, &operands, &mut out),
                None => {
                    out.reset(step.node.dtype, step.node.shape.numel());
                    let shapes: Vec<&[usize]> = step.input_shapes.iter().map(Vec::as_slice).collect();
                    kernels::eval(&step.node, &operands, &shapes, &mut out, MatmulKernel::Gemm)
                }
            };
            result.map_err(|detail| Error::Execution { node: step.node_index, op: step.node.op.name(), detail })?;
            if let Some(t) = started {
                profile::record(profile::kind_of(&step.node.op), t.elapsed().as_nanos() as u64);
            }
            slots[step.slot] = Some(out);
        }
        let mut taken: Vec<Option<Arc<Buffer>>> = vec![None; slots.len()];
        let outputs = self
            .outputs
            .iter()
            .map(|op| match *op {
                Operand::Param(k) => inputs[k].clone().expect("only donated inputs are taken"),
                Operand::Slot(s) => taken[s]
                    .get_or_insert_with(|| Arc::new(Buffer::new(slots[s].take().expect("outputs are computed"))))
                    .clone(),
            })
            .collect();
        if let Ok(mut pool) = self.pool.lock() {
            *pool = slots;
        }
        Ok(outputs)
    }

    fn stats(&self) -> ExecutableStats {
        ExecutableStats {
            kernels: self.steps.len(),
            in_place: self.steps.iter().filter(|s| s.in_place.is_some()).count(),
            buffers: self.plan.slots.len(),
            planned_bytes: self.plan.planned_bytes(),
            unplanned_bytes: self.plan.unplanned_bytes,
            peak_bytes: self.plan.peak_bytes(),
        }
    }
}
