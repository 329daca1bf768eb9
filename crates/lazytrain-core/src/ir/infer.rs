//! Shape and dtype rules, one per primitive.
//!
//! The tracer calls these before recording a node, so a bad op fails at the
//! user's line; the IR verifier calls [`check_node`] to re-derive every node
//! after each compiler pass.

use super::graph::Node;
use super::op::{Op, UnaryOp};
use crate::dtype::DType;
use crate::error::{RuleError, RuleKind};
use crate::shape::Shape;

/// The shape and dtype of a value.
pub type Meta<'a> = (&'a Shape, DType);

/// What a rule returns: the output's shape and dtype.
pub type RuleResult = Result<(Shape, DType), RuleError>;

fn err(kind: RuleKind, detail: String) -> RuleError {
    RuleError::new(kind, detail)
}

fn check_axis(axis: usize, shape: &Shape) -> Result<(), RuleError> {
    if axis >= shape.rank() {
        return Err(err(
            RuleKind::Axis,
            format!("axis {axis} is out of range for shape {shape} (rank {})", shape.rank()),
        ));
    }
    Ok(())
}

/// Elementwise unary math.
pub fn unary(op: UnaryOp, x: Meta) -> RuleResult {
    if x.1 == DType::Bool || (!x.1.is_float() && !op.allows_int()) {
        return Err(err(RuleKind::DType, format!("{} needs a floating-point input, got {} {}", op.name(), x.1, x.0)));
    }
    Ok((x.0.clone(), x.1))
}

/// Conversion to `dtype`.
pub fn cast(x: Meta, dtype: DType) -> RuleResult {
    Ok((x.0.clone(), dtype))
}

fn same_shape_and_dtype(name: &str, a: Meta, b: Meta) -> Result<(), RuleError> {
    if a.0 != b.0 {
        return Err(err(
            RuleKind::Shape,
            format!("{name} needs equal shapes after broadcasting, got {} and {}", a.0, b.0),
        ));
    }
    if a.1 != b.1 {
        return Err(err(
            RuleKind::DType,
            format!("{name} needs equal dtypes, got {} {} and {} {}; cast one side first", a.1, a.0, b.1, b.0),
        ));
    }
    Ok(())
}

/// Elementwise arithmetic; both inputs have one shape and dtype.
pub fn binary(op: super::op::BinaryOp, a: Meta, b: Meta) -> RuleResult {
    same_shape_and_dtype(op.name(), a, b)?;
    if a.1 == DType::Bool {
        return Err(err(RuleKind::DType, format!("{} is not defined on bool tensors ({})", op.name(), a.0)));
    }
    if op == super::op::BinaryOp::Pow && !a.1.is_float() {
        return Err(err(RuleKind::DType, format!("pow needs floating-point inputs, got {} {}", a.1, a.0)));
    }
    Ok((a.0.clone(), a.1))
}

/// Elementwise comparison; the result is bool.
pub fn compare(op: super::op::CmpOp, a: Meta, b: Meta) -> RuleResult {
    same_shape_and_dtype(op.name(), a, b)?;
    Ok((a.0.clone(), DType::Bool))
}

/// `cond ? a : b`.
pub fn select(cond: Meta, a: Meta, b: Meta) -> RuleResult {
    if cond.1 != DType::Bool {
        return Err(err(RuleKind::DType, format!("select needs a bool condition, got {} {}", cond.1, cond.0)));
    }
    same_shape_and_dtype("select", a, b)?;
    if cond.0 != a.0 {
        return Err(err(
            RuleKind::Shape,
            format!("select condition {} does not match the values' shape {}", cond.0, a.0),
        ));
    }
    Ok((a.0.clone(), a.1))
}

/// Reduction over `axes`, which stay as size-1 dimensions.
pub fn reduce(x: Meta, axes: &[usize]) -> RuleResult {
    if x.1 == DType::Bool {
        return Err(err(RuleKind::DType, format!("cannot reduce a bool tensor {}; cast it first", x.0)));
    }
    let mut dims = x.0.dims().to_vec();
    for (i, &axis) in axes.iter().enumerate() {
        check_axis(axis, x.0)?;
        if i > 0 && axes[i - 1] >= axis {
            return Err(err(RuleKind::Axis, format!("reduction axes {axes:?} must be distinct and ascending")));
        }
        dims[axis] = 1;
    }
    Ok((Shape::new(dims), x.1))
}

/// Same elements in a new shape.
pub fn reshape(x: Meta, target: &Shape) -> RuleResult {
    if x.0.numel() != target.numel() {
        return Err(err(
            RuleKind::Shape,
            format!("cannot reshape {} ({} elements) to {} ({} elements)", x.0, x.0.numel(), target, target.numel()),
        ));
    }
    Ok((target.clone(), x.1))
}

/// Axis permutation: output axis `i` is input axis `perm[i]`.
pub fn permute(x: Meta, perm: &[usize]) -> RuleResult {
    let rank = x.0.rank();
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(err(
            RuleKind::Axis,
            format!("permutation {perm:?} has {} axes but the input {} has rank {rank}", perm.len(), x.0),
        ));
    }
    for &p in perm {
        if p >= rank || seen[p] {
            return Err(err(RuleKind::Axis, format!("{perm:?} is not a permutation of the axes of {}", x.0)));
        }
        seen[p] = true;
    }
    let dims: Vec<usize> = perm.iter().map(|&p| x.0.dims()[p]).collect();
    Ok((Shape::new(dims), x.1))
}

/// Repeat size-1 dimensions up to `target` (same rank).
pub fn expand(x: Meta, target: &Shape) -> RuleResult {
    let ok = x.0.rank() == target.rank() && x.0.dims().iter().zip(target.dims()).all(|(&a, &b)| a == b || a == 1);
    if !ok {
        return Err(err(RuleKind::Shape, format!("cannot broadcast {} to {}", x.0, target)));
    }
    Ok((target.clone(), x.1))
}

/// A window of `sizes` starting at `starts`.
pub fn slice(x: Meta, starts: &[usize], sizes: &[usize]) -> RuleResult {
    let rank = x.0.rank();
    if starts.len() != rank || sizes.len() != rank {
        return Err(err(RuleKind::Argument, format!("slice of {} needs {rank} starts and sizes", x.0)));
    }
    for axis in 0..rank {
        if starts[axis].checked_add(sizes[axis]).is_none_or(|end| end > x.0.dims()[axis]) {
            return Err(err(
                RuleKind::Argument,
                format!(
                    "slice {}..{} of axis {axis} is out of bounds for shape {}",
                    starts[axis],
                    starts[axis].saturating_add(sizes[axis]),
                    x.0
                ),
            ));
        }
    }
    Ok((Shape::new(sizes.to_vec()), x.1))
}

/// Join along `axis`; other dimensions and dtypes must agree.
pub fn concat(xs: &[Meta], axis: usize) -> RuleResult {
    let Some(first) = xs.first() else {
        return Err(err(RuleKind::Argument, "concat needs at least one tensor".into()));
    };
    check_axis(axis, first.0)?;
    let mut dims = first.0.dims().to_vec();
    for x in &xs[1..] {
        if x.1 != first.1 {
            return Err(err(RuleKind::DType, format!("concat needs one dtype, got {} and {}", first.1, x.1)));
        }
        let fits =
            x.0.rank() == first.0.rank() && (0..dims.len()).all(|d| d == axis || x.0.dims()[d] == first.0.dims()[d]);
        if !fits {
            return Err(err(
                RuleKind::Shape,
                format!("concat along axis {axis} needs equal other dimensions, got {} and {}", first.0, x.0),
            ));
        }
        dims[axis] = dims[axis]
            .checked_add(x.0.dims()[axis])
            .ok_or_else(|| err(RuleKind::Shape, format!("concat along axis {axis}: the joined length overflows")))?;
    }
    Ok((Shape::new(dims), first.1))
}

/// Padding with `low`/`high` elements per axis.
pub fn pad(x: Meta, low: &[usize], high: &[usize]) -> RuleResult {
    if low.len() != x.0.rank() || high.len() != x.0.rank() {
        return Err(err(RuleKind::Argument, format!("pad of {} needs {} low and high widths", x.0, x.0.rank())));
    }
    let dims = x.0.dims().iter().zip(low.iter().zip(high)).map(|(d, (l, h))| d.checked_add(*l)?.checked_add(*h));
    let dims: Option<Vec<usize>> = dims.collect();
    let dims =
        dims.ok_or_else(|| err(RuleKind::Argument, format!("pad widths {low:?} + {high:?} of {} overflow", x.0)))?;
    Ok((Shape::new(dims), x.1))
}

fn check_index(name: &str, data: Meta, index: Meta, axis: usize) -> Result<(), RuleError> {
    check_axis(axis, data.0)?;
    if !matches!(index.1, DType::I64 | DType::I32) {
        return Err(err(RuleKind::DType, format!("{name} needs i64 or i32 indices, got {} {}", index.1, index.0)));
    }
    let fits = index.0.rank() == data.0.rank()
        && (0..data.0.rank()).all(|d| d == axis || index.0.dims()[d] <= data.0.dims()[d]);
    if !fits {
        return Err(err(
            RuleKind::Shape,
            format!("{name} index {} must have the rank of {} and no larger size outside axis {axis}", index.0, data.0),
        ));
    }
    Ok(())
}

/// `take_along_axis`: the output has the index's shape.
pub fn gather(src: Meta, index: Meta, axis: usize) -> RuleResult {
    check_index("gather", src, index, axis)?;
    Ok((index.0.clone(), src.1))
}

/// Scatter-add of `updates` (the index's shape) into `base`.
pub fn scatter_add(base: Meta, index: Meta, updates: Meta, axis: usize) -> RuleResult {
    check_index("scatter_add", base, index, axis)?;
    if updates.0 != index.0 {
        return Err(err(
            RuleKind::Shape,
            format!("scatter_add updates {} must have the index's shape {}", updates.0, index.0),
        ));
    }
    if updates.1 != base.1 || base.1 == DType::Bool {
        return Err(err(
            RuleKind::DType,
            format!("scatter_add needs numeric base and updates of one dtype, got {} and {}", base.1, updates.1),
        ));
    }
    Ok((base.0.clone(), base.1))
}

/// Batched matmul with optionally transposed operands.
pub fn dot(a: Meta, b: Meta, lhs_t: bool, rhs_t: bool) -> RuleResult {
    if a.1 != b.1 || !a.1.is_float() {
        return Err(err(
            RuleKind::DType,
            format!("matmul needs floating-point operands of one dtype, got {} {} and {} {}", a.1, a.0, b.1, b.0),
        ));
    }
    let (ra, rb) = (a.0.rank(), b.0.rank());
    if ra < 2 || ra != rb {
        return Err(err(RuleKind::Shape, format!("matmul needs operands of equal rank >= 2, got {} and {}", a.0, b.0)));
    }
    let (ad, bd) = (a.0.dims(), b.0.dims());
    if ad[..ra - 2] != bd[..rb - 2] {
        return Err(err(RuleKind::Shape, format!("matmul batch dimensions differ: {} and {}", a.0, b.0)));
    }
    let (m, ka) = if lhs_t { (ad[ra - 1], ad[ra - 2]) } else { (ad[ra - 2], ad[ra - 1]) };
    let (kb, n) = if rhs_t { (bd[rb - 1], bd[rb - 2]) } else { (bd[rb - 2], bd[rb - 1]) };
    if ka != kb {
        return Err(err(
            RuleKind::Shape,
            format!("matmul contracting dimensions differ: {} x {} contracts {ka} with {kb}", a.0, b.0),
        ));
    }
    let mut dims = ad[..ra - 2].to_vec();
    dims.extend([m, n]);
    Ok((Shape::new(dims), a.1))
}

/// Uniform random floats from a scalar integer seed.
pub fn rng_uniform(seed: Meta, shape: &Shape, dtype: DType) -> RuleResult {
    if seed.0.rank() != 0 || !matches!(seed.1, DType::I64 | DType::I32) {
        return Err(err(
            RuleKind::DType,
            format!("the random seed must be an integer scalar, got {} {}", seed.1, seed.0),
        ));
    }
    if !dtype.is_float() {
        return Err(err(RuleKind::DType, format!("random uniform values need a float dtype, got {dtype}")));
    }
    Ok((shape.clone(), dtype))
}

/// Counting along `axis`.
pub fn iota(shape: &Shape, axis: usize, dtype: DType) -> RuleResult {
    check_axis(axis, shape)?;
    if dtype == DType::Bool {
        return Err(err(RuleKind::DType, "iota cannot produce bool".into()));
    }
    Ok((shape.clone(), dtype))
}

/// Re-derive `node`'s shape and dtype from its inputs (for the verifier).
pub fn check_node(node: &Node, inputs: &[Meta]) -> Result<(), RuleError> {
    let arity_ok = match &node.op {
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => inputs.is_empty(),
        Op::RngUniform { .. } | Op::Unary(_) | Op::Cast | Op::Reduce { .. } | Op::Reshape | Op::Permute(_) => {
            inputs.len() == 1
        }
        Op::Expand | Op::Slice { .. } | Op::Pad { .. } | Op::AllReduce(_) | Op::StopGradient => inputs.len() == 1,
        Op::Binary(_) | Op::Compare(_) | Op::Gather { .. } | Op::Dot { .. } => inputs.len() == 2,
        Op::Select | Op::ScatterAdd { .. } => inputs.len() == 3,
        Op::Concat { .. } => !inputs.is_empty(),
    };
    if !arity_ok {
        return Err(err(RuleKind::Argument, format!("{} has {} inputs", node.op.name(), inputs.len())));
    }
    let derived = match &node.op {
        Op::Parameter(_) | Op::Constant(_) => Ok((node.shape.clone(), node.dtype)),
        Op::Iota { axis } => iota(&node.shape, *axis, node.dtype),
        Op::RngUniform { .. } => rng_uniform(inputs[0], &node.shape, node.dtype),
        Op::Unary(u) => unary(*u, inputs[0]),
        Op::Cast => cast(inputs[0], node.dtype),
        Op::Binary(b) => binary(*b, inputs[0], inputs[1]),
        Op::Compare(c) => compare(*c, inputs[0], inputs[1]),
        Op::Select => select(inputs[0], inputs[1], inputs[2]),
        Op::Reduce { axes, .. } => reduce(inputs[0], axes),
        Op::Reshape => reshape(inputs[0], &node.shape),
        Op::Permute(perm) => permute(inputs[0], perm),
        Op::Expand => expand(inputs[0], &node.shape),
        Op::Slice { starts } => slice(inputs[0], starts, node.shape.dims()),
        Op::Concat { axis } => concat(inputs, *axis),
        Op::Pad { low, high, .. } => pad(inputs[0], low, high),
        Op::Gather { axis } => gather(inputs[0], inputs[1], *axis),
        Op::ScatterAdd { axis } => scatter_add(inputs[0], inputs[1], inputs[2], *axis),
        Op::Dot { lhs_t, rhs_t } => dot(inputs[0], inputs[1], *lhs_t, *rhs_t),
        Op::AllReduce(_) | Op::StopGradient => Ok((inputs[0].0.clone(), inputs[0].1)),
    }?;
    if derived.0 != node.shape || derived.1 != node.dtype {
        return Err(err(
            RuleKind::Shape,
            format!(
                "{} records {}{} but its inputs give {}{}",
                node.op.name(),
                node.dtype,
                node.shape,
                derived.1,
                derived.0
            ),
        ));
    }
    Ok(())
}
