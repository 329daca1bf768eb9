//! Liveness-based memory planning: each value gets a buffer slot, and a slot
//! is reused once the last reader of its previous value has run.

use super::fusion::Fusion;
use super::Capabilities;
use crate::dtype::DType;
use crate::ir::{Graph, Node, Op};

/// Where a kernel reads a value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Graph input buffer `k`.
    Param(usize),
    /// Intermediate buffer slot `s`.
    Slot(usize),
    /// No buffer: a view, or a value that lives only inside a fused kernel.
    Fused,
}

/// The slot assignment for a graph.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// For each node, where its value lives.
    pub operands: Vec<Operand>,
    /// Each slot's dtype and element capacity.
    pub slots: Vec<(DType, usize)>,
    /// For each node, the input position whose buffer it overwrites (in place;
    /// fused outputs record theirs as equal slots).
    pub in_place: Vec<Option<usize>>,
    /// Donated parameters and the slot each starts in.
    pub donated: Vec<(usize, usize)>,
    /// Bytes without reuse (one buffer per computed node).
    pub unplanned_bytes: usize,
    /// Bytes of the inputs that are not donated (alive during the whole run).
    pub input_bytes: usize,
}

impl MemoryPlan {
    /// Bytes of all slots.
    pub fn planned_bytes(&self) -> usize {
        self.slots.iter().map(|(dt, n)| dt.size_in_bytes() * n).sum()
    }

    /// Bytes of the five largest slots, largest first (0 where there are fewer).
    pub fn largest_slots(&self) -> [u64; 5] {
        let mut sizes: Vec<u64> = self.slots.iter().map(|(dt, n)| (dt.size_in_bytes() * n) as u64).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        std::array::from_fn(|i| sizes.get(i).copied().unwrap_or(0))
    }

    /// Bytes alive at the peak of a run: every slot plus the inputs that are
    /// not donated (slots keep their memory for reuse until the run ends).
    pub fn peak_bytes(&self) -> usize {
        self.planned_bytes() + self.input_bytes
    }

    /// Plan `graph`: an elementwise node whose input dies with it writes in
    /// place; any other computed node takes the smallest free slot of its
    /// dtype that fits (else a new one). Slots of values whose last reader
    /// has run are freed after that reader's own output is placed, so only
    /// in-place kernels ever write over an input. Graph outputs are never freed.
    ///
    /// `lengths[i]` is the number of elements node `i` physically holds (1
    /// for a splat the backend keeps as a single element). A fused group's
    /// outputs are placed together at its last member; one may take over
    /// the slot of an input it reads at the same positions (in place). A
    /// permute computed by its product gets its slot where the product runs.
    /// Elementwise nodes write in place only where `capabilities` allow it.
    ///
    /// `kept_until[i]` (where given) keeps node `i`'s value alive at least
    /// until node `kept_until[i]` has run, as if that node read it: a head
    /// chain's members read their inputs head by head until its last member.
    pub fn new(
        graph: &Graph,
        lengths: &[usize],
        fusion: &Fusion,
        capabilities: &Capabilities,
        kept_until: &[usize],
    ) -> MemoryPlan {
        let mut last_use = vec![0usize; graph.nodes.len()];
        for i in 0..graph.nodes.len() {
            for x in fusion.reads(graph, i) {
                last_use[x] = last_use[x].max(i);
            }
        }
        for (last, &kept) in last_use.iter_mut().zip(kept_until) {
            *last = (*last).max(kept);
        }
        for id in &graph.outputs {
            last_use[id.index()] = usize::MAX;
        }
        let mut operands = vec![Operand::Fused; graph.nodes.len()];
        let mut slots: Vec<(DType, usize)> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut unplanned_bytes = 0;
        let mut dying: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
        let mut donated = Vec::new();
        let mut in_place = vec![None; graph.nodes.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Op::Parameter(k) = node.op {
                if !graph.donated[k] {
                    operands[i] = Operand::Param(k);
                    continue;
                }
            }
            if fusion.view[i].is_some() || fusion.inlined[i] || fusion.computed_by[i].is_some() {
                continue;
            }
            if let Some(store) = &fusion.stored_permuted[i] {
                // The product computes its permute's value: the permute's
                // slot is taken here, where it is written.
                let p = store.base;
                let permuted = &graph.nodes[p];
                unplanned_bytes += lengths[p] * permuted.dtype.size_in_bytes();
                let wanted = Wanted { dtype: permuted.dtype, len: lengths[p], output: last_use[p] == usize::MAX };
                let slot = take_slot(&mut free, &mut slots, &donated, wanted);
                operands[p] = Operand::Slot(slot);
                if last_use[p] != usize::MAX {
                    dying[last_use[p].max(i)].push(slot);
                }
                release(&mut dying[i], &mut free);
                continue;
            }
            if let Some(g) = fusion.group_of[i] {
                if fusion.position(i) == i {
                    let group = &fusion.groups[g];
                    let mut taken = Vec::new();
                    for &o in &group.outputs {
                        let out = &graph.nodes[o];
                        unplanned_bytes += lengths[o] * out.dtype.size_in_bytes();
                        let fits = |x: usize| {
                            let Operand::Slot(s) = operands[x] else { return None };
                            let fits = last_use[x] == i
                                && graph.nodes[x].dtype == out.dtype
                                && lengths[x] == lengths[o]
                                && !taken.contains(&s);
                            fits.then_some(s)
                        };
                        // A graph output leaves the run with its buffer: it takes a
                        // donated input's slot (which the next run refills with
                        // its donated input) rather than an intermediate's,
                        // which would then need fresh memory every run.
                        let is_output = last_use[o] == usize::MAX;
                        let donated_first = |x: &&usize| is_donated(graph, **x) != is_output;
                        let mut candidates: Vec<&usize> = group.contiguous_inputs.iter().collect();
                        candidates.sort_by_key(donated_first);
                        // A graph output takes a free donated input's slot
                        // (see `take_slot`) before an input's of its own.
                        let wanted = Wanted { dtype: out.dtype, len: lengths[o], output: is_output };
                        let reusable = match free_donated_slot(&free, &slots, &donated, wanted) {
                            Some(pos) => Some(free.swap_remove(pos)),
                            None => candidates.into_iter().find_map(|&x| fits(x)).filter(|_| capabilities.in_place),
                        };
                        let slot = match reusable {
                            Some(s) => {
                                dying[i].retain(|&d| d != s);
                                s
                            }
                            None => take_slot(&mut free, &mut slots, &donated, wanted),
                        };
                        taken.push(slot);
                        operands[o] = Operand::Slot(slot);
                        if last_use[o] != usize::MAX {
                            dying[last_use[o].max(i)].push(slot);
                        }
                    }
                    release(&mut dying[i], &mut free);
                }
                continue;
            }
            let len = lengths[i];
            if let Op::Parameter(k) = node.op {
                // A donated input lives in a slot of its own from the start;
                // once its last reader has run, a graph output may take the
                // slot (see `take_slot`).
                slots.push((node.dtype, len));
                let slot = slots.len() - 1;
                donated.push((k, slot));
                operands[i] = Operand::Slot(slot);
                if last_use[i] != usize::MAX {
                    dying[last_use[i].max(i)].push(slot);
                }
                continue;
            }
            unplanned_bytes += len * node.dtype.size_in_bytes();
            // In place: an elementwise node may take over the slot of an input
            // whose last reader it is (same dtype and size, read only once here).
            let is_output = last_use[i] == usize::MAX;
            let mut candidates: Vec<(usize, &crate::ir::NodeId)> = node.inputs.iter().enumerate().collect();
            candidates.sort_by_key(|(_, id)| is_donated(graph, id.index()) != is_output);
            let reusable = candidates.into_iter().find_map(|(pos, id)| {
                let input = &graph.nodes[id.index()];
                let Operand::Slot(s) = operands[id.index()] else { return None };
                let fits = capabilities.in_place
                    && writes_in_place(node, pos)
                    && last_use[id.index()] == i
                    && input.dtype == node.dtype
                    && lengths[id.index()] == len
                    && node.inputs.iter().filter(|j| *j == id).count() == 1;
                fits.then_some((pos, s))
            });
            // A graph output takes a free donated input's slot (see
            // `take_slot`) rather than an intermediate input's.
            let wanted = Wanted { dtype: node.dtype, len, output: is_output };
            let donated_slot_free = free_donated_slot(&free, &slots, &donated, wanted).is_some();
            let reusable = reusable.filter(|&(_, s)| !donated_slot_free || holds_donated(&donated, s));
            if let Some((pos, slot)) = reusable {
                dying[i].retain(|&s| s != slot);
                in_place[i] = Some(pos);
                operands[i] = Operand::Slot(slot);
                if last_use[i] != usize::MAX {
                    dying[last_use[i]].push(slot);
                }
                release(&mut dying[i], &mut free);
                continue;
            }
            let slot = take_slot(&mut free, &mut slots, &donated, wanted);
            operands[i] = Operand::Slot(slot);
            if last_use[i] != usize::MAX {
                dying[last_use[i].max(i)].push(slot);
            }
            release(&mut dying[i], &mut free);
        }
        let input_bytes = graph
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Parameter(k) if !graph.donated[k] => Some(n.shape.numel() * n.dtype.size_in_bytes()),
                _ => None,
            })
            .sum();
        MemoryPlan { operands, slots, in_place, donated, unplanned_bytes, input_bytes }
    }
}

/// True when `node` can write its output over input `position`: element
/// `i` of the output depends only on element `i` of that input, which is
/// read before it is written (elementwise ops; a scatter-add into its
/// target; a select's values, never its mask, which has another dtype).
pub fn writes_in_place(node: &Node, position: usize) -> bool {
    match node.op {
        Op::Unary(_) | Op::Binary(_) | Op::AllReduce(_) => true,
        Op::ScatterAdd { .. } => position == 0,
        Op::Select => position > 0,
        Op::Parameter(_)
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RngUniform { .. }
        | Op::Cast
        | Op::Compare(_)
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Permute(_)
        | Op::Expand
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. }
        | Op::Gather { .. }
        | Op::Dot { .. }
        | Op::StopGradient => false,
    }
}

/// True when node `x` is a donated graph input (its buffer comes back with
/// every run).
fn is_donated(graph: &Graph, x: usize) -> bool {
    matches!(graph.nodes[x].op, Op::Parameter(k) if graph.donated[k])
}

/// Return the slots of the values whose last reader just ran to the free list.
fn release(dying: &mut Vec<usize>, free: &mut Vec<usize>) {
    for s in std::mem::take(dying) {
        if !free.contains(&s) {
            free.push(s);
        }
    }
}

/// True when `slot` is a donated input's (`donated`: input and slot pairs).
fn holds_donated(donated: &[(usize, usize)], slot: usize) -> bool {
    donated.iter().any(|&(_, d)| d == slot)
}

/// The position in `free` of a free slot of a donated input that fits a
/// graph output exactly (none for any other value).
fn free_donated_slot(
    free: &[usize],
    slots: &[(DType, usize)],
    donated: &[(usize, usize)],
    wanted: Wanted,
) -> Option<usize> {
    let Wanted { dtype, len, output } = wanted;
    free.iter().position(|&s| output && slots[s] == (dtype, len) && holds_donated(donated, s))
}

/// The slot a value needs: its dtype, its length, and whether it is a
/// graph output (which leaves the run with its slot's memory).
#[derive(Clone, Copy)]
struct Wanted {
    dtype: DType,
    len: usize,
    output: bool,
}

/// The smallest free slot of the wanted dtype holding at least `len` and
/// at most `2 len` elements, or a new one. Without the upper bound a small
/// value can pin a huge slot and force another huge allocation later. The
/// slot of a donated input whose last reader has run (a weight's bf16 copy
/// from the previous step, see `tensor::narrow_copy`) goes to a graph
/// output only, and a graph output takes one first: the next run refills
/// it with its donated input, where an output leaving with any other slot's
/// memory leaves that slot to fresh memory every run.
fn take_slot(
    free: &mut Vec<usize>,
    slots: &mut Vec<(DType, usize)>,
    donated: &[(usize, usize)],
    wanted: Wanted,
) -> usize {
    let Wanted { dtype, len, output } = wanted;
    let is_donated = |s: usize| holds_donated(donated, s);
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, &s)| slots[s].0 == dtype && slots[s].1 >= len && slots[s].1 <= len.saturating_mul(2))
        .filter(|(_, &s)| output || !is_donated(s))
        .min_by_key(|(_, &s)| (!is_donated(s), slots[s].1))
        .map(|(pos, _)| pos);
    match best {
        Some(pos) => free.swap_remove(pos),
        None => {
            slots.push((dtype, len));
            slots.len() - 1
        }
    }
}
