//! Reference kernels for every primitive, shared by the interpreter and the
//! CPU backend. Each writes into an output buffer already sized for the node.

mod bf16_arithmetic;
pub(crate) mod dot;
mod dot_amx;
mod dot_bf16;
mod dot_heads;
mod dot_widened;
mod elementwise;
pub(crate) mod fused;
mod gemm;
pub(crate) mod gemm_tuning;
mod index;
mod movement;
pub(crate) mod numeric;
mod numeric_avx512;
mod peak;
mod reduce;
pub(crate) mod simd;
mod split;
pub(crate) mod strided;

pub use dot::MatmulKernel;
pub(crate) use elementwise::unary_f32;
pub use peak::fma_peak_gflops;

use crate::ir::{Node, Op};
use crate::shape::contiguous_strides;
use crate::storage::HostData;

/// How this CPU multiplies bf16 matrices: `"amx-bf16-tiles"` (AMX
/// `tdpbf16ps`, Intel Xeons from Sapphire Rapids), `"avx512-bf16-dot"`
/// (`vdpbf16ps`), `"avx512-fma-widened"` (values widened to f32 as they
/// are packed, f32 FMA: Intel CPUs, whose `vdpbf16ps` runs at half the FMA
/// rate), or `"gemm-widened"` (no AVX-512 BF16: operands widened whole for
/// the f32 `gemm`).
pub fn bf16_matmul_method() -> &'static str {
    match bf16_arithmetic::arithmetic() {
        Some(bf16_arithmetic::Arithmetic::DotPairs) => "avx512-bf16-dot",
        Some(bf16_arithmetic::Arithmetic::Fma) => "avx512-fma-widened",
        Some(bf16_arithmetic::Arithmetic::Tiles) => "amx-bf16-tiles",
        None => "gemm-widened",
    }
}

/// The shapes of a node's inputs, for kernels that need them.
pub(crate) type InputShapes<'a> = [&'a [usize]];

/// Compute `node` from its inputs into `out`. `Parameter` nodes are the
/// caller's business; every other op is handled here.
pub(crate) fn eval(
    node: &Node,
    inputs: &[&HostData],
    shapes: &InputShapes,
    out: &mut HostData,
    matmul: MatmulKernel,
) -> Result<(), String> {
    eval_with_views(node, inputs, shapes, &[None, None], out, matmul)
}

/// [`eval`], where a matmul operand, or the index of a gather or scatter,
/// may be a strided view of its buffer (`views[i]`: the element strides of
/// input `i` over its shape).
pub(crate) fn eval_with_views(
    node: &Node,
    inputs: &[&HostData],
    shapes: &InputShapes,
    views: &[Option<&[usize]>],
    out: &mut HostData,
    matmul: MatmulKernel,
) -> Result<(), String> {
    let out_shape = node.shape.dims();
    match &node.op {
        Op::Parameter(k) => return Err(format!("parameter {k} has no kernel")),
        Op::Constant(v) => numeric::fill_literal(out, *v),
        Op::Iota { axis } => elementwise::iota(out_shape, *axis, out),
        Op::RngUniform { stream } => elementwise::rng_uniform(inputs[0], *stream, out)?,
        Op::Unary(op) => elementwise::unary(*op, inputs[0], out)?,
        Op::Cast => numeric::cast(inputs[0], out),
        Op::Binary(op) => elementwise::binary(*op, inputs[0], inputs[1], out)?,
        Op::Compare(op) => elementwise::compare(*op, inputs[0], inputs[1], out)?,
        Op::Select => elementwise::select(inputs[0], inputs[1], inputs[2], out)?,
        Op::Reduce { op, axes } => reduce::reduce(*op, inputs[0], shapes[0], axes, out)?,
        Op::Reshape | Op::AllReduce(_) | Op::StopGradient => {
            movement::strided_copy(inputs[0], &[out.len()], &[1], 0, out)?;
        }
        Op::Permute(perm) => {
            let strides = movement::permuted_strides(shapes[0], perm);
            movement::strided_copy(inputs[0], out_shape, &strides, 0, out)?;
        }
        Op::Expand => {
            let strides = movement::expanded_strides(shapes[0]);
            movement::strided_copy(inputs[0], out_shape, &strides, 0, out)?;
        }
        Op::Slice { starts } => {
            let strides = contiguous_strides(shapes[0]);
            let base = starts.iter().zip(&strides).map(|(a, s)| a * s).sum();
            movement::strided_copy(inputs[0], out_shape, &strides, base, out)?;
        }
        Op::Concat { axis } => movement::concat(inputs, shapes, *axis, out)?,
        Op::Pad { low, value, .. } => movement::pad(inputs[0], shapes[0], out_shape, low, *value, out)?,
        Op::Gather { axis } => {
            index::gather(inputs[0], shapes[0], index_operand(inputs[1], shapes, views), *axis, out)?
        }
        Op::ScatterAdd { axis } => {
            index::scatter_add(inputs[0], shapes[0], index_operand(inputs[1], shapes, views), inputs[2], *axis, out)?
        }
        Op::Dot { .. } => eval_dot(node, inputs, shapes, views, (out, None), matmul)?,
    }
    Ok(())
}

/// Input 1 of a gather or scatter, its index (`data`), with its shape and
/// view strides.
fn index_operand<'a>(
    data: &'a HostData,
    shapes: &[&'a [usize]],
    views: &[Option<&'a [usize]>],
) -> index::IndexOperand<'a> {
    index::IndexOperand { data, shape: shapes[1], strides: views.get(1).copied().flatten() }
}

/// The geometry of a matmul with output shape `out_shape` whose left
/// operand has shape `lhs`.
fn dot_dims(out_shape: &[usize], lhs: &[usize], lhs_t: bool, rhs_t: bool) -> dot::DotDims {
    let rank = out_shape.len();
    let (m, n) = (out_shape[rank - 2], out_shape[rank - 1]);
    let k = if lhs_t { lhs[rank - 2] } else { lhs[rank - 1] };
    let batch = out_shape[..rank - 2].iter().product();
    dot::DotDims { batch, m, k, n, lhs_t, rhs_t }
}

/// The row panels of a matmul `node` (see [`dot::RowPanels`]), or `None`
/// when it is not computed by panels.
pub(crate) fn dot_panels<'a>(
    node: &Node,
    inputs: &[&'a HostData],
    shapes: &[&'a [usize]],
    views: &[Option<&'a [usize]>],
) -> Result<Option<dot::RowPanels<'a>>, String> {
    let Op::Dot { lhs_t, rhs_t } = node.op else { return Ok(None) };
    let dims = dot_dims(node.shape.dims(), shapes[0], lhs_t, rhs_t);
    let operand = |i: usize| dot::DotOperand { data: inputs[i], shape: shapes[i], strides: views[i] };
    dot::RowPanels::new(dims, operand(0), operand(1))
}

/// Multiply-adds of one matrix of matmul `node` whose left operand has
/// shape `lhs` (`None`: not a matmul).
pub(crate) fn dot_matrix_macs(node: &Node, lhs: &[usize]) -> Option<usize> {
    let Op::Dot { lhs_t, rhs_t } = node.op else { return None };
    let d = dot_dims(node.shape.dims(), lhs, lhs_t, rhs_t);
    Some(d.m * d.k * d.n)
}

/// The products of a batched f32 matmul `node` computed a matrix at a time
/// into `out` (see [`dot::HeadProducts`]), or `None` when its matrices do
/// not each run on one thread.
pub(crate) fn head_products(
    node: &Node,
    inputs: [dot::RawOperand; 2],
    out: dot::RawOperand,
) -> Result<Option<dot::HeadProducts>, String> {
    let Op::Dot { lhs_t, rhs_t } = node.op else { return Ok(None) };
    let dims = dot_dims(node.shape.dims(), inputs[0].shape, lhs_t, rhs_t);
    dot::HeadProducts::new(dims, inputs[0], inputs[1], out)
}

/// Matmul `node` into `out` on `matmul`, its product laid out there by
/// element `out_strides` (`None`: contiguous; else a permutation of its
/// axes that keeps rows contiguous: a batched product stored straight into
/// the permute reading it), its operands as for [`eval_with_views`].
pub(crate) fn eval_dot(
    node: &Node,
    inputs: &[&HostData],
    shapes: &InputShapes,
    views: &[Option<&[usize]>],
    (out, out_strides): (&mut HostData, Option<&[usize]>),
    matmul: MatmulKernel,
) -> Result<(), String> {
    let Op::Dot { lhs_t, rhs_t } = node.op else { return Err(format!("{} is not a matmul", node.op.name())) };
    let out_shape = node.shape.dims();
    let dims = dot_dims(out_shape, shapes[0], lhs_t, rhs_t);
    let operand = |i: usize| dot::DotOperand { data: inputs[i], shape: shapes[i], strides: views[i] };
    dot::dot(matmul, dims, operand(0), operand(1), (out, out_shape, out_strides))
}

/// Compute `node` in place: `out` holds input `position` on entry and the
/// result on exit; `others` are the remaining inputs in order; `shapes` are
/// the shapes of all inputs, `views` the element strides of those read as
/// views (by position, as for [`eval_with_views`]).
pub(crate) fn eval_in_place(
    node: &Node,
    position: usize,
    others: &[&HostData],
    shapes: &InputShapes,
    views: &[Option<&[usize]>],
    out: &mut HostData,
) -> Result<(), String> {
    match node.op {
        Op::ScatterAdd { axis } if position == 0 => {
            index::scatter_add_inplace(shapes[0], index_operand(others[0], shapes, views), others[1], axis, out)
        }
        Op::Unary(op) => elementwise::unary_inplace(op, out),
        // The local part of an all-reduce is the identity; the executable
        // then reduces `out` over the replicas.
        Op::AllReduce(_) => Ok(()),
        Op::Binary(op) => elementwise::binary_inplace(op, position == 0, others[0], out),
        Op::Select if position > 0 => elementwise::select_inplace(others[0], others[1], position == 1, out),
        _ => Err(format!("{} cannot run in place", node.op.name())),
    }
}
