//! The backend-neutral schedule of an optimised graph: which nodes are
//! kept as one element (splats), which fuse into one kernel and which are
//! views ([`fusion`]), where every value lives (the liveness/slot
//! [`memory`] plan, in place and donated buffers), and the ordered steps a
//! backend lowers into its executable.
//!
//! A backend answers a small [`Capabilities`] query; it makes none of these
//! decisions itself.

pub mod chain;
pub mod epilogue;
pub mod fusion;
pub mod heads;
pub mod memory;
mod splat;

pub use chain::{row_chains, ChainRead, RowChain};
pub use epilogue::{matmul_epilogues, Epilogue};
pub use fusion::{Access, Fusion, Group, Load, MemberRead, View};
pub use heads::{head_chains, HeadChain, HeadRead};
pub use memory::{writes_in_place, MemoryPlan, Operand};
pub use splat::splat_nodes;

use crate::ir::{Graph, Op};

/// What a backend can run, which shapes its schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Fused elementwise kernels (groups) and views read through strides.
    pub fuse: bool,
    /// Single values broadcast by elementwise kernels kept as one element.
    pub splat: bool,
    /// Elementwise kernels that write over an input whose last reader they are.
    pub in_place: bool,
    /// f32 batched matmuls that store their product straight into the
    /// layout of a permute that is its only reader, with rows still
    /// contiguous (see [`Fusion::store_products_permuted`]).
    pub permuted_products: bool,
}

impl Capabilities {
    /// Every value computed by its own kernel into its own planned slot.
    pub const UNFUSED: Capabilities =
        Capabilities { fuse: false, splat: false, in_place: false, permuted_products: false };
}

/// One kernel call of a schedule, in execution order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Node `node` computed by its own kernel into slot `slot`.
    Node {
        /// The node.
        node: usize,
        /// Where each input's data is (views: their base's buffer).
        inputs: Vec<Operand>,
        /// Element strides of inputs read as views of another buffer.
        views: Vec<Option<Vec<usize>>>,
        /// The output slot.
        slot: usize,
        /// The input position whose buffer the output overwrites.
        in_place: Option<usize>,
        /// The node is a splat: computed as its single element.
        splat: bool,
        /// Element strides the output is stored with, where it is not
        /// contiguous: a product stored in the layout of the permute that
        /// reads it, whose slot `slot` is.
        out_strides: Option<Vec<usize>>,
    },
    /// Group `group` of [`Fusion::groups`] computed by one kernel.
    Group {
        /// The group.
        group: usize,
        /// Where each of the group's inputs is.
        inputs: Vec<Operand>,
        /// The slot of each of the group's outputs.
        outputs: Vec<usize>,
        /// For each input, the output that overwrites it in place.
        alias: Vec<Option<usize>>,
    },
}

/// An optimised graph scheduled for a backend with given capabilities.
#[derive(Clone, Debug)]
pub struct Schedule<'g> {
    /// The graph.
    pub graph: &'g Graph,
    /// Nodes kept as one element.
    pub splat: Vec<bool>,
    /// Groups, views and inlined constants.
    pub fusion: Fusion,
    /// Slots, in-place outputs and donated inputs.
    pub memory: MemoryPlan,
    /// The kernel calls, in order.
    pub steps: Vec<Step>,
    /// Matmul steps whose next step may run as their epilogue.
    pub epilogues: Vec<Epilogue>,
    /// Consecutive group steps that may run a block of rows at a time.
    pub row_chains: Vec<RowChain>,
    /// Steps over a batch of matrices that may run a matrix at a time.
    pub head_chains: Vec<HeadChain>,
    /// Where each graph output is after the last step.
    pub outputs: Vec<Operand>,
}

impl Step {
    /// The node this step runs at: its node, or its group's.
    pub fn runs_at(&self, fusion: &Fusion) -> usize {
        match self {
            Step::Node { node, .. } => *node,
            Step::Group { group, .. } => fusion.groups[*group].runs_at,
        }
    }
}

impl<'g> Schedule<'g> {
    /// Schedule `graph` for a backend with `capabilities`.
    pub fn new(graph: &'g Graph, capabilities: &Capabilities) -> Schedule<'g> {
        let splat = match capabilities.splat {
            true => splat_nodes(graph),
            false => vec![false; graph.nodes.len()],
        };
        let mut fusion = match capabilities.fuse {
            true => fusion::plan(graph, &splat),
            false => Fusion::none(graph.nodes.len()),
        };
        if capabilities.permuted_products {
            fusion.store_products_permuted(graph, &splat);
        }
        let lengths: Vec<usize> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match (splat[i], fusion.materialised(i)) {
                (_, false) => 0,
                (true, true) => 1,
                (false, true) => n.shape.numel(),
            })
            .collect();
        let kept_until = match capabilities.fuse {
            true => {
                // Head chains as they would be if no buffer were reused keep
                // their inputs alive to their ends: a slot reused inside a
                // chain would end it there.
                let last = graph.nodes.len().saturating_sub(1);
                let unshared = MemoryPlan::new(graph, &lengths, &fusion, capabilities, &vec![last; graph.nodes.len()]);
                heads::kept_until(graph, &fusion, &steps(graph, &splat, &fusion, &unshared))
            }
            false => Vec::new(),
        };
        let memory = MemoryPlan::new(graph, &lengths, &fusion, capabilities, &kept_until);
        let steps = steps(graph, &splat, &fusion, &memory);
        let epilogues = matmul_epilogues(graph, &fusion, &steps);
        let row_chains = row_chains(graph, &fusion, &steps);
        let head_chains = head_chains(graph, &fusion, &steps);
        let outputs = graph.outputs.iter().map(|id| memory.operands[id.index()]).collect();
        Schedule { graph, splat, fusion, memory, steps, epilogues, row_chains, head_chains, outputs }
    }

    /// The number of kernel calls.
    pub fn kernels(&self) -> usize {
        self.steps.len()
    }

    /// Of those, fused groups.
    pub fn fused_kernels(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, Step::Group { .. })).count()
    }

    /// Kernel calls that write over an input's buffer.
    pub fn in_place_kernels(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| match s {
                Step::Node { in_place, .. } => in_place.is_some(),
                Step::Group { alias, .. } => alias.iter().any(Option::is_some),
            })
            .count()
    }
}

/// The kernel calls: a group where it runs, every other computed node that
/// has a buffer where it is, a product stored into its permute's buffer
/// where the product is; parameters, views, inlined constants and permutes
/// their products compute need none.
fn steps(graph: &Graph, splat: &[bool], fusion: &Fusion, memory: &MemoryPlan) -> Vec<Step> {
    let mut steps = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if matches!(node.op, Op::Parameter(_)) || fusion.view[i].is_some() || fusion.inlined[i] {
            continue;
        }
        if let Some(g) = fusion.group_of[i] {
            if fusion.position(i) != i {
                continue;
            }
            let group = &fusion.groups[g];
            let inputs: Vec<Operand> = group.inputs.iter().map(|&x| memory.operands[x]).collect();
            let outputs: Vec<usize> = group
                .outputs
                .iter()
                .map(|&o| match memory.operands[o] {
                    Operand::Slot(s) => s,
                    Operand::Param(_) | Operand::Fused => unreachable!("fused outputs get slots"),
                })
                .collect();
            let alias = inputs
                .iter()
                .map(|op| match op {
                    Operand::Slot(s) => outputs.iter().position(|o| o == s),
                    Operand::Param(_) | Operand::Fused => None,
                })
                .collect();
            steps.push(Step::Group { group: g, inputs, outputs, alias });
            continue;
        }
        let inputs = || node.inputs.iter().map(|id| memory.operands[fusion.resolve(id.index())]).collect();
        let views =
            || node.inputs.iter().map(|id| fusion.view[id.index()].as_ref().map(|v| v.strides.clone())).collect();
        if let Some(store) = &fusion.stored_permuted[i] {
            let Operand::Slot(slot) = memory.operands[store.base] else {
                unreachable!("a permute computed by its product has a slot")
            };
            let out_strides = Some(store.strides.clone());
            steps.push(Step::Node {
                node: i,
                inputs: inputs(),
                views: views(),
                slot,
                in_place: None,
                splat: false,
                out_strides,
            });
            continue;
        }
        if let (Operand::Slot(slot), None) = (memory.operands[i], fusion.computed_by[i]) {
            steps.push(Step::Node {
                node: i,
                inputs: inputs(),
                views: views(),
                slot,
                in_place: memory.in_place[i],
                splat: splat[i],
                out_strides: None,
            });
        }
    }
    steps
}
