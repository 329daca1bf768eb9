//! The CPU backend: lowers a schedule into a flat list of kernel calls over
//! its planned buffers, with fused elementwise kernels in tile bytecode and
//! `gemm` (f32) or AVX-512 BF16 (bf16) matmuls.

mod executable;
mod program;

use super::{Backend, Executable};
use crate::error::Result;
use crate::ir::{Graph, Node};
use crate::kernels::fused::FusedProgram;
use crate::schedule::{self, Capabilities, MemoryPlan, Operand, Schedule};
use crate::shape::Shape;
use executable::SlotPool;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Runs graphs on the host CPU.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    /// Fuse elementwise chains and fold views into their loads.
    pub fuse: bool,
}

impl Default for CpuBackend {
    /// Fusion on, unless `LAZYTRAIN_FUSION=0` (for A/B measurements).
    fn default() -> CpuBackend {
        CpuBackend { fuse: std::env::var("LAZYTRAIN_FUSION").map_or(true, |v| v != "0") }
    }
}

/// What a step runs.
pub(super) enum Kernel {
    /// One primitive.
    Primitive {
        node: Node,
        input_shapes: Vec<Vec<usize>>,
        /// Element strides of inputs read as views of another buffer (matmul operands).
        views: Vec<Option<Vec<usize>>>,
        slot: usize,
        in_place: Option<usize>,
    },
    /// A fused group: input `j` is read from output `alias[j]` when that
    /// output overwrites it in place.
    Fused { program: FusedProgram, outputs: Vec<usize>, alias: Vec<Option<usize>> },
}

/// One kernel call.
pub(super) struct Step {
    node_index: usize,
    kernel: Kernel,
    inputs: Vec<Operand>,
    /// What the profile report calls this kernel (op and shapes).
    label: String,
}

/// A compiled CPU program.
pub(super) struct CpuExecutable {
    steps: Vec<Step>,
    outputs: Vec<Operand>,
    num_params: usize,
    plan: MemoryPlan,
    /// Intermediate buffers kept between runs, one set per concurrent run
    /// (replicas share the executable).
    pool: Arc<SlotPool>,
    /// Bytes of slot buffers allocated by runs so far.
    allocated: AtomicU64,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { fuse: self.fuse, splat: true, in_place: true }
    }

    fn lower(&self, schedule: &Schedule) -> Result<Arc<dyn Executable>> {
        let graph = schedule.graph;
        let steps = schedule.steps.iter().map(|step| lower_step(graph, schedule, step)).collect();
        Ok(Arc::new(CpuExecutable {
            steps,
            outputs: schedule.outputs.clone(),
            num_params: graph.num_params,
            plan: schedule.memory.clone(),
            pool: Arc::default(),
            allocated: AtomicU64::new(0),
        }))
    }
}

/// The CPU kernel of one scheduled step.
fn lower_step(graph: &Graph, schedule: &Schedule, step: &schedule::Step) -> Step {
    match step {
        schedule::Step::Group { group, inputs, outputs, alias } => {
            let program = program::build_program(graph, &schedule.fusion.groups[*group]);
            Step {
                node_index: schedule.fusion.groups[*group].runs_at,
                label: program.describe(),
                kernel: Kernel::Fused { program, outputs: outputs.clone(), alias: alias.clone() },
                inputs: inputs.clone(),
            }
        }
        schedule::Step::Node { node: i, inputs, views, slot, in_place, splat } => {
            let node = &graph.nodes[*i];
            let lowered = if *splat { Node { shape: Shape::scalar(), ..node.clone() } } else { node.clone() };
            let input_dims: Vec<String> =
                node.inputs.iter().map(|id| format!("{:?}", graph.node(*id).shape.dims())).collect();
            Step {
                node_index: *i,
                label: format!("{} {} -> {:?} {}", node.op.name(), input_dims.join(" "), node.shape.dims(), node.dtype),
                kernel: Kernel::Primitive {
                    node: lowered,
                    input_shapes: node.inputs.iter().map(|id| graph.node(*id).shape.dims().to_vec()).collect(),
                    views: views.clone(),
                    slot: *slot,
                    in_place: *in_place,
                },
                inputs: inputs.clone(),
            }
        }
    }
}
