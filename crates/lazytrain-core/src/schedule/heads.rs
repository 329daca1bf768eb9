//! Head chains: consecutive steps over the same batch of matrices (an
//! attention's heads) where each step's matrix `i` reads what earlier steps
//! wrote only in their matrix `i`. A backend may run such a chain a head at
//! a time, every step in turn, so that a head's scores, probabilities and
//! their gradients are read back from cache instead of memory: in an
//! attention, `Q K^T`, the softmax's row chain, the dropout and `P V` each
//! read the previous step's `[batch, heads, seq, seq]` output, which is
//! larger than the caches when the steps run one after the other.
//!
//! A step between two members that cannot run a head at a time (a permute
//! of a product's heads into tokens, a bias gradient's sum) joins the chain
//! as a deferred step when no later member reads what it writes and it
//! reads nothing a later member overwrites: it runs after the chain's last
//! head, with the same inputs it had in the schedule's order.
//!
//! The schedule only names the chains; running the steps in order gives the
//! same values.

use super::chain::reads_row_value;
use super::fusion::{Access, Fusion, Group};
use super::memory::Operand;
use super::Step;
use crate::ir::{Graph, Op};

/// Steps that may run a matrix of a batch at a time (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadChain {
    /// Matrices every member splits into.
    pub batch: usize,
    /// The steps run a head at a time, ascending; the first is a batched matmul.
    pub members: Vec<usize>,
    /// For each member, how it reads each of its inputs.
    pub reads: Vec<Vec<HeadRead>>,
    /// Steps between the members that run after the chain's last head, ascending.
    pub deferred: Vec<usize>,
}

impl HeadChain {
    /// The steps from the first member to the last (members and deferred steps).
    pub fn span(&self) -> std::ops::Range<usize> {
        let first = self.members.first().copied().unwrap_or(0);
        first..self.members.last().map_or(first, |&last| last + 1)
    }
}

/// How a chain member reads one of its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadRead {
    /// A value computed before the chain, read any way.
    Before,
    /// A value an earlier member wrote, read in the reader's own head: a
    /// group's at its own positions, a matmul's as contiguous matrices.
    Heads,
    /// A value an earlier member wrote with one element per row (the
    /// trailing axis of the reader's shape), broadcast along the row.
    RowValue,
}

/// A slot a chain member wrote, with the elements per head of its value
/// (0 where its heads are not laid out one after the other: a product
/// stored into a permute's layout, which no member reads).
#[derive(Clone, Copy)]
struct Written {
    slot: usize,
    per_head: usize,
}

/// The head chains among `steps` of `graph`, each as long as it can be.
pub fn head_chains(graph: &Graph, fusion: &Fusion, steps: &[Step]) -> Vec<HeadChain> {
    let mut chains = Vec::new();
    let mut k = 0;
    while k < steps.len() {
        match chain_from(graph, fusion, steps, k) {
            Some(chain) => {
                k = chain.span().end;
                chains.push(chain);
            }
            None => k += 1,
        }
    }
    chains
}

/// For each node of `graph`, the last node of a head chain among `steps`
/// that reads its value while it must stay where it is (0 where none): a
/// value from before the chain that a member reads, or one a deferred step
/// reads. A memory plan that keeps these values alive until then reuses no
/// buffer a chain still reads, so the chains of its steps are as long as
/// these.
pub fn kept_until(graph: &Graph, fusion: &Fusion, steps: &[Step]) -> Vec<usize> {
    let mut kept = vec![0; graph.nodes.len()];
    for chain in head_chains(graph, fusion, steps) {
        let (Some(&first), Some(&last)) = (chain.members.first(), chain.members.last()) else { continue };
        let (first, last) = (steps[first].runs_at(fusion), steps[last].runs_at(fusion));
        for k in chain.span() {
            let deferred = chain.deferred.contains(&k);
            for x in fusion.reads(graph, steps[k].runs_at(fusion)) {
                if x < first || deferred {
                    kept[x] = kept[x].max(last);
                }
            }
        }
    }
    kept
}

/// The matrices of a batched matmul step: the product of the output's
/// leading (batch) axes, when there are at least two.
fn batched_product(graph: &Graph, step: &Step) -> Option<usize> {
    let Step::Node { node, splat: false, in_place: None, .. } = step else { return None };
    let node = &graph.nodes[*node];
    let dims = node.shape.dims();
    if !matches!(node.op, Op::Dot { .. }) || dims.len() < 3 {
        return None;
    }
    let batch: usize = dims[..dims.len() - 2].iter().product();
    (batch >= 2).then_some(batch)
}

/// What a chain under construction has seen.
#[derive(Default)]
struct Seen {
    /// Slots members wrote, latest last.
    written: Vec<Written>,
    /// Slots members read as values from before the chain.
    read_before: Vec<usize>,
    /// Slots deferred steps read.
    deferred_reads: Vec<usize>,
    /// Slots deferred steps write.
    deferred_writes: Vec<usize>,
}

impl Seen {
    fn written(&self, slot: usize) -> Option<Written> {
        self.written.iter().rev().find(|w| w.slot == slot).copied()
    }

    /// The slot a member's input `op` reads (`Some(None)`: none, a graph
    /// input), or `None` when a deferred step writes it: the member would
    /// read what runs only after the chain.
    fn member_input(&self, op: &Operand) -> Option<Option<usize>> {
        match slot_of(op) {
            Some(s) if self.deferred_writes.contains(&s) => None,
            slot => Some(slot),
        }
    }

    /// True when no deferred step reads or writes `slot`.
    fn untouched_by_deferred(&self, slot: usize) -> bool {
        !self.deferred_reads.contains(&slot) && !self.deferred_writes.contains(&slot)
    }

    /// True when a member may write `slot` as a new value: no step of the
    /// chain has read or written it.
    fn fresh(&self, slot: usize) -> bool {
        self.written(slot).is_none() && !self.read_before.contains(&slot) && self.untouched_by_deferred(slot)
    }
}

fn slot_of(op: &Operand) -> Option<usize> {
    match op {
        Operand::Slot(s) => Some(*s),
        Operand::Param(_) | Operand::Fused => None,
    }
}

/// The most steps in a row a chain defers before it ends: an attention's
/// gradient defers two (the value gradient's permute into tokens and its
/// bias's sum) between the products that read the scores' gradient.
const MAX_DEFERRED_IN_A_ROW: usize = 3;

/// The chain starting at step `first`, if one does: a batched matmul and
/// the members (and deferred steps) after it, with at least one more member.
fn chain_from(graph: &Graph, fusion: &Fusion, steps: &[Step], first: usize) -> Option<HeadChain> {
    let batch = batched_product(graph, &steps[first])?;
    let mut seen = Seen::default();
    let mut chain = HeadChain { batch, members: Vec::new(), reads: Vec::new(), deferred: Vec::new() };
    // Deferred steps since the last member.
    let mut waiting = 0;
    for (k, step) in steps.iter().enumerate().skip(first) {
        let admitted = match step {
            Step::Node { node, .. } if matches!(graph.nodes[*node].op, Op::Unary(_)) => {
                admit_unary(graph, step, batch, &mut seen)
            }
            Step::Node { .. } => admit_product(graph, step, batch, &mut seen),
            Step::Group { group, inputs, outputs, alias } => {
                admit_group(graph, &fusion.groups[*group], (inputs, outputs, alias), batch, &mut seen)
            }
        };
        match admitted {
            Some(reads) => {
                chain.members.push(k);
                chain.reads.push(reads);
                waiting = 0;
            }
            None if waiting < MAX_DEFERRED_IN_A_ROW => {
                defer(step, &mut seen);
                chain.deferred.push(k);
                waiting += 1;
            }
            None => break,
        }
    }
    let end = chain.span().end;
    chain.deferred.retain(|&k| k < end);
    (chain.members.len() >= 2).then_some(chain)
}

/// How matmul step `step` reads its operands as a member of a chain over
/// `batch` matrices, recording what it writes; `None` when it cannot join.
fn admit_product(graph: &Graph, step: &Step, batch: usize, seen: &mut Seen) -> Option<Vec<HeadRead>> {
    let Step::Node { node, inputs, views, slot, out_strides, .. } = step else { return None };
    if batched_product(graph, step)? != batch || !seen.fresh(*slot) {
        return None;
    }
    let node_ref = &graph.nodes[*node];
    let mut reads = Vec::with_capacity(inputs.len());
    for (j, op) in inputs.iter().enumerate() {
        let Some(s) = seen.member_input(op)? else {
            reads.push(HeadRead::Before);
            continue;
        };
        match seen.written(s) {
            // A member's value, read as whole contiguous matrices of its heads.
            Some(w) => {
                let operand = graph.node(node_ref.inputs[j]).shape.dims();
                let matrix: usize = operand[operand.len().saturating_sub(2)..].iter().product();
                let heads: usize = operand[..operand.len().saturating_sub(2)].iter().product();
                if views[j].is_some() || heads != batch || w.per_head != matrix {
                    return None;
                }
                reads.push(HeadRead::Heads);
            }
            None => reads.push(HeadRead::Before),
        }
    }
    for (op, read) in inputs.iter().zip(&reads) {
        if let (Some(s), HeadRead::Before) = (slot_of(op), read) {
            seen.read_before.push(s);
        }
    }
    let dims = node_ref.shape.dims();
    let per_head = match out_strides {
        None => dims[dims.len() - 2] * dims[dims.len() - 1],
        Some(_) => 0,
    };
    seen.written.push(Written { slot: *slot, per_head });
    Some(reads)
}

/// How an elementwise unary step reads its input as a member of a chain
/// over `batch` matrices (a row sum's reciprocal, in place or not): only a
/// member's value, at its own positions; `None` when it cannot join.
fn admit_unary(graph: &Graph, step: &Step, batch: usize, seen: &mut Seen) -> Option<Vec<HeadRead>> {
    let Step::Node { node, inputs, views, slot, in_place, splat: false, out_strides: None } = step else {
        return None;
    };
    let numel = graph.nodes[*node].shape.numel();
    let input = seen.member_input(inputs.first()?)??;
    let written = seen.written(input)?;
    if views[0].is_some() || !numel.is_multiple_of(batch) || written.per_head != numel / batch {
        return None;
    }
    match in_place {
        Some(0) if *slot == input && seen.untouched_by_deferred(*slot) => {}
        None if seen.fresh(*slot) => {}
        _ => return None,
    }
    seen.written.push(Written { slot: *slot, per_head: numel / batch });
    Some(vec![HeadRead::Heads])
}

/// How group step `(inputs, outputs, alias)` of `group` reads its inputs as
/// a member of a chain over `batch` matrices, recording what it writes;
/// `None` when it cannot join: its elements do not split into whole heads
/// (with whole reduction rows in each), it sums columns across heads, or it
/// reads a member's value other than in its own head.
fn admit_group(
    graph: &Graph,
    group: &Group,
    (inputs, outputs, alias): (&[Operand], &[usize], &[Option<usize>]),
    batch: usize,
    seen: &mut Seen,
) -> Option<Vec<HeadRead>> {
    let numel: usize = group.shape.iter().product();
    if numel == 0 || !numel.is_multiple_of(batch) || group.column_len > 0 {
        return None;
    }
    let per_head = numel / batch;
    if group.reduce_inner > 0 && !per_head.is_multiple_of(group.reduce_inner) {
        return None;
    }
    let width = group.shape.last().copied().unwrap_or(1).max(1);
    let mut reads = Vec::with_capacity(inputs.len());
    for (j, op) in inputs.iter().enumerate() {
        let Some(s) = seen.member_input(op)? else {
            reads.push(HeadRead::Before);
            continue;
        };
        let loads = || group.loads.iter().filter(move |l| l.input == j);
        let read = match seen.written(s) {
            None => HeadRead::Before,
            Some(w) if w.per_head == per_head && loads().all(|l| l.access == Access::Contiguous) => HeadRead::Heads,
            Some(w)
                if w.per_head * width == per_head
                    && loads().all(|l| reads_row_value(&l.access, &group.shape, numel / width)) =>
            {
                HeadRead::RowValue
            }
            Some(_) => return None,
        };
        reads.push(read);
    }
    let own_positions = |j: usize| group.loads.iter().filter(|l| l.input == j).all(|l| l.access == Access::Contiguous);
    for (k, &s) in outputs.iter().enumerate() {
        // An output over an input read at its own positions replaces it
        // head by head after the head's reads: a member's value, or one
        // from before the chain that no other step of the chain reads.
        let over = alias.iter().position(|a| *a == Some(k));
        let replaces = over.is_some_and(|j| {
            own_positions(j)
                && seen.untouched_by_deferred(s)
                && match reads[j] {
                    HeadRead::Heads => true,
                    HeadRead::Before => !seen.read_before.contains(&s),
                    HeadRead::RowValue => false,
                }
        });
        let other_inputs_share = inputs.iter().enumerate().any(|(j, op)| Some(j) != over && slot_of(op) == Some(s));
        if other_inputs_share || !(replaces || seen.fresh(s)) {
            return None;
        }
    }
    for (op, read) in inputs.iter().zip(&reads) {
        if let (Some(s), HeadRead::Before) = (slot_of(op), read) {
            if !alias.iter().any(|a| a.is_some_and(|k| outputs[k] == s)) {
                seen.read_before.push(s);
            }
        }
    }
    for (&o, &s) in group.outputs.iter().zip(outputs) {
        // A reduction writes one value per row of the head.
        let reduced = matches!(graph.nodes[o].op, Op::Reduce { .. });
        let elements = if reduced { per_head / group.reduce_inner.max(1) } else { per_head };
        seen.written.push(Written { slot: s, per_head: elements });
    }
    Some(reads)
}

/// Record `step` as deferred to the chain's end. Running it after the
/// chain's last head is safe whatever it reads and writes, because later
/// members are admitted only when they neither read nor write a slot it
/// writes and write no slot it reads (see [`Seen::fresh`]): members before
/// it have read what they read and written what they wrote (which it may
/// read, or overwrite once dead) when it runs.
fn defer(step: &Step, seen: &mut Seen) {
    let (reads, writes): (Vec<usize>, Vec<usize>) = match step {
        Step::Node { inputs, slot, .. } => (inputs.iter().filter_map(slot_of).collect(), vec![*slot]),
        Step::Group { inputs, outputs, .. } => (inputs.iter().filter_map(slot_of).collect(), outputs.clone()),
    };
    seen.deferred_reads.extend(reads);
    seen.deferred_writes.extend(writes);
}
