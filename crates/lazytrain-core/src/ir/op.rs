//! The closed set of primitive operations.
//!
//! Everything the frontend offers (softmax, layer norm, cross-entropy, ...) is
//! built from these. Adding a primitive touches its shape rule
//! ([`super::infer`]), its kernel (`crate::kernels`) and, later, its VJP rule.

use crate::dtype::Literal;

/// Elementwise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// The error function.
    Erf,
    /// `|x|`
    Abs,
    /// `1 / x`
    Recip,
}

impl UnaryOp {
    /// The op's name in the IR and in messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Abs => "abs",
            UnaryOp::Recip => "recip",
        }
    }

    /// True when the op is defined on integer inputs as well as floats.
    pub fn allows_int(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs)
    }
}

/// Elementwise binary arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (true division for floats, truncating for integers, 0 where `b == 0`).
    Div,
    /// Elementwise maximum (NaN-propagating for floats).
    Max,
    /// Elementwise minimum (NaN-propagating for floats).
    Min,
    /// `a ^ b` (floats only).
    Pow,
}

impl BinaryOp {
    /// The op's name in the IR and in messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Pow => "pow",
        }
    }
}

/// Elementwise comparisons; the result is `Bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

impl CmpOp {
    /// The op's name in the IR and in messages.
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Reduction kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum of the elements.
    Sum,
    /// Maximum of the elements.
    Max,
}

/// How `all_reduce` combines the replicas' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceOp {
    /// Elementwise sum over replicas.
    Sum,
    /// Elementwise mean over replicas.
    Mean,
}

/// A primitive operation with its attributes. The output shape and dtype live
/// in the [`super::Node`], so ops like `Reshape` need no attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Input buffer number `k` of the graph (device-resident data).
    Parameter(usize),
    /// Every element equals the literal.
    Constant(Literal),
    /// Element values count 0, 1, 2, ... along `axis`.
    Iota {
        /// The counting axis.
        axis: usize,
    },
    /// Uniform floats in `[0, 1)` from Philox-4x32-10, keyed by the scalar
    /// `i64` seed input; `stream` separates the draws of one graph.
    RngUniform {
        /// Distinguishes generators in one graph (the counter's high word).
        stream: u64,
    },
    /// Elementwise unary math.
    Unary(UnaryOp),
    /// Element type conversion to the node's dtype.
    Cast,
    /// Elementwise arithmetic on two same-shape inputs.
    Binary(BinaryOp),
    /// Elementwise comparison of two same-shape inputs.
    Compare(CmpOp),
    /// `cond ? a : b` over three same-shape inputs.
    Select,
    /// Reduce `axes`, keeping them as size-1 dimensions.
    Reduce {
        /// Sum or max.
        op: ReduceOp,
        /// The reduced axes, ascending.
        axes: Vec<usize>,
    },
    /// Same elements, the node's shape.
    Reshape,
    /// Output axis `i` is input axis `perm[i]`.
    Permute(Vec<usize>),
    /// Repeat size-1 dimensions to the node's shape (same rank).
    Expand,
    /// The window starting at `starts` with the node's shape (step 1).
    Slice {
        /// First index per axis.
        starts: Vec<usize>,
    },
    /// Join the inputs along `axis`.
    Concat {
        /// The joining axis.
        axis: usize,
    },
    /// Surround the input with `low`/`high` elements of `value` per axis.
    Pad {
        /// Elements added before, per axis.
        low: Vec<usize>,
        /// Elements added after, per axis.
        high: Vec<usize>,
        /// The fill value.
        value: Literal,
    },
    /// `out[i..] = src[i.. with i_axis = index[i..]]` (`take_along_axis`);
    /// inputs `(src, index)`, the output has the index's shape.
    Gather {
        /// The indexed axis.
        axis: usize,
    },
    /// `out = base; out[i.. with i_axis = index[i..]] += updates[i..]`;
    /// inputs `(base, index, updates)`.
    ScatterAdd {
        /// The indexed axis.
        axis: usize,
    },
    /// Batched matmul `[.., M, K] x [.., K, N] -> [.., M, N]`; with
    /// `lhs_t`/`rhs_t` an operand is given transposed (`[.., K, M]`, `[.., N, K]`).
    Dot {
        /// The left operand is stored transposed.
        lhs_t: bool,
        /// The right operand is stored transposed.
        rhs_t: bool,
    },
    /// Combine the value across data-parallel replicas (identity with one).
    AllReduce(AllReduceOp),
    /// The input's value, as a constant for autodiff (no gradient flows
    /// through it); the optimiser forwards the input.
    StopGradient,
}

impl Op {
    /// The op's name in the IR printer.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter(_) => "parameter",
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
            Op::RngUniform { .. } => "rng_uniform",
            Op::Unary(u) => u.name(),
            Op::Cast => "cast",
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Reduce { op: ReduceOp::Sum, .. } => "reduce_sum",
            Op::Reduce { op: ReduceOp::Max, .. } => "reduce_max",
            Op::Reshape => "reshape",
            Op::Permute(_) => "permute",
            Op::Expand => "expand",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Dot { .. } => "dot",
            Op::AllReduce(_) => "all_reduce",
            Op::StopGradient => "stop_gradient",
        }
    }

    /// True for ops computed independently per element from same-shape inputs.
    pub fn is_elementwise(&self) -> bool {
        match self {
            Op::Unary(_) | Op::Cast | Op::Binary(_) | Op::Compare(_) | Op::Select => true,
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::RngUniform { .. }
            | Op::Reduce { .. }
            | Op::Reshape
            | Op::Permute(_)
            | Op::Expand
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Pad { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Dot { .. }
            | Op::AllReduce(_)
            | Op::StopGradient => false,
        }
    }
}
