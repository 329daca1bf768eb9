//! The CPU backend: lowers a schedule into a flat list of kernel calls over
//! its planned buffers, with fused elementwise kernels in tile bytecode and
//! `gemm` (f32) or AVX-512 BF16 (bf16) matmuls.

mod executable;
mod heads;
mod program;
mod warm;

use super::{Backend, Executable};
use crate::collective::RunContext;
use crate::error::{Error, Result};
use crate::ir::{Graph, Node};
use crate::kernels::fused::FusedProgram;
use crate::schedule::{self, Capabilities, ChainRead, HeadRead, MemoryPlan, Operand, Schedule};
use crate::shape::Shape;
use crate::storage::Buffer;
use executable::{LastRun, SlotPool};
use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Runs graphs on the host CPU: one instance per device, with the device's
/// kernel threads and its record of the executable that ran last (whose
/// intermediate buffers it keeps or frees). Executables it lowers may run
/// on any CPU backend (replicas share a compile cache).
#[derive(Clone)]
pub struct CpuBackend {
    fuse: bool,
    /// Run matmul epilogues on each row panel of the product (see
    /// [`schedule::epilogue`]).
    epilogues: bool,
    /// Run row chains a block of rows at a time (see [`schedule::chain`])
    /// when a step of the chain computes at least this many elements
    /// (`usize::MAX`: never).
    row_chains_from: usize,
    /// Run the fused programs the kernels recognise (GELU's) by their own
    /// loops instead of instruction by instruction.
    fast_paths: bool,
    /// Run head chains a head at a time (see [`schedule::heads`]) when a
    /// matmul of the chain computes at least this many elements
    /// (`usize::MAX`: never).
    head_chains_from: usize,
    /// Store batched products straight into the permute that reads them
    /// (see [`schedule::Fusion::store_products_permuted`]).
    permuted_products: bool,
    /// The kernel threads (`None`: rayon's global pool, all cores).
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Keep the pool's threads awake while a run lasts (see [`warm`]).
    keep_warm: bool,
    last_run: Arc<LastRun>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let threads = self.pool.as_ref().map_or(rayon::current_num_threads(), |p| p.current_num_threads());
        write!(
            f,
            "CpuBackend {{ fuse: {}, epilogues: {}, row_chains_from: {}, head_chains_from: {}, permuted_products: {}, fast_paths: {}, threads: {threads} }}",
            self.fuse, self.epilogues, self.row_chains_from, self.head_chains_from, self.permuted_products, self.fast_paths
        )
    }
}

impl Default for CpuBackend {
    /// Fusion on, unless `LAZYTRAIN_FUSION=0`, matmul epilogues on, unless
    /// `LAZYTRAIN_EPILOGUES=0`, row chains on, unless
    /// `LAZYTRAIN_ROW_CHAINS=0`, head chains on, unless
    /// `LAZYTRAIN_HEAD_CHAINS=0`, products stored into their permutes, unless
    /// `LAZYTRAIN_PERMUTED_PRODUCTS=0`, and the recognised programs' own loops on,
    /// unless `LAZYTRAIN_FAST_PATHS=0` (all for A/B measurements); the
    /// kernels run in rayon's global pool.
    fn default() -> CpuBackend {
        CpuBackend::with_fusion(switched_on("LAZYTRAIN_FUSION"))
            .with_epilogues(switched_on("LAZYTRAIN_EPILOGUES"))
            .with_row_chains(switched_on("LAZYTRAIN_ROW_CHAINS").then_some(ROW_CHAINS_FROM))
            .with_head_chains(switched_on("LAZYTRAIN_HEAD_CHAINS").then_some(HEAD_CHAINS_FROM))
            .with_permuted_products(switched_on("LAZYTRAIN_PERMUTED_PRODUCTS"))
            .with_fast_paths(switched_on("LAZYTRAIN_FAST_PATHS"))
    }
}

/// An A/B switch of the environment: on unless the variable `name` is `0`.
fn switched_on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

impl CpuBackend {
    /// A backend that fuses elementwise chains (and folds views into their
    /// loads) when `fuse`, running in rayon's global pool.
    pub fn with_fusion(fuse: bool) -> CpuBackend {
        let row_chains_from = if fuse { ROW_CHAINS_FROM } else { usize::MAX };
        CpuBackend {
            fuse,
            epilogues: fuse,
            row_chains_from,
            head_chains_from: if fuse { HEAD_CHAINS_FROM } else { usize::MAX },
            permuted_products: fuse,
            fast_paths: fuse,
            pool: None,
            keep_warm: false,
            last_run: Arc::default(),
        }
    }

    /// A backend with a thread pool of its own, `threads` threads: a step
    /// runs on a pool thread, so splitting a kernel wakes one other thread
    /// instead of handing both halves to a shared pool while the caller
    /// sleeps (5–8 % faster steps on 2 cores). While a step runs, the
    /// other threads stay awake between kernels (`backend/cpu/warm.rs`) unless
    /// `LAZYTRAIN_KEEP_WARM=0`. Fails when the operating system refuses a
    /// thread.
    pub fn with_threads(threads: usize) -> Result<CpuBackend> {
        static NEXT_POOL: AtomicUsize = AtomicUsize::new(0);
        let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(move |i| format!("lazytrain-cpu{id}-kernel-{i}"))
            .build()
            .map_err(|e| Error::Execution {
                node: 0,
                op: "device",
                detail: format!("could not start {threads} kernel threads: {e}"),
            })?;
        Ok(CpuBackend {
            pool: Some(Arc::new(pool)),
            keep_warm: switched_on("LAZYTRAIN_KEEP_WARM"),
            ..CpuBackend::default()
        })
    }

    /// The same backend with matmul epilogues on or off (with fusion off
    /// there are none).
    pub fn with_epilogues(self, epilogues: bool) -> CpuBackend {
        CpuBackend { epilogues: epilogues && self.fuse, ..self }
    }

    /// The same backend running row chains whose largest step computes at
    /// least `from` elements (`None`: none; with fusion off there are none).
    pub fn with_row_chains(self, from: Option<usize>) -> CpuBackend {
        CpuBackend { row_chains_from: from.filter(|_| self.fuse).unwrap_or(usize::MAX), ..self }
    }

    /// The same backend running head chains a head at a time where a
    /// matmul of the chain computes at least `from` elements, their steps
    /// one after the other elsewhere (`None`: everywhere; the same bits
    /// either way; with fusion off there are none).
    pub fn with_head_chains(self, from: Option<usize>) -> CpuBackend {
        CpuBackend { head_chains_from: from.filter(|_| self.fuse).unwrap_or(usize::MAX), ..self }
    }

    /// The same backend storing batched products straight into the layout
    /// of the permute that reads them, or computing each permute by a copy
    /// (the same bits either way; with fusion off, always a copy).
    pub fn with_permuted_products(self, permuted_products: bool) -> CpuBackend {
        CpuBackend { permuted_products: permuted_products && self.fuse, ..self }
    }

    /// The same backend running the fused programs the kernels recognise
    /// (GELU's, AdamW's) by their own loops and straight-line programs as
    /// lane programs, or every program instruction by instruction over
    /// tiles (the same bits either way).
    pub fn with_fast_paths(self, fast_paths: bool) -> CpuBackend {
        CpuBackend { fast_paths: fast_paths && self.fuse, ..self }
    }

    /// True when the backend fuses elementwise chains.
    pub fn fuses(&self) -> bool {
        self.fuse
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
        /// Element strides a product is stored with in its permute's slot
        /// (`None`: contiguous).
        out_strides: Option<Vec<usize>>,
    },
    /// A fused group: input `j` is read from output `alias[j]` when that
    /// output overwrites it in place.
    Fused { program: FusedProgram, outputs: Vec<usize>, alias: Vec<Option<usize>> },
    /// A matmul (a `Primitive` step) and its epilogue (a `Fused` step, whose
    /// input `product_input` is the product), run panel by panel.
    Epilogue { product: Box<Step>, epilogue: Box<Step>, product_input: usize },
    /// Fused groups (`Fused` steps) run a block of `rows` rows at a time,
    /// each in turn; `reads[m][j]` says how member `m` reads input `j`.
    Chain { members: Vec<Step>, reads: Vec<Vec<ChainRead>>, rows: usize },
    /// Steps over `batch` matrices (matmuls and unary ops as `Primitive`
    /// steps, `Fused` groups) run a matrix at a time, each in turn;
    /// `reads[m][j]` says how member `m` reads input `j`. The `deferred`
    /// steps run after the last matrix, in order.
    Heads { members: Vec<Step>, reads: Vec<Vec<HeadRead>>, batch: usize, deferred: Vec<Step> },
}

/// One kernel call.
pub(super) struct Step {
    node_index: usize,
    kernel: Kernel,
    inputs: Vec<Operand>,
    /// What the profile report calls this kernel (op and shapes).
    label: String,
}

impl Step {
    /// The single kernels this step runs: itself, or a matmul and its epilogue.
    fn parts(&self) -> Vec<&Step> {
        match &self.kernel {
            Kernel::Epilogue { product, epilogue, .. } => vec![product, epilogue],
            Kernel::Chain { members, .. } => members.iter().collect(),
            Kernel::Heads { members, deferred, .. } => {
                members.iter().chain(deferred.iter().flat_map(Step::parts)).collect()
            }
            Kernel::Primitive { .. } | Kernel::Fused { .. } => vec![self],
        }
    }
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
        Capabilities { fuse: self.fuse, splat: true, in_place: true, permuted_products: self.permuted_products }
    }

    fn execute(
        &self,
        executable: &dyn Executable,
        inputs: Vec<Arc<Buffer>>,
        context: &RunContext,
    ) -> Result<Vec<Arc<Buffer>>> {
        let any: &(dyn Any + Send + Sync) = executable;
        let run = || match any.downcast_ref::<CpuExecutable>() {
            Some(cpu) => cpu.run_on(inputs, context, Some(&self.last_run)),
            None => executable.run(inputs, context),
        };
        match &self.pool {
            Some(pool) if self.keep_warm && pool.current_num_threads() > 1 => warm::run_on_first_thread(pool, run),
            Some(pool) => pool.install(run),
            None => run(),
        }
    }

    fn lower(&self, schedule: &Schedule) -> Result<Arc<dyn Executable>> {
        let graph = schedule.graph;
        let mut steps = Vec::with_capacity(schedule.steps.len());
        let heads: Vec<&schedule::HeadChain> =
            schedule.head_chains.iter().filter(|c| runs_by_heads(schedule, c, self.head_chains_from)).collect();
        // Epilogues and row chains yield to a head chain that takes one of their steps.
        let in_heads = |k: usize| heads.iter().any(|c| c.span().contains(&k));
        let pairs: Vec<&schedule::Epilogue> = schedule
            .epilogues
            .iter()
            .filter(|e| self.epilogues && panels_stay_cached(graph, schedule, e))
            .filter(|e| !in_heads(e.product_step) && !in_heads(e.product_step + 1))
            .collect();
        // A chain yields to an epilogue that takes one of its steps.
        let paired = |k: usize| pairs.iter().any(|e| e.product_step == k || e.product_step + 1 == k);
        let chains: Vec<&schedule::RowChain> = schedule
            .row_chains
            .iter()
            .filter(|c| {
                let span = c.first..c.first + c.reads.len();
                let largest = span.clone().map(|k| elements(schedule, k)).max().unwrap_or(0);
                largest >= self.row_chains_from && !span.clone().any(paired) && !span.clone().any(in_heads)
            })
            .collect();
        let mut heads = heads.into_iter().peekable();
        let mut chains = chains.into_iter().peekable();
        let mut pairs = pairs.into_iter().peekable();
        let mut k = 0;
        while k < schedule.steps.len() {
            if let Some(chain) = heads.next_if(|c| c.span().start == k) {
                let lower = |m: &usize| lower_step(graph, schedule, &schedule.steps[*m], self.fast_paths);
                let members: Vec<Step> = chain.members.iter().map(lower).collect();
                let labels: Vec<&str> = members.iter().map(|m| m.label.as_str()).collect();
                steps.push(Step {
                    node_index: members.last().map_or(0, |m| m.node_index),
                    label: format!("head chain: {}", labels.join(" | ")),
                    inputs: Vec::new(),
                    kernel: Kernel::Heads {
                        reads: chain.reads.clone(),
                        batch: chain.batch,
                        deferred: chain.deferred.iter().map(lower).collect(),
                        members,
                    },
                });
                k = chain.span().end;
                continue;
            }
            if let Some(chain) = chains.next_if(|c| c.first == k) {
                let members: Vec<Step> = (k..k + chain.reads.len())
                    .map(|m| lower_step(graph, schedule, &schedule.steps[m], self.fast_paths))
                    .collect();
                let labels: Vec<&str> = members.iter().map(|m| m.label.as_str()).collect();
                steps.push(Step {
                    node_index: members.last().map_or(0, |m| m.node_index),
                    label: format!("row chain: {}", labels.join(" | ")),
                    inputs: Vec::new(),
                    kernel: Kernel::Chain { members, reads: chain.reads.clone(), rows: chain.rows },
                });
                k += chain.reads.len();
                continue;
            }
            let step = lower_step(graph, schedule, &schedule.steps[k], self.fast_paths);
            match pairs.next_if(|e| e.product_step == k) {
                Some(e) => {
                    let epilogue = lower_step(graph, schedule, &schedule.steps[k + 1], self.fast_paths);
                    steps.push(Step {
                        node_index: epilogue.node_index,
                        label: format!("{} + epilogue {}", step.label, epilogue.label),
                        inputs: Vec::new(),
                        kernel: Kernel::Epilogue {
                            product: Box::new(step),
                            epilogue: Box::new(epilogue),
                            product_input: e.product_input,
                        },
                    });
                    k += 2;
                }
                None => {
                    steps.push(step);
                    k += 1;
                }
            }
        }
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

/// Row chains run a block of rows at a time only where a step computes at
/// least this many elements (8 MB of f32): attention's softmax, dropout and
/// their gradients over `[batch, heads, 128, 128]` (2 Mi elements in
/// BERT-mini and -small), the masked-LM head's `[rows, vocabulary]`
/// log-softmax and the dense head's. Measured on a 2-core AMD Zen 4
/// (`LAZYTRAIN_PROFILE`, fused and chained kernels per six steps, two
/// rounds): BERT-tiny 137 / 148 → 114 / 121 ms, mini
/// 392 / 398 → 347 / 353 ms, small 616 / 641 → 574 / 596 ms, small bf16
/// 627 / 656 → 618 / 623 ms, GPT-2 mini and BERT-base within the noise.
/// From 1 Mi elements (LayerNorm's chains too) it was no better; from 16 Mi,
/// the earlier threshold, only the dense head's log-softmax ran by blocks
/// (set when attention's chains measured no faster, on a Zen 5 with the
/// kernels of issue 23's sixth slice). The values are the same bits either
/// way.
const ROW_CHAINS_FROM: usize = 1 << 21;

/// Head chains run a head at a time only where a matmul of the chain
/// computes at least this many elements: attention's `[batch, heads, seq,
/// seq]` scores and their gradients (1 Mi elements in BERT-tiny, 2 Mi in
/// BERT-mini and -small, whose steps then no longer fit the caches).
const HEAD_CHAINS_FROM: usize = 1 << 20;

/// True when the CPU runs head chain `c` a head at a time: its matmuls and
/// unary ops are f32, each of its matmuls' matrices runs on one thread (as
/// it does outside the chain; checked again when it runs, on the pool that
/// runs it), and one of its matmuls computes at least `from` elements.
fn runs_by_heads(schedule: &Schedule, c: &schedule::HeadChain, from: usize) -> bool {
    let graph = schedule.graph;
    let mut largest = 0;
    for &m in &c.members {
        let schedule::Step::Node { node, .. } = &schedule.steps[m] else { continue };
        let node = &graph.nodes[*node];
        if node.dtype != crate::dtype::DType::F32 {
            return false;
        }
        if let Some(macs) = crate::kernels::dot_matrix_macs(node, graph.node(node.inputs[0]).shape.dims()) {
            if !crate::kernels::dot::matrices_run_alone(macs) {
                return false;
            }
            largest = largest.max(node.shape.numel());
        }
    }
    largest >= from
}

/// Elements group step `k` of `schedule` computes (0 for other steps).
fn elements(schedule: &Schedule, k: usize) -> usize {
    match &schedule.steps[k] {
        schedule::Step::Group { group, .. } => schedule.fusion.groups[*group].shape.iter().product(),
        schedule::Step::Node { .. } => 0,
    }
}

/// The most bytes a product panel may have for its epilogue to be worth
/// running panel by panel: larger panels (the vocabulary logits, 32 MiB in
/// BERT-small) are no longer in cache when the epilogue reads them, and
/// splitting the matmul only costs (measured: bf16 small with the dense
/// head 4 % slower). A feed-forward panel of BERT-small f32 (1 024 rows of
/// 2 048, 8 MiB) is read back from L3: its GELU and GELU-gradient
/// epilogues took the separate kernels' 15 ms per step off the elementwise
/// time at no cost to the products (2-core AMD EPYC Genoa, four
/// interleaved profiled runs; the step's kernel time 1 % shorter).
const PANEL_BYTES_MAX: usize = 8 << 20;

/// True when a panel of epilogue `e`'s product fits [`PANEL_BYTES_MAX`].
fn panels_stay_cached(graph: &Graph, schedule: &Schedule, e: &schedule::Epilogue) -> bool {
    let schedule::Step::Node { node, .. } = &schedule.steps[e.product_step] else { return false };
    let bytes = executable::PANEL_ROWS.min(e.rows) * e.row_len * graph.nodes[*node].dtype.size_in_bytes();
    bytes <= PANEL_BYTES_MAX
}

/// The CPU kernel of one scheduled step (see [`program::build_program`]
/// for `fast_paths`).
fn lower_step(graph: &Graph, schedule: &Schedule, step: &schedule::Step, fast_paths: bool) -> Step {
    match step {
        schedule::Step::Group { group, inputs, outputs, alias } => {
            let program = program::build_program(graph, &schedule.fusion.groups[*group], fast_paths);
            Step {
                node_index: schedule.fusion.groups[*group].runs_at,
                label: program.describe(),
                kernel: Kernel::Fused { program, outputs: outputs.clone(), alias: alias.clone() },
                inputs: inputs.clone(),
            }
        }
        schedule::Step::Node { node: i, inputs, views, slot, in_place, splat, out_strides } => {
            let node = &graph.nodes[*i];
            let lowered = if *splat { Node { shape: Shape::scalar(), ..node.clone() } } else { node.clone() };
            let input_dims: Vec<String> =
                node.inputs.iter().map(|id| format!("{:?}", graph.node(*id).shape.dims())).collect();
            let stored = match &schedule.fusion.stored_permuted[*i] {
                Some(store) => format!(" stored as {:?}", graph.nodes[store.base].shape.dims()),
                None => String::new(),
            };
            Step {
                node_index: *i,
                label: format!(
                    "{} {} -> {:?} {}{stored}",
                    node.op.name(),
                    input_dims.join(" "),
                    node.shape.dims(),
                    node.dtype
                ),
                kernel: Kernel::Primitive {
                    node: lowered,
                    input_shapes: node.inputs.iter().map(|id| graph.node(*id).shape.dims().to_vec()).collect(),
                    views: views.clone(),
                    slot: *slot,
                    in_place: *in_place,
                    out_strides: out_strides.clone(),
                },
                inputs: inputs.clone(),
            }
        }
    }
}
