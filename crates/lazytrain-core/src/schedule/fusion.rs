//! Fusion decisions, backend-neutral.
//!
//! Connected elementwise nodes of one shape become a group computed by one
//! fused kernel at the position of its last member (the backend turns the
//! group's data flow into its own kernel; the CPU backend into tile
//! bytecode). `reshape`, `expand` and `permute` nodes read only by fused
//! kernels (and reshapes of contiguous data read by matmuls) become *views*:
//! no kernel and no buffer, just an index map the loads (or the matmul's
//! operand strides) follow. Members read outside their group (or graph outputs) are the
//! group's outputs and get buffers; the rest live only in tile registers.
//!
//! A node joins the group of its readers when all of them belong to that
//! one group (graph outputs aside), so a group is a DAG with one root, the
//! last member, where it runs: no member is read outside the group before
//! the root has run, and no path leaves the group and comes back.

use crate::dtype::DType;
use crate::ir::{Graph, Op, ReduceOp, UnaryOp};
use crate::shape::contiguous_strides;

/// How a group's load reads its input for each element of the group's
/// (contiguous) shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Element `i` of the output reads element `i` of the input.
    Contiguous,
    /// Every element reads the input's only element.
    Splat,
    /// Element with multi-index `idx` reads `sum(idx[d] * strides[d])`
    /// (0 strides broadcast).
    Strided(Vec<usize>),
}

/// A load of a fused group: which of the group's inputs and how it is indexed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    /// Index into the group's inputs.
    pub input: usize,
    /// The index map.
    pub access: Access,
}

/// Where a group member reads one of its operands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemberRead {
    /// The value of another member (computed earlier in the group).
    Member(usize),
    /// A scalar constant, folded into the kernel as an immediate.
    Immediate(f32),
    /// Load `k` of the group (each read loads afresh).
    Load(usize),
    /// The seed scalar of a random draw: group input `k`, read whole.
    Seed(usize),
}

/// A value read through an index map instead of its own buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The node whose buffer is read.
    pub base: usize,
    /// Strides into the base buffer over the view's shape (0 broadcasts).
    pub strides: Vec<usize>,
}

/// A fused group: what it computes and from which buffers. The backend
/// lowers it into one kernel.
#[derive(Clone, Debug)]
pub struct Group {
    /// Member nodes, ascending.
    pub members: Vec<usize>,
    /// Where the group runs: its last member, or earlier when a cast of a
    /// member was absorbed as an epilogue.
    pub runs_at: usize,
    /// Members with buffers, in store order.
    pub outputs: Vec<usize>,
    /// Nodes whose buffers the kernel reads, in load order.
    pub inputs: Vec<usize>,
    /// Inputs read at the output's own positions (candidates for in place).
    pub contiguous_inputs: Vec<usize>,
    /// The loads, in order of first read.
    pub loads: Vec<Load>,
    /// For each member (in `members` order), where its operands come from.
    pub reads: Vec<Vec<MemberRead>>,
    /// The shape every member computes (reductions: before reducing).
    pub shape: Vec<usize>,
    /// The row length of the group's reductions (all reduce the trailing
    /// `reduce_inner` elements of the shape); 0 without reductions.
    pub reduce_inner: usize,
    /// The row length of the group's column sums (sums over leading axes,
    /// one per position of the trailing `column_len` elements); 0 without.
    /// A group has row reductions or column sums, never both.
    pub column_len: usize,
}

/// The fusion decisions for a graph.
#[derive(Clone, Debug, Default)]
pub struct Fusion {
    /// The group of each node, if it is a member of one.
    pub group_of: Vec<Option<usize>>,
    /// The groups.
    pub groups: Vec<Group>,
    /// Views (no kernel, no buffer).
    pub view: Vec<Option<View>>,
    /// Constants read only as immediates of fused kernels (no kernel, no buffer).
    pub inlined: Vec<bool>,
    /// Products stored straight into the buffer of the permute that is
    /// their only reader (no buffer of their own): the permute, and the
    /// element strides of the product's axes in its buffer.
    pub stored_permuted: Vec<Option<View>>,
    /// Permutes whose buffer their product computes (no kernel of their own).
    pub computed_by: Vec<Option<usize>>,
}

impl Fusion {
    /// No fusion: every node runs its own kernel.
    pub fn none(nodes: usize) -> Fusion {
        Fusion {
            group_of: vec![None; nodes],
            groups: Vec::new(),
            view: vec![None; nodes],
            inlined: vec![false; nodes],
            stored_permuted: vec![None; nodes],
            computed_by: vec![None; nodes],
        }
    }

    /// Store each f32 or bf16 batched matmul whose only reader is a permute that
    /// keeps the trailing axis in place straight into that permute's
    /// buffer, its rows `n` contiguous values a stride apart: an
    /// attention's `[batch, heads, seq, head_dim]` products land in the
    /// `[batch, seq, heads, head_dim]` layout of the projections that read
    /// them, without a copy between. Graph outputs, splats and empty
    /// products keep their own buffers.
    pub fn store_products_permuted(&mut self, graph: &Graph, splat: &[bool]) {
        let mut readers = vec![0usize; graph.nodes.len()];
        for node in &graph.nodes {
            for id in &node.inputs {
                readers[id.index()] += 1;
            }
        }
        for id in &graph.outputs {
            readers[id.index()] += 1;
        }
        for (p, node) in graph.nodes.iter().enumerate() {
            let Op::Permute(perm) = &node.op else { continue };
            let d = node.inputs[0].index();
            let product = &graph.nodes[d];
            let rank = perm.len();
            // f32 products (`gemm`, the attention-head kernel) and bf16 ones
            // (the bf16 kernels) write rows wherever the layout puts them.
            let same_dtype_operands = product.inputs.iter().all(|id| graph.node(*id).dtype == product.dtype);
            let stays_last = rank >= 3 && perm[rank - 1] == rank - 1;
            if !matches!(product.op, Op::Dot { .. })
                || !matches!(product.dtype, DType::F32 | DType::BF16)
                || !same_dtype_operands
                || !stays_last
                || node.shape.numel() == 0
                || readers[d] != 1
                || splat[d]
                || splat[p]
                || !self.materialised(p)
                || self.group_of[d].is_some()
            {
                continue;
            }
            // Axis `perm[j]` of the product is axis `j` of the permute.
            let contiguous = contiguous_strides(node.shape.dims());
            let mut strides = vec![0; rank];
            for (j, &axis) in perm.iter().enumerate() {
                strides[axis] = contiguous[j];
            }
            self.stored_permuted[d] = Some(View { base: p, strides });
            self.computed_by[p] = Some(d);
        }
    }

    /// Where node `i`'s value is produced: where its group runs, or itself.
    pub fn position(&self, i: usize) -> usize {
        self.group_of[i].map_or(i, |g| self.groups[g].runs_at)
    }

    /// True when node `i` has a buffer of its own.
    pub fn materialised(&self, i: usize) -> bool {
        self.view[i].is_none()
            && !self.inlined[i]
            && self.stored_permuted[i].is_none()
            && self.group_of[i].is_none_or(|g| self.groups[g].outputs.contains(&i))
    }

    /// The node whose buffer holds the data a reader of `i` reads.
    pub fn resolve(&self, i: usize) -> usize {
        self.view[i].as_ref().map_or(i, |v| v.base)
    }

    /// The nodes whose buffers executing node `i` reads (empty for group
    /// members other than the last, which reads all of the group's inputs,
    /// and for a permute whose buffer its product computes).
    pub fn reads(&self, graph: &Graph, i: usize) -> Vec<usize> {
        if self.view[i].is_some() || self.inlined[i] || self.computed_by[i].is_some() {
            return Vec::new();
        }
        match self.group_of[i] {
            Some(g) if self.position(i) == i => self.groups[g].inputs.clone(),
            Some(_) => Vec::new(),
            None => graph.nodes[i].inputs.iter().map(|id| self.resolve(id.index())).collect(),
        }
    }
}

/// The ops a fused group never has as a member, as a pattern: the one
/// list `fusible`, `recomputable` and the backends' group lowering share.
/// A new `Op` is a compile error in each of them until it is either here
/// or handled by name.
macro_rules! never_fused {
    () => {
        $crate::ir::Op::Parameter(_)
            | $crate::ir::Op::Constant(_)
            | $crate::ir::Op::Iota { .. }
            | $crate::ir::Op::Reshape
            | $crate::ir::Op::Permute(_)
            | $crate::ir::Op::Expand
            | $crate::ir::Op::Slice { .. }
            | $crate::ir::Op::Concat { .. }
            | $crate::ir::Op::Pad { .. }
            | $crate::ir::Op::Gather { .. }
            | $crate::ir::Op::ScatterAdd { .. }
            | $crate::ir::Op::Dot { .. }
            | $crate::ir::Op::AllReduce(_)
            | $crate::ir::Op::StopGradient
    };
}
pub(crate) use never_fused;

/// True for the dtypes fused kernels compute in (f32 registers).
fn fusible_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::Bool)
}

/// True for an elementwise node the fused interpreter computes exactly.
fn fusible(graph: &Graph, i: usize, splat: &[bool]) -> bool {
    let node = &graph.nodes[i];
    if splat[i] || node.shape.numel() <= 1 || !fusible_dtype(node.dtype) {
        return false;
    }
    let input_dtypes: Vec<DType> = node.inputs.iter().map(|id| graph.nodes[id.index()].dtype).collect();
    match node.op {
        // bf16 arithmetic is f32 arithmetic rounded to bf16, as unfused.
        Op::Unary(_) | Op::Binary(_) => {
            matches!(node.dtype, DType::F32 | DType::BF16) && input_dtypes.iter().all(|&d| d == node.dtype)
        }
        Op::Compare(_) => input_dtypes.iter().all(|&d| fusible_dtype(d)),
        Op::Select => input_dtypes[0] == DType::Bool && input_dtypes[1..].iter().all(|&d| d == node.dtype),
        Op::Cast => fusible_dtype(input_dtypes[0]),
        // Drawn tile by tile from its seed (never stored when only fused
        // kernels read it).
        Op::RngUniform { .. } => node.dtype == DType::F32,
        // Reductions join groups as their rows' accumulators
        // (`absorb_reductions`), never as elementwise members.
        Op::Reduce { .. } => false,
        never_fused!() => false,
    }
}

/// A scalar constant's value, when node `i` is one (any shape: every element is equal).
pub fn immediate(graph: &Graph, i: usize) -> Option<f32> {
    let node = &graph.nodes[i];
    match (&node.op, node.dtype) {
        (Op::Constant(v), DType::F32) => Some(v.as_f64() as f32),
        (Op::Constant(v), DType::BF16) => Some(half::bf16::from_f64(v.as_f64()).to_f32()),
        (Op::Constant(v), DType::Bool) => Some(f32::from(u8::from(v.as_i64() != 0))),
        _ => None,
    }
}

/// Decide views and groups. `splat[i]` marks nodes the backend keeps as one
/// element.
pub fn plan(graph: &Graph, splat: &[bool]) -> Fusion {
    let n = graph.nodes.len();
    let fusible: Vec<bool> = (0..n).map(|i| fusible(graph, i, splat)).collect();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for id in &node.inputs {
            consumers[id.index()].push(i);
        }
    }
    let mut is_output = vec![false; n];
    for id in &graph.outputs {
        is_output[id.index()] = true;
    }
    let view = plan_views(graph, splat, &fusible, &consumers, &is_output);
    let mut fusion = Fusion { view, ..Fusion::none(n) };
    // Back to front: a node joins the group of its readers when they all
    // belong to that one group; otherwise it roots a group of its own.
    // A cheap node of stored values read by several groups is recomputed
    // in each of them instead of being stored and read back (and so is a
    // short chain of such nodes).
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut copies_in: Vec<Vec<usize>> = vec![Vec::new(); n];
    // A narrow copy kept for later readers is stored, not computed by them
    // (it then rides along in its input's kernel: `absorb_cast_epilogues`).
    let narrow_copy = crate::compile::narrow_copies(graph);
    let facts =
        NodeFacts { fusible: &fusible, consumers: &consumers, is_output: &is_output, narrow_copy: &narrow_copy };
    // A narrow copy that is its wide value's only reader (a bf16 matmul's
    // output under autocast, biased and rounded), where that value is an
    // elementwise one of its own (no view of another's buffer, no matmul
    // product), keeps no wide value alive: it may be computed by the group
    // of its first reader, as one more of that group's outputs, like any
    // other value.
    let kept_narrow: Vec<bool> = (0..n)
        .map(|i| {
            let wide = || graph.nodes[i].inputs[0].index();
            narrow_copy[i] && (consumers[wide()] != [i] || !fusible[wide()] || fusion.view[wide()].is_some())
        })
        .collect();
    for i in (0..n).rev() {
        if !fusible[i] {
            continue;
        }
        // The groups that read `i` (`None` when a reader is not fused), and
        // whether a reader is itself recomputed.
        let mut groups: Option<Vec<usize>> = Some(Vec::new());
        let mut reads_copy = false;
        for &c in &consumers[i] {
            match (&mut groups, fusible[c], copies_in[c].is_empty(), fusion.group_of[c]) {
                (Some(gs), true, false, _) => {
                    gs.extend(groups_computing(&fusion, &copies_in, c));
                    reads_copy = true;
                }
                (Some(gs), true, true, Some(g)) => gs.push(g),
                _ => groups = None,
            }
        }
        let groups = groups.filter(|_| !kept_narrow[i]).map(|mut gs| {
            gs.sort_unstable();
            gs.dedup();
            gs
        });
        match groups {
            Some(gs) if gs.len() == 1 && !reads_copy => {
                members[gs[0]].push(i);
                fusion.group_of[i] = Some(gs[0]);
            }
            // Four levels deep: GELU's CDF is four ops from its bias add.
            Some(gs) if !gs.is_empty() && recomputable(graph, &fusion, &facts, i, 4) => {
                for &g in &gs {
                    members[g].push(i);
                }
                copies_in[i] = gs;
            }
            _ => match recomputed_beside_row_reductions(graph, &fusion, &facts, &copies_in, i) {
                Some(gs) if !narrow_copy[i] => {
                    // A group of its own for the reductions to join, which
                    // stores only them; every other reader computes it again.
                    members.push(vec![i]);
                    fusion.group_of[i] = Some(members.len() - 1);
                    for &g in &gs {
                        members[g].push(i);
                    }
                    copies_in[i] = gs;
                }
                _ => match first_reader_group(&fusion, &members, &consumers[i], &copies_in, kept_narrow[i]) {
                    Some(g) => {
                        members[g].push(i);
                        fusion.group_of[i] = Some(g);
                    }
                    None => {
                        members.push(vec![i]);
                        fusion.group_of[i] = Some(members.len() - 1);
                    }
                },
            },
        }
    }
    for group in members.iter_mut() {
        group.reverse();
    }
    let runs_at = absorb_cast_epilogues(graph, &mut members, &fusion, &consumers);
    let (reduce_inner, column_len) = absorb_reductions(graph, &mut members, &runs_at, &fusion);
    // Build kernels; a lone member that reads no view runs its own kernel.
    let mut final_of = vec![None; n];
    for (((group, runs_at), reduce_inner), column_len) in
        members.into_iter().zip(runs_at).zip(reduce_inner).zip(column_len)
    {
        if group.is_empty() {
            continue;
        }
        let reads_view =
            group.iter().any(|&m| graph.nodes[m].inputs.iter().any(|id| fusion.view[id.index()].is_some()));
        if group.len() == 1 && !reads_view {
            continue;
        }
        let mut built = describe_group(graph, &fusion, &group, &consumers, &is_output, &copies_in, splat);
        built.runs_at = runs_at;
        built.reduce_inner = reduce_inner;
        built.column_len = column_len;
        for &m in &built.members {
            final_of[m] = Some(fusion.groups.len());
        }
        fusion.groups.push(built);
    }
    fusion.group_of = final_of;
    for i in 0..n {
        fusion.inlined[i] = immediate(graph, i).is_some()
            && !is_output[i]
            && !consumers[i].is_empty()
            && consumers[i].iter().all(|&c| fusion.group_of[c].is_some() || fusion.view[c].is_some());
    }
    fusion
}

/// The group a node read by several kernels joins as one more stored
/// output (multi-output fusion): the fused group of its readers that runs
/// first, when every other reader runs after that group. The value is then
/// computed where its first reader needs it, from operands that group may
/// already load, instead of by a kernel of its own that reads them once
/// more (e.g. a GELU's saved CDF, computed beside the activation that uses
/// it; a dropout mask, drawn beside the forward product that applies it).
/// `members[g]` lists group `g` back to front (its root, where it runs,
/// first); a reader that several groups compute counts as read by each of
/// them. None for views' readers and narrow copies kept for later readers
/// (`kept_narrow`).
fn first_reader_group(
    fusion: &Fusion,
    members: &[Vec<usize>],
    readers: &[usize],
    copies_in: &[Vec<usize>],
    kept_narrow: bool,
) -> Option<usize> {
    if kept_narrow || readers.iter().any(|&c| fusion.view[c].is_some()) {
        return None;
    }
    let root = |g: usize| members[g][0];
    let first = readers.iter().flat_map(|&c| groups_computing(fusion, copies_in, c)).min_by_key(|&g| root(g))?;
    let runs_after = |c: usize| match groups_computing(fusion, copies_in, c)[..] {
        [] => c > root(first),
        ref groups => groups.iter().all(|&g| g == first || root(g) > root(first)),
    };
    readers.iter().all(|&c| runs_after(c)).then_some(first)
}

/// The groups that compute node `c`: its own group, and each group that
/// computes it again (a widening cast of a bf16 value; a value whose own
/// group holds its row reductions, see [`recomputed_beside_row_reductions`]).
fn groups_computing(fusion: &Fusion, copies_in: &[Vec<usize>], c: usize) -> Vec<usize> {
    copies_in[c].iter().copied().chain(fusion.group_of[c]).collect()
}

/// The groups of node `i`'s other readers, when `i` is read by f32 row
/// reductions of one row length (which join a group of `i`'s own, see
/// [`absorb_reductions`]) and by fused groups, and is cheap to compute
/// again from stored operands: each of those groups then computes `i`
/// itself and `i` is never stored (the biased vocabulary logits: their row
/// maximum is taken beside them, the exponentials recompute them).
fn recomputed_beside_row_reductions(
    graph: &Graph,
    fusion: &Fusion,
    facts: &NodeFacts,
    copies_in: &[Vec<usize>],
    i: usize,
) -> Option<Vec<usize>> {
    if graph.nodes[i].dtype != DType::F32 || !recomputable(graph, fusion, facts, i, 0) {
        return None;
    }
    let mut groups = Vec::new();
    let mut inner = None;
    for &c in &facts.consumers[i] {
        let node = &graph.nodes[c];
        match trailing_rows(graph, c) {
            Some(rows) if node.dtype == DType::F32 && node.inputs.len() == 1 => {
                if inner.is_some_and(|r| r != rows) {
                    return None;
                }
                inner = Some(rows);
            }
            _ if facts.fusible[c] && copies_in[c].is_empty() => groups.push(fusion.group_of[c]?),
            _ => return None,
        }
    }
    groups.sort_unstable();
    groups.dedup();
    (inner.is_some() && !groups.is_empty()).then_some(groups)
}

/// What [`recomputable`] knows of every node.
struct NodeFacts<'a> {
    fusible: &'a [bool],
    consumers: &'a [Vec<usize>],
    is_output: &'a [bool],
    narrow_copy: &'a [bool],
}

/// True when node `i` (read by several groups) is worth computing again in
/// each of them: one cheap elementwise op of at most one full-size value (the
/// others immediates or broadcasts), each of which has a buffer anyway or
/// is itself such an op (up to `depth` more levels). Each copy then reads
/// those buffers instead of `i`'s own, which is never written (one memory
/// pass and one kernel fewer, and the value is not kept alive, e.g. from
/// the forward pass to the backward). A narrow copy (a bf16 copy kept for
/// later readers, see [`crate::compile::narrow_copies`]) counts as stored:
/// its widening casts are recomputed from it, so the narrow value is what
/// is stored, not a wide one (a narrow copy that joins a group is one of
/// its outputs when such a reader lies in another group).
fn recomputable(graph: &Graph, fusion: &Fusion, facts: &NodeFacts, i: usize, depth: usize) -> bool {
    let node = &graph.nodes[i];
    // Exp, log and tanh cost more to recompute (~1-2.5 ns an element here)
    // than their value costs to store and read back. Erf is recomputed:
    // GELU's gradient reads the product and the bias anyway, and computing
    // the CDF again from them (one erf an element, a vector loop of its own,
    // see `kernels::numeric_avx512`) beat storing it in the forward pass and
    // reading it back (BERT-mini: 16 MB a layer; 50 MB less peak memory).
    let cheap = match node.op {
        Op::Unary(op) => !matches!(op, UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh),
        Op::Cast | Op::Binary(_) | Op::Compare(_) => true,
        Op::Select | Op::RngUniform { .. } | Op::Reduce { .. } => false,
        never_fused!() => false,
    };
    let sources: Vec<usize> =
        node.inputs.iter().map(|id| id.index()).filter(|&x| immediate(graph, fusion.resolve(x)).is_none()).collect();
    let broadcast =
        |x: usize| graph.nodes[x].shape.numel() == 1 || fusion.view[x].as_ref().is_some_and(|v| v.strides.contains(&0));
    let full_size = sources.iter().filter(|&&x| !broadcast(x)).count();
    let stored = |x: usize| {
        !facts.fusible[x]
            || fusion.view[x].is_some()
            || facts.is_output[x]
            || facts.consumers[x].len() > 1
            || facts.narrow_copy[x]
    };
    let available = |x: usize| stored(x) || (depth > 0 && recomputable(graph, fusion, facts, x, depth - 1));
    // Never trade a narrow value (a bool mask, a bf16 copy) for keeping a
    // wider one alive.
    let no_wider = |x: usize| graph.nodes[x].dtype.size_in_bytes() <= node.dtype.size_in_bytes();
    cheap
        && !sources.is_empty()
        && full_size <= 1
        && sources.iter().all(|&x| available(x) && no_wider(x) && graph.nodes[x].shape == node.shape)
        && !facts.is_output[i]
}

/// Move a cast that would run alone (its readers are matmuls or other
/// groups) into the group computing its input, as one more output: the
/// value is converted while it is still in a register instead of being read
/// back from memory. The group keeps running where it ran, so the cast's
/// readers must all come after that point. `members` are ascending per
/// group; absorbed casts leave empty groups. Returns where each group runs.
fn absorb_cast_epilogues(
    graph: &Graph,
    members: &mut [Vec<usize>],
    fusion: &Fusion,
    consumers: &[Vec<usize>],
) -> Vec<usize> {
    let runs_at: Vec<usize> = members.iter().map(|m| m.last().copied().unwrap_or(0)).collect();
    let mut group_of: Vec<Option<usize>> = fusion.group_of.clone();
    for gc in 0..members.len() {
        let [c] = members[gc][..] else { continue };
        let node = &graph.nodes[c];
        let reads_view = node.inputs.iter().any(|id| fusion.view[id.index()].is_some());
        if node.op != Op::Cast || reads_view {
            continue;
        }
        let p = node.inputs[0].index();
        let Some(g) = group_of[p].filter(|&g| g != gc && !members[g].is_empty()) else { continue };
        if !consumers[c].iter().all(|&r| r > runs_at[g]) {
            continue;
        }
        let at = members[g].partition_point(|&m| m < c);
        members[g].insert(at, c);
        members[gc].clear();
        group_of[c] = Some(g);
    }
    runs_at
}

/// The row length a reduction over trailing axes reduces (`None` for any
/// other reduction, or a row of one element).
fn trailing_rows(graph: &Graph, r: usize) -> Option<usize> {
    let node = &graph.nodes[r];
    let Op::Reduce { axes, .. } = &node.op else { return None };
    let dims = graph.nodes[node.inputs[0].index()].shape.dims();
    let k = axes.len();
    let trailing = k > 0 && axes.iter().enumerate().all(|(i, &a)| a == dims.len() - k + i);
    let inner: usize = dims[dims.len() - k..].iter().product();
    (trailing && inner > 1).then_some(inner)
}

/// The column length of a sum over leading axes (`None` for any other
/// reduction, or a sum over one row).
fn leading_columns(graph: &Graph, r: usize) -> Option<usize> {
    let node = &graph.nodes[r];
    let Op::Reduce { op: ReduceOp::Sum, axes } = &node.op else { return None };
    let dims = graph.nodes[node.inputs[0].index()].shape.dims();
    let k = axes.len();
    let leading = k > 0 && k < dims.len() && axes.iter().enumerate().all(|(i, &a)| a == i);
    let outer: usize = dims[..k].iter().product();
    (leading && outer > 1).then(|| dims[k..].iter().product())
}

/// Reduce a group member in the group's own kernel: an f32 sum or max over
/// trailing axes (rows), or an f32 sum over leading axes (columns), whose
/// input is computed by a group that runs before it becomes one more
/// output of that group, accumulated tile by tile in the unfused kernel's
/// order (bit-identical), so the input is not read back from memory (nor
/// stored at all when nothing else reads it): a bias gradient is summed
/// while the gradient it sums is computed. Returns each group's row length
/// and column length (0: none).
fn absorb_reductions(
    graph: &Graph,
    members: &mut [Vec<usize>],
    runs_at: &[usize],
    fusion: &Fusion,
) -> (Vec<usize>, Vec<usize>) {
    let mut inner_of = vec![0usize; members.len()];
    let mut columns_of = vec![0usize; members.len()];
    let mut owner: Vec<Option<usize>> = vec![None; graph.nodes.len()];
    for (g, group) in members.iter().enumerate() {
        for &m in group {
            owner[m] = Some(g);
        }
    }
    for (r, node) in graph.nodes.iter().enumerate() {
        let (rows, columns) = (trailing_rows(graph, r), leading_columns(graph, r));
        if rows.is_none() && columns.is_none() {
            continue;
        }
        let p = node.inputs[0].index();
        let Some(g) = owner[p] else { continue };
        let f32s = node.dtype == DType::F32 && graph.nodes[p].dtype == DType::F32;
        if !f32s || fusion.view[p].is_some() || runs_at[g] >= r {
            continue;
        }
        match (rows, columns) {
            (Some(inner), _) if columns_of[g] == 0 && (inner_of[g] == 0 || inner_of[g] == inner) => {
                inner_of[g] = inner;
            }
            (_, Some(len)) if inner_of[g] == 0 && (columns_of[g] == 0 || columns_of[g] == len) => {
                columns_of[g] = len;
            }
            _ => continue,
        }
        members[g].push(r);
    }
    (inner_of, columns_of)
}

/// Which `reshape`/`expand`/`permute` nodes become views: every reader is
/// fusible (or another view) and the index map is a stride pattern.
fn plan_views(
    graph: &Graph,
    splat: &[bool],
    fusible: &[bool],
    consumers: &[Vec<usize>],
    is_output: &[bool],
) -> Vec<Option<View>> {
    let n = graph.nodes.len();
    let candidate = |i: usize| {
        let node = &graph.nodes[i];
        matches!(node.op, Op::Reshape | Op::Expand | Op::Permute(_))
            && !splat[i]
            && !is_output[i]
            && (fusible_dtype(node.dtype) || matches!(node.dtype, DType::I64 | DType::I32))
            && node.shape.numel() > 1
    };
    // Readers only: fusible nodes, matmuls (which take strided operands),
    // reductions and concatenations (which read a reshape of contiguous
    // data as the data itself) or other candidates (decided back to front).
    // Gathers and scatters read their index operand (only) through a view:
    // an embedding's row ids broadcast along the hidden axis are never
    // materialised.
    let reads_views = |i: usize, c: usize| {
        let node = &graph.nodes[c];
        let index_only = || node.inputs.iter().enumerate().all(|(k, id)| (k == 1) == (id.index() == i));
        fusible[c]
            || matches!(node.op, Op::Dot { .. } | Op::Reduce { .. } | Op::Concat { .. })
            || (matches!(node.op, Op::Gather { .. } | Op::ScatterAdd { .. }) && index_only())
    };
    let mut keep = vec![false; n];
    for i in (0..n).rev() {
        keep[i] = candidate(i) && consumers[i].iter().all(|&c| reads_views(i, c) || keep[c]);
    }
    let mut view: Vec<Option<View>> = vec![None; n];
    // Until nothing changes: a candidate that is no view because its input
    // is one (a reshape of permuted heads) is tried again once that input
    // has to have a buffer (it is then a view of that buffer, not a second
    // copy); `needs_buffer` only grows, so this ends.
    let candidates = keep.clone();
    let mut needs_buffer = vec![false; n];
    loop {
        let before = keep.clone();
        for i in 0..n {
            if !candidates[i] || needs_buffer[i] {
                view[i] = None;
                continue;
            }
            view[i] = view_of(graph, &view, splat, i);
            keep[i] = view[i].is_some();
        }
        // A view read by a node that is no longer a view must have a buffer.
        for i in (0..n).rev() {
            // Reductions and concatenations take only views that are the
            // base's own layout (a reshape of contiguous data: they read
            // their inputs as contiguous); matmuls also take views whose matrices have a
            // unit-stride axis (split heads), which they pack as fast as a
            // copy would be made, but no other strides (slower to pack).
            let own_layout =
                || view[i].as_ref().is_some_and(|v| v.strides == contiguous_strides(graph.nodes[i].shape.dims()));
            let dot_ok = |c: usize| match graph.nodes[c].op {
                Op::Dot { .. } => own_layout() || view[i].as_ref().is_some_and(|v| unit_stride_matrices(&v.strides)),
                Op::Reduce { .. } | Op::Concat { .. } => own_layout(),
                _ => true,
            };
            if keep[i] && !consumers[i].iter().all(|&c| (reads_views(i, c) && dot_ok(c)) || keep[c]) {
                keep[i] = false;
                needs_buffer[i] = true;
            }
        }
        if keep == before {
            break;
        }
    }
    for i in 0..n {
        if !keep[i] {
            view[i] = None;
        }
    }
    view
}

/// True when a view's trailing two axes (its matrices, for a matmul) are
/// rows or columns of unit stride and no axis broadcasts: a permutation of
/// heads (`[b, s, h, d]` read as `[b, h, s, d]`) is packed by the matmul
/// as fast as a copy would be, so the copy is skipped.
fn unit_stride_matrices(strides: &[usize]) -> bool {
    let rank = strides.len();
    rank >= 2 && strides.iter().all(|&s| s > 0) && (strides[rank - 1] == 1 || strides[rank - 2] == 1)
}

/// The index map of view candidate `i` over its input's data, if it is a stride pattern.
fn view_of(graph: &Graph, view: &[Option<View>], splat: &[bool], i: usize) -> Option<View> {
    let node = &graph.nodes[i];
    let input = node.inputs[0].index();
    let in_dims = graph.nodes[input].shape.dims();
    let out_dims = node.shape.dims();
    let (base, strides) = match &view[input] {
        Some(v) => (v.base, v.strides.clone()),
        None if splat[input] || graph.nodes[input].shape.numel() == 1 => (input, vec![0; in_dims.len()]),
        None => (input, contiguous_strides(in_dims)),
    };
    let strides = match &node.op {
        Op::Expand => strides
            .iter()
            .zip(in_dims.iter().zip(out_dims))
            .map(|(&s, (&a, &b))| if a == 1 && b != 1 { 0 } else { s })
            .collect(),
        Op::Permute(perm) => perm.iter().map(|&p| strides[p]).collect(),
        Op::Reshape if strides.iter().all(|&s| s == 0) => vec![0; out_dims.len()],
        Op::Reshape if strides == contiguous_strides(in_dims) => contiguous_strides(out_dims),
        _ => return None,
    };
    Some(View { base, strides })
}

/// Describe a group's data flow: its inputs and loads, where each member
/// reads its operands, and which members are stored (read outside the
/// group, or graph outputs).
fn describe_group(
    graph: &Graph,
    fusion: &Fusion,
    members: &[usize],
    consumers: &[Vec<usize>],
    is_output: &[bool],
    copies_in: &[Vec<usize>],
    splat: &[bool],
) -> Group {
    let member = |x: usize| members.binary_search(&x).is_ok();
    let shape = graph.nodes[members[0]].shape.dims().to_vec();
    let contiguous = contiguous_strides(&shape);
    let mut inputs: Vec<usize> = Vec::new();
    let mut loads: Vec<Load> = Vec::new();
    let mut reads = Vec::with_capacity(members.len());
    let mut outputs = Vec::new();
    for &m in members {
        let node = &graph.nodes[m];
        let operands: Vec<MemberRead> = if matches!(node.op, Op::RngUniform { .. }) {
            // A random draw's only input is its seed, which it reads itself.
            vec![MemberRead::Seed(index_of(&mut inputs, fusion.resolve(node.inputs[0].index())))]
        } else {
            node.inputs
                .iter()
                .map(|id| {
                    let x = id.index();
                    if member(x) {
                        return MemberRead::Member(x);
                    }
                    if let Some(v) = immediate(graph, fusion.resolve(x)) {
                        return MemberRead::Immediate(v);
                    }
                    let (base, strides) = match &fusion.view[x] {
                        Some(v) => (v.base, v.strides.clone()),
                        None => (x, contiguous.clone()),
                    };
                    let access = if splat[base] || graph.nodes[base].shape.numel() == 1 {
                        Access::Splat
                    } else if strides == contiguous {
                        Access::Contiguous
                    } else {
                        Access::Strided(strides)
                    };
                    let input = index_of(&mut inputs, base);
                    MemberRead::Load(index_of(&mut loads, Load { input, access }))
                })
                .collect()
        };
        reads.push(operands);
        // A recomputed member's readers in other groups compute it
        // themselves; a reader that other groups compute too reads the
        // member there.
        let read_elsewhere = |c: usize| !member(c) || groups_computing(fusion, copies_in, c).len() > 1;
        let read_outside = copies_in[m].is_empty() && (consumers[m].iter().any(|&c| read_elsewhere(c)) || is_output[m]);
        if read_outside {
            outputs.push(m);
        }
    }
    let contiguous_inputs = (0..inputs.len())
        .filter(|&k| {
            let mut reads = loads.iter().filter(|l| l.input == k).peekable();
            reads.peek().is_some() && reads.all(|l| l.access == Access::Contiguous)
        })
        .map(|k| inputs[k])
        .collect();
    Group {
        members: members.to_vec(),
        runs_at: *members.last().expect("groups are not empty"),
        outputs,
        inputs,
        contiguous_inputs,
        loads,
        reads,
        shape,
        reduce_inner: 0,
        column_len: 0,
    }
}

/// The position of `item` in `list`, appended if absent.
fn index_of<T: PartialEq>(list: &mut Vec<T>, item: T) -> usize {
    list.iter().position(|x| *x == item).unwrap_or_else(|| {
        list.push(item);
        list.len() - 1
    })
}
