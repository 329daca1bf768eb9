//! Row chains: consecutive fused groups over the same rows, where each
//! group after the first reads what earlier ones wrote only in its own rows
//! (at its own positions, or one value per row, such as a row maximum or a
//! row sum broadcast along the row). A backend may run such a chain a block
//! of rows at a time, every group in turn, so a later group reads the
//! earlier ones' rows while they are still in cache: in the log-softmax of
//! the vocabulary logits (add the bias and take the row max, then exp and
//! the row sum) the second kernel reads the first one's `[tokens, vocab]`
//! output from cache instead of memory.
//!
//! The schedule only names the chains; running the steps in order gives the
//! same values.

use super::fusion::{Access, Fusion, Group};
use super::memory::Operand;
use super::Step;
use crate::ir::{Graph, Op};

/// Steps `first..first + reads.len()` form a row chain over `rows` rows:
/// every step is a group computing `rows x width` elements (its own width),
/// whose reductions and column sums run over whole rows of its width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowChain {
    /// The first step.
    pub first: usize,
    /// Rows every step splits into.
    pub rows: usize,
    /// For each step of the chain, how it reads each of its group's inputs.
    pub reads: Vec<Vec<ChainRead>>,
}

/// How a group in a chain reads one of its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainRead {
    /// A value computed before the chain, read any way.
    Before,
    /// A value an earlier group of the chain wrote, read at the reader's
    /// own positions.
    Rows,
    /// A value an earlier group of the chain wrote with one element per
    /// row, read as that element broadcast along the row.
    RowValue,
}

/// The row chains among `steps` of `graph`, each as long as it can be.
pub fn row_chains(graph: &Graph, fusion: &Fusion, steps: &[Step]) -> Vec<RowChain> {
    let mut chains = Vec::new();
    let mut k = 0;
    while k < steps.len() {
        match chain_from(graph, fusion, steps, k) {
            Some(chain) => {
                k += chain.reads.len();
                chains.push(chain);
            }
            None => k += 1,
        }
    }
    chains
}

/// A group step: its group, where its inputs are, its output slots, and
/// which outputs overwrite which inputs in place.
struct Member<'f> {
    group: &'f Group,
    inputs: &'f [Operand],
    outputs: &'f [usize],
    alias: &'f [Option<usize>],
}

fn member<'f>(fusion: &'f Fusion, step: &'f Step) -> Option<Member<'f>> {
    match step {
        Step::Group { group, inputs, outputs, alias } => {
            Some(Member { group: &fusion.groups[*group], inputs, outputs, alias })
        }
        Step::Node { .. } => None,
    }
}

/// What an output of a chain group holds per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    /// `width` elements per row.
    Rows(usize),
    /// A column sum (written when the whole chain has run).
    ColumnSum,
}

/// Elements per row of output node `o` of `group` over `rows` rows.
fn written(graph: &Graph, group: &Group, o: usize, rows: usize) -> Written {
    let reduced = matches!(graph.nodes[o].op, Op::Reduce { .. });
    match (reduced, group.column_len > 0) {
        (true, true) => Written::ColumnSum,
        (true, false) => Written::Rows(1),
        (false, _) => Written::Rows(numel(group) / rows),
    }
}

fn numel(group: &Group) -> usize {
    group.shape.iter().product()
}

/// True when `access` over `shape` reads, for each of `rows` rows, the
/// element of that row of a value with one element per row.
pub(crate) fn reads_row_value(access: &Access, shape: &[usize], rows: usize) -> bool {
    let Access::Strided(strides) = access else { return false };
    // Leading axes index the row (row-major over them), trailing ones are
    // broadcast; axes of length 1 are indexed by 0 whatever their stride.
    let mut leading = 1;
    let mut split = 0;
    while split < shape.len() && leading < rows {
        leading *= shape[split];
        split += 1;
    }
    if leading != rows {
        return false;
    }
    let mut expected = 1;
    for d in (0..split).rev() {
        if shape[d] > 1 && strides[d] != expected {
            return false;
        }
        expected *= shape[d];
    }
    (split..shape.len()).all(|d| shape[d] == 1 || strides[d] == 0)
}

/// The chain starting at step `first`, if one does: a group with row
/// reductions followed by groups over the same rows that read its values
/// (and each other's) only in their own rows, and whose buffers running
/// them a block of rows at a time cannot clobber.
fn chain_from(graph: &Graph, fusion: &Fusion, steps: &[Step], first: usize) -> Option<RowChain> {
    let head = member(fusion, &steps[first]).filter(|m| m.group.reduce_inner > 0)?;
    let rows = numel(head.group) / head.group.reduce_inner;
    // Values the chain wrote (node, per row, slot); slots read as values
    // from before the chain; slots of column sums.
    let mut values: Vec<(usize, Written, usize)> = Vec::new();
    let mut read_before: Vec<(usize, Option<usize>)> = Vec::new();
    let mut column_slots: Vec<usize> = Vec::new();
    let mut reads = Vec::new();
    for step in &steps[first..] {
        let Some(m) = member(fusion, step) else { break };
        let Some(step_reads) = admit(graph, &m, rows, &values, &read_before, &column_slots) else { break };
        if !reads.is_empty() && step_reads.iter().all(|&r| r == ChainRead::Before) {
            break;
        }
        for (j, read) in step_reads.iter().enumerate() {
            // An input overwritten in place is the output's value from now on.
            if let (ChainRead::Before, Operand::Slot(s), None) = (read, m.inputs[j], m.alias[j]) {
                read_before.push((s, own_positions(&m, j).then_some(numel(m.group) / rows)));
            }
        }
        for (&o, &s) in m.group.outputs.iter().zip(m.outputs) {
            let w = written(graph, m.group, o, rows);
            if w == Written::ColumnSum {
                column_slots.push(s);
            }
            values.push((o, w, s));
        }
        reads.push(step_reads);
    }
    (reads.len() >= 2).then_some(RowChain { first, rows, reads })
}

/// True when every load of input `j` of `m` reads at the group's own positions.
fn own_positions(m: &Member, j: usize) -> bool {
    m.group.loads.iter().filter(|l| l.input == j).all(|l| l.access == Access::Contiguous)
}

/// How member `m` would read its inputs as the next step of a chain over
/// `rows` rows that has written `values`, or `None` when it cannot join.
fn admit(
    graph: &Graph,
    m: &Member,
    rows: usize,
    values: &[(usize, Written, usize)],
    read_before: &[(usize, Option<usize>)],
    column_slots: &[usize],
) -> Option<Vec<ChainRead>> {
    let group = m.group;
    let n = numel(group);
    if !n.is_multiple_of(rows) {
        return None;
    }
    let width = n / rows;
    if (group.reduce_inner > 0 && group.reduce_inner != width) || (group.column_len > 0 && group.column_len != width) {
        return None;
    }
    let slot_of = |op: &Operand| match op {
        Operand::Slot(s) => Some(*s),
        Operand::Param(_) | Operand::Fused => None,
    };
    let mut reads = Vec::with_capacity(group.inputs.len());
    for (j, &x) in group.inputs.iter().enumerate() {
        let slot = slot_of(&m.inputs[j]);
        if slot.is_some_and(|s| column_slots.contains(&s)) {
            return None;
        }
        // The latest write of the chain to this input's node, if any.
        let read = match values.iter().rev().find(|(o, _, _)| *o == x) {
            None => {
                // A value from before the chain must not sit in a slot the
                // chain has written (it would be read after being overwritten).
                if slot.is_some_and(|s| values.iter().any(|(_, _, v)| *v == s)) {
                    return None;
                }
                ChainRead::Before
            }
            Some((_, Written::ColumnSum, _)) => return None,
            Some((_, Written::Rows(w), _)) => {
                let loads = group.loads.iter().filter(|l| l.input == j);
                let read = if *w == width { ChainRead::Rows } else { ChainRead::RowValue };
                let fits = |access: &Access| match read {
                    ChainRead::Rows => *access == Access::Contiguous,
                    ChainRead::RowValue => *w == 1 && reads_row_value(access, &group.shape, rows),
                    ChainRead::Before => unreachable!("chain values only"),
                };
                if !loads.clone().all(|l| fits(&l.access)) {
                    return None;
                }
                read
            }
        };
        reads.push(read);
    }
    for (k, &s) in m.outputs.iter().enumerate() {
        // Writing a slot an earlier step of the chain still reads in later
        // rows (a value from before it) or wrote is only safe in place, over
        // a value this group reads at its own positions: earlier steps read
        // or wrote it at theirs, in rows of the same width, and are done
        // with the rows this group overwrites.
        let in_place = |read: ChainRead| {
            m.alias.iter().enumerate().any(|(j, a)| *a == Some(k) && reads[j] == read && own_positions(m, j))
        };
        let written_before = values.iter().any(|(_, _, v)| *v == s);
        let before_readers = read_before.iter().filter(|(slot, _)| *slot == s);
        let read_in_rows = before_readers.clone().all(|&(_, w)| w == Some(width));
        let read_earlier = before_readers.count() > 0;
        if column_slots.contains(&s)
            || (written_before && !in_place(ChainRead::Rows))
            || (read_earlier && !(read_in_rows && (in_place(ChainRead::Before) || in_place(ChainRead::Rows))))
        {
            return None;
        }
        if written(graph, group, group.outputs[k], rows) == Written::ColumnSum && written_before {
            return None;
        }
    }
    Some(reads)
}
