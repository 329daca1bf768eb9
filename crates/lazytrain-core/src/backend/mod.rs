//! The backend trait: what a device needs to run scheduled graphs.
//!
//! The engine optimises a graph ([`crate::compile`]) and schedules it
//! ([`crate::schedule`]: fusion, views, memory plan) for the backend's
//! [`Capabilities`]; the backend only *lowers* that schedule into an
//! [`Executable`], runs it ([`Backend::execute`]) and owns the device
//! memory buffers live in (`alloc`, `copy_in`, `copy_out`; host memory by
//! default). Two backends implement it: [`CpuBackend`] (fused tile
//! kernels, `gemm`, AVX-512 BF16) and [`ReferenceBackend`] (one naive kernel
//! per node: the oracle). `LAZYTRAIN_BACKEND=cpu|reference` picks one for
//! every device a process makes ([`from_env`]).

mod cpu;
pub mod profile;
mod recording;
mod reference;

pub use cpu::CpuBackend;
pub use recording::RecordingBackend;
pub use reference::ReferenceBackend;

use crate::collective::RunContext;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::schedule::{Capabilities, Schedule};
use crate::storage::{Buffer, HostData};
use serde::Serialize;
use std::sync::Arc;

/// Lowers scheduled graphs into executables.
pub trait Backend: Send + Sync {
    /// A short name (`cpu`, `reference`).
    fn name(&self) -> &'static str;
    /// What the backend runs, which shapes the schedules it is given.
    fn capabilities(&self) -> Capabilities;
    /// Emit an executable for `schedule` (made for [`Backend::capabilities`]).
    fn lower(&self, schedule: &Schedule) -> Result<Arc<dyn Executable>>;
    /// Run `executable` (lowered by a backend of this kind) with this
    /// backend's resources: its threads, its memory between runs.
    fn execute(
        &self,
        executable: &dyn Executable,
        inputs: Vec<Arc<Buffer>>,
        context: &RunContext,
    ) -> Result<Vec<Arc<Buffer>>> {
        executable.run(inputs, context)
    }
    /// New memory for `len` elements of `dtype` (contents unspecified; host
    /// backends give zeros).
    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer> {
        Ok(Buffer::new(HostData::zeros(dtype, len)))
    }
    /// Copy host data into this backend's memory (host backends take it over).
    fn copy_in(&self, data: HostData) -> Result<Buffer> {
        Ok(Buffer::new(data))
    }
    /// Copy a buffer of this backend's memory to the host (waiting while it
    /// is in flight).
    fn copy_out(&self, buffer: &Buffer) -> Result<HostData> {
        buffer.wait().cloned().map_err(|message| Error::Execution {
            node: 0,
            op: "copy_out",
            detail: message.to_string(),
        })
    }
    /// Schedule an optimised `graph` for this backend and lower it.
    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        self.lower(&Schedule::new(graph, &self.capabilities()))
    }
}

/// The backends [`from_env`] knows, by name.
pub const BACKEND_NAMES: [&str; 2] = ["cpu", "reference"];

/// A new backend named `name` (`cpu` or `reference`) for one device; the
/// CPU backend gets a pool of `threads` kernel threads (`None`: rayon's
/// global pool).
pub fn by_name(name: &str, threads: Option<usize>) -> Result<Arc<dyn Backend>> {
    match name {
        "cpu" => Ok(match threads {
            Some(n) => Arc::new(CpuBackend::with_threads(n)?),
            None => Arc::new(CpuBackend::default()),
        }),
        "reference" => Ok(Arc::new(ReferenceBackend)),
        other => Err(Error::Execution {
            node: 0,
            op: "backend",
            detail: format!("unknown backend `{other}`; choose one of {}", BACKEND_NAMES.join(", ")),
        }),
    }
}

/// A new backend of the kind `LAZYTRAIN_BACKEND` names (`cpu` when unset or
/// empty), as [`by_name`].
pub fn from_env(threads: Option<usize>) -> Result<Arc<dyn Backend>> {
    match std::env::var("LAZYTRAIN_BACKEND") {
        Ok(name) if !name.is_empty() => by_name(&name, threads).map_err(|e| match e {
            Error::Execution { detail, .. } => {
                Error::Execution { node: 0, op: "backend", detail: format!("LAZYTRAIN_BACKEND: {detail}") }
            }
            other => other,
        }),
        _ => by_name("cpu", threads),
    }
}

/// A compiled graph, runnable many times on new input buffers.
pub trait Executable: std::any::Any + Send + Sync {
    /// Run on `inputs` (indexed like `Op::Parameter`); returns one buffer per
    /// graph output. Inputs are passed by value so a future donation pass can
    /// reuse a buffer nobody else holds. `context` carries the replica group
    /// that `all_reduce` nodes reduce over.
    fn run(&self, inputs: Vec<Arc<Buffer>>, context: &RunContext) -> Result<Vec<Arc<Buffer>>>;
    /// Facts about the compiled program.
    fn stats(&self) -> ExecutableStats;
}

/// Facts about a compiled program, for tests and the metrics report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExecutableStats {
    /// Kernel launches per run.
    pub kernels: usize,
    /// Of those, fused elementwise kernels.
    pub fused_kernels: usize,
    /// Kernels that write over an input's buffer.
    pub in_place: usize,
    /// Matmuls whose epilogue (the fused kernel after them) runs on each row
    /// panel of the product as it is computed (counted in `kernels` as two).
    pub epilogues: usize,
    /// Row chains run a block of rows at a time (see [`crate::schedule::chain`]).
    pub row_chains: usize,
    /// Steps over a batch of matrices run a matrix at a time (see
    /// [`crate::schedule::heads`]).
    pub head_chains: usize,
    /// Fused kernels run by a loop of their own instead of instruction by
    /// instruction (GELU's forward and backward on AVX-512 CPUs, AdamW's
    /// update).
    pub fast_paths: usize,
    /// Other fused kernels run as lane programs: all their instructions on
    /// a few vectors of elements at a time (straight-line programs, see
    /// `kernels::fused::lanes`).
    pub lane_programs: usize,
    /// Intermediate buffers after liveness-based reuse.
    pub buffers: usize,
    /// Bytes of all intermediate buffers (the planned peak).
    pub planned_bytes: usize,
    /// Bytes the same values would take without reuse.
    pub unplanned_bytes: usize,
    /// Bytes alive at the peak of a run: intermediate slots (donated inputs
    /// included) plus the inputs that are not donated.
    pub peak_bytes: usize,
    /// Bytes of buffers the runs so far had to allocate. After the first run
    /// a training step allocates nothing: its outputs leave in donated
    /// inputs' memory, which comes back as the next step's inputs.
    pub allocated_bytes: u64,
    /// Bytes of intermediate buffers kept for the next run (freed when
    /// another graph runs after this one has run only once).
    pub kept_bytes: u64,
    /// Bytes of the five largest intermediate buffers, largest first (0
    /// where there are fewer).
    pub largest_buffers: [u64; 5],
}
