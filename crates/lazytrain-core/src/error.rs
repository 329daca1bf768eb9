//! The typed errors of lazytrain-core.

use std::panic::Location;

/// What kind of rule a traced op broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// Shapes do not fit together (matmul dims, broadcast, reshape size).
    Shape,
    /// Element types do not fit (a dtype mix, a float-only op on integers).
    DType,
    /// An axis or permutation outside the tensor's rank.
    Axis,
    /// Any other bad argument (slice bounds, pad widths, empty concat).
    Argument,
}

impl RuleKind {
    fn label(self) -> &'static str {
        match self {
            RuleKind::Shape => "shape error",
            RuleKind::DType => "dtype error",
            RuleKind::Axis => "axis error",
            RuleKind::Argument => "invalid argument",
        }
    }
}

/// A shape/dtype rule violation, before the op name and caller are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// Which rule was broken.
    pub kind: RuleKind,
    /// What was wrong, naming the shapes and dtypes involved.
    pub detail: String,
}

impl RuleError {
    /// A rule error of `kind` with a message.
    pub fn new(kind: RuleKind, detail: impl Into<String>) -> RuleError {
        RuleError { kind, detail: detail.into() }
    }
}

/// Every error lazytrain-core returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A traced op was given inputs that break its shape or dtype rule.
    #[error("{op}: {}: {detail} (called at {location})", kind.label())]
    Op {
        /// The op's user-facing name (`matmul`, `add`, ...).
        op: &'static str,
        /// Which rule was broken.
        kind: RuleKind,
        /// The shapes/dtypes involved and what was wrong.
        detail: String,
        /// The user's line that traced the op.
        location: &'static Location<'static>,
    },
    /// Host data does not match the shape or dtype asked for.
    #[error("{what}: {detail} (called at {location})")]
    Data {
        /// The function that was called (`from_vec`, `to_vec`, ...).
        what: &'static str,
        /// What did not match.
        detail: String,
        /// The user's line.
        location: &'static Location<'static>,
    },
    /// Two tensors from different devices were combined.
    #[error(
        "{op}: tensors live on different devices ({a} and {b}); move one with `to_device` first (called at {location})"
    )]
    DeviceMismatch {
        /// The op's name.
        op: &'static str,
        /// The first device.
        a: String,
        /// The second device.
        b: String,
        /// The user's line.
        location: &'static Location<'static>,
    },
    /// A kernel failed at run time on the data it was given (an index out of range).
    #[error("execution failed in node {node} ({op}): {detail}")]
    Execution {
        /// The node index in the compiled graph.
        node: usize,
        /// The op's name.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A compiler pass produced an invalid graph (a bug in lazytrain, not the caller).
    #[error("IR verification failed after pass `{pass}`: {detail}")]
    Verify {
        /// The pass that ran last.
        pass: &'static str,
        /// The broken invariant.
        detail: String,
    },
    /// A step would not fit in memory: found when it was compiled, before
    /// its first run (see [`Device::plan_next_sync`](crate::Device::plan_next_sync) for a dry run).
    #[error(
        "the step needs {} MB more memory at its peak than the {} MB available (largest buffers: {} MB); lower the \
         batch size, use gradient accumulation or bf16 saved activations",
        needed_bytes / (1 << 20),
        available_bytes / (1 << 20),
        largest_buffers.iter().map(|b| format!("{:.1}", *b as f64 / (1 << 20) as f64)).collect::<Vec<_>>().join(", ")
    )]
    OutOfMemory {
        /// Bytes the run would allocate beyond what is already resident.
        needed_bytes: u64,
        /// Bytes the system has available.
        available_bytes: u64,
        /// The largest intermediate buffers, in bytes, largest first.
        largest_buffers: Vec<u64>,
        /// The compiled step's plan.
        stats: Box<crate::backend::ExecutableStats>,
    },
    /// A dry run: the step was compiled and its memory planned, not run.
    #[error("dry run: the step was compiled and planned ({} MB at its peak), not run", stats.peak_bytes / (1 << 20))]
    DryRun {
        /// The compiled step's plan.
        stats: Box<crate::backend::ExecutableStats>,
        /// Bytes of the step's inputs (parameters, optimizer state, the batch).
        input_bytes: u64,
    },
    /// File I/O (IR dumps, fixtures).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Attach the op name and caller location to a rule violation.
    pub fn from_rule(op: &'static str, rule: RuleError, location: &'static Location<'static>) -> Error {
        Error::Op { op, kind: rule.kind, detail: rule.detail, location }
    }
}

/// The message of a caught panic (its `&str` or `String` payload).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
