//! The backend trait: what a device needs to compile and run graphs.
//!
//! The CPU backend is the only one today; a CUDA backend would implement the
//! same two traits and add a device-memory variant to [`crate::storage::Buffer`].

mod cpu;
mod fusion;
mod plan;
pub mod profile;

pub use cpu::CpuBackend;
pub use plan::{MemoryPlan, Operand};

use crate::collective::RunContext;
use crate::error::Result;
use crate::ir::Graph;
use crate::storage::Buffer;
use serde::Serialize;
use std::sync::Arc;

/// Compiles optimised graphs into executables.
pub trait Backend: Send + Sync {
    /// A short name (`cpu`).
    fn name(&self) -> &'static str;
    /// Plan memory and emit an executable for `graph`.
    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>>;
}

/// A compiled graph, runnable many times on new input buffers.
pub trait Executable: Send + Sync {
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
}
