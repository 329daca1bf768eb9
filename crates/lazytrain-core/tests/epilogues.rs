//! Matmul epilogues: each kind of fused kernel that follows a matmul (bias
//! add, GELU with its saved input, residual add, a bf16 cast, row max and
//! row sum, column sums split at the middle row inside a panel, a bf16
//! product, a product whose transposed weight is copied row-major once for
//! all its panels) gives the same bits when it runs on each row
//! panel of the product as when the matmul and the kernel run one after
//! the other, and the CPU backend really pairs them.

use lazytrain_core::backend::{Backend, CpuBackend, ReferenceBackend};
use lazytrain_core::compile::optimize;
use lazytrain_core::ir::{infer, BinaryOp, Graph, GraphBuilder, Node, NodeId, Op, ReduceOp, UnaryOp};
use lazytrain_core::{Buffer, DType, HostData, Literal, Shape};
use std::sync::Arc;

/// Rows of the product: three panels (1024, 1024, 452), split unevenly between two threads.
const ROWS: usize = 2500;
const K: usize = 40;
const N: usize = 48;
/// `(rows, k, n)` of most tests' products.
const DIMS: (usize, usize, usize) = (ROWS, K, N);

fn param(b: &mut GraphBuilder, k: usize, dims: &[usize], dtype: DType) -> NodeId {
    b.push(Node { op: Op::Parameter(k), inputs: vec![], shape: Shape::new(dims), dtype })
}

fn node(b: &mut GraphBuilder, op: Op, inputs: Vec<NodeId>) -> NodeId {
    let (shape, dtype) = {
        let m: Vec<_> = inputs.iter().map(|i| (&b.node(*i).shape, b.node(*i).dtype)).collect();
        match &op {
            Op::Unary(u) => infer::unary(*u, m[0]),
            Op::Binary(o) => infer::binary(*o, m[0], m[1]),
            Op::Reduce { axes, .. } => infer::reduce(m[0], axes),
            Op::Dot { lhs_t, rhs_t } => infer::dot(m[0], m[1], *lhs_t, *rhs_t),
            other => panic!("{other:?} needs an explicit shape"),
        }
        .expect("valid node")
    };
    b.push(Node { op, inputs, shape, dtype })
}

fn shaped(b: &mut GraphBuilder, op: Op, input: NodeId, dims: &[usize], dtype: DType) -> NodeId {
    b.push(Node { op, inputs: vec![input], shape: Shape::new(dims), dtype })
}

fn scalar(b: &mut GraphBuilder, v: f64, dims: &[usize]) -> NodeId {
    b.push(Node {
        op: Op::Constant(Literal::new(v, DType::F32)),
        inputs: vec![],
        shape: Shape::new(dims),
        dtype: DType::F32,
    })
}

/// `x · wᵀ + bias` over `[rows, n]` (x: `[rows, k]`, w: `[n, k]`, as a linear
/// layer stores it), with operands of `dtype` and the sum in f32.
fn linear(b: &mut GraphBuilder, dtype: DType, (rows, k, n): (usize, usize, usize)) -> NodeId {
    let x = param(b, 0, &[rows, k], dtype);
    let w = param(b, 1, &[n, k], dtype);
    let bias = param(b, 2, &[n], DType::F32);
    let mut product = node(b, Op::Dot { lhs_t: false, rhs_t: true }, vec![x, w]);
    if dtype != DType::F32 {
        product = shaped(b, Op::Cast, product, &[rows, n], DType::F32);
    }
    let row = shaped(b, Op::Reshape, bias, &[1, n], DType::F32);
    let bias = shaped(b, Op::Expand, row, &[rows, n], DType::F32);
    node(b, Op::Binary(BinaryOp::Add), vec![product, bias])
}

/// The parameters of [`linear`] (and a residual `[rows, n]`), with operands of `dtype`.
fn inputs(dtype: DType, (rows, k, n): (usize, usize, usize)) -> Vec<HostData> {
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.5).collect()
    };
    let operand = |v: Vec<f32>| match dtype {
        DType::BF16 => HostData::BF16(v.into_iter().map(half::bf16::from_f32).collect()),
        _ => HostData::F32(v),
    };
    vec![
        operand(values(rows * k, 1)),
        operand(values(n * k, 2)),
        HostData::F32(values(n, 3)),
        HostData::F32(values(rows * n, 4)),
    ]
}

/// The outputs of `graph` on `backend`, and how many epilogues it ran.
fn run(backend: &dyn Backend, graph: &Graph, params: &[HostData]) -> (Vec<HostData>, usize) {
    let exe = backend.compile(&optimize(graph, None).unwrap()).unwrap();
    let inputs = params.iter().take(graph.num_params).map(|p| Arc::new(Buffer::new(p.clone()))).collect();
    let outputs = exe.run(inputs, &Default::default()).unwrap().iter().map(|b| b.wait().unwrap().clone()).collect();
    (outputs, exe.stats().epilogues)
}

fn floats(data: &HostData) -> Vec<f32> {
    match data {
        HostData::F32(v) => v.clone(),
        HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        other => panic!("unexpected {}", other.dtype()),
    }
}

/// Epilogues on and off give the same bits, the backend paired the matmul
/// with its epilogue, and both agree with the reference interpreter.
fn check(name: &str, graph: &Graph, dtype: DType, dims: (usize, usize, usize)) {
    let params = inputs(dtype, dims);
    let (paired, epilogues) = run(&CpuBackend::default().with_epilogues(true), graph, &params);
    let (separate, none) = run(&CpuBackend::default().with_epilogues(false), graph, &params);
    let bf16_kernel = std::is_x86_feature_detected!("avx512bf16");
    if dtype == DType::F32 || bf16_kernel {
        assert_eq!(epilogues, 1, "{name}: the matmul and its epilogue run as one kernel");
    }
    assert_eq!(none, 0, "{name}");
    for (k, (a, b)) in paired.iter().zip(&separate).enumerate() {
        assert_eq!(a.dtype(), b.dtype(), "{name} output {k}");
        let (a, b) = (floats(a), floats(b));
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name} output {k}: the epilogue changed the values");
    }
    let (reference, _) = run(&ReferenceBackend, graph, &params);
    for (k, (a, r)) in paired.iter().zip(&reference).enumerate() {
        let tolerance = if dtype == DType::F32 && a.dtype() == DType::F32 { 1e-4 } else { 2e-2 };
        for (i, (x, y)) in floats(a).iter().zip(floats(r)).enumerate() {
            assert!((x - y).abs() <= tolerance * (1.0 + y.abs()), "{name} output {k}[{i}]: {x} vs {y}");
        }
    }
}

#[test]
fn bias_add() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, DIMS);
    check("bias add", &b.finish(vec![y], 3), DType::F32, DIMS);
}

#[test]
fn gelu_and_its_saved_input() {
    let mut b = GraphBuilder::new();
    let h = linear(&mut b, DType::F32, DIMS);
    let half = scalar(&mut b, 0.5, &[ROWS, N]);
    let inv_sqrt2 = scalar(&mut b, std::f64::consts::FRAC_1_SQRT_2, &[ROWS, N]);
    let one = scalar(&mut b, 1.0, &[ROWS, N]);
    let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![h, inv_sqrt2]);
    let erf = node(&mut b, Op::Unary(UnaryOp::Erf), vec![scaled]);
    let shifted = node(&mut b, Op::Binary(BinaryOp::Add), vec![erf, one]);
    let halved = node(&mut b, Op::Binary(BinaryOp::Mul), vec![h, half]);
    let gelu = node(&mut b, Op::Binary(BinaryOp::Mul), vec![halved, shifted]);
    check("gelu", &b.finish(vec![gelu, h], 3), DType::F32, DIMS);
}

#[test]
fn residual_add() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, DIMS);
    let residual = param(&mut b, 3, &[ROWS, N], DType::F32);
    let sum = node(&mut b, Op::Binary(BinaryOp::Add), vec![y, residual]);
    check("residual add", &b.finish(vec![sum], 4), DType::F32, DIMS);
}

#[test]
fn bf16_cast() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, DIMS);
    let cast = shaped(&mut b, Op::Cast, y, &[ROWS, N], DType::BF16);
    check("bf16 cast", &b.finish(vec![cast], 3), DType::F32, DIMS);
}

#[test]
fn row_max_and_row_sum() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, DIMS);
    let max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![y]);
    let exp = node(&mut b, Op::Unary(UnaryOp::Exp), vec![y]);
    let sum = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![exp]);
    check("row max and sum", &b.finish(vec![max, sum, y], 3), DType::F32, DIMS);
}

#[test]
fn column_sums() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, DIMS);
    let residual = param(&mut b, 3, &[ROWS, N], DType::F32);
    let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![y, residual]);
    let sums = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, vec![scaled]);
    check("column sums", &b.finish(vec![sums, scaled], 4), DType::F32, DIMS);
}

#[test]
fn bf16_product() {
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::BF16, DIMS);
    check("bf16 product", &b.finish(vec![y], 3), DType::BF16, DIMS);
}

/// A linear layer with a shared dimension long enough that its transposed
/// weight is copied row-major once and each panel multiplies by the copy
/// (a product below the size whose routes are tried on the machine, so the
/// copy is planned from the first call): a residual add as its epilogue.
#[test]
fn residual_add_after_a_copied_weight() {
    let dims = (1100, 512, 48);
    let mut b = GraphBuilder::new();
    let y = linear(&mut b, DType::F32, dims);
    let residual = param(&mut b, 3, &[dims.0, dims.2], DType::F32);
    let sum = node(&mut b, Op::Binary(BinaryOp::Add), vec![y, residual]);
    check("residual add after a copied weight", &b.finish(vec![sum], 4), DType::F32, dims);
}

/// Autocast's feed-forward expansion: a bf16 product, its bias added in
/// f32 and rounded to bf16 (the value the backward pass reads, a graph
/// output here), then GELU of it rounded to bf16. The rounded value is its
/// own only copy, so the bias add, both roundings and the GELU are one
/// kernel, the product's epilogue, storing both values: on AVX-512 BF16
/// CPUs by a loop of its own, with the interpreter's bits.
#[test]
fn bf16_expansion_with_its_gelu() {
    let mut b = GraphBuilder::new();
    let biased = linear(&mut b, DType::BF16, DIMS);
    let h = shaped(&mut b, Op::Cast, biased, &[ROWS, N], DType::BF16);
    let wide = shaped(&mut b, Op::Cast, h, &[ROWS, N], DType::F32);
    let half = scalar(&mut b, 0.5, &[ROWS, N]);
    let inv_sqrt2 = scalar(&mut b, std::f64::consts::FRAC_1_SQRT_2, &[ROWS, N]);
    let one = scalar(&mut b, 1.0, &[ROWS, N]);
    let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![wide, inv_sqrt2]);
    let erf = node(&mut b, Op::Unary(UnaryOp::Erf), vec![scaled]);
    let shifted = node(&mut b, Op::Binary(BinaryOp::Add), vec![erf, one]);
    let cdf = node(&mut b, Op::Binary(BinaryOp::Mul), vec![shifted, half]);
    let gelu = node(&mut b, Op::Binary(BinaryOp::Mul), vec![wide, cdf]);
    let y = shaped(&mut b, Op::Cast, gelu, &[ROWS, N], DType::BF16);
    let graph = b.finish(vec![y, h], 3);
    let stats = CpuBackend::default().compile(&optimize(&graph, None).unwrap()).unwrap().stats();
    assert_eq!((stats.kernels, stats.fused_kernels), (2, 1), "the product and one fused kernel: {stats:?}");
    let loops = std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq");
    assert_eq!(stats.fast_paths, usize::from(loops), "the biased bf16 GELU loop: {stats:?}");
    check("bf16 expansion with its GELU", &graph, DType::BF16, DIMS);
    let params = inputs(DType::BF16, DIMS);
    let (looped, _) = run(&CpuBackend::default(), &graph, &params);
    let (interpreted, _) = run(&CpuBackend::default().with_fast_paths(false), &graph, &params);
    for (k, (a, b)) in looped.iter().zip(&interpreted).enumerate() {
        assert!(
            floats(a).iter().zip(floats(b)).all(|(x, y)| x.to_bits() == y.to_bits()),
            "output {k}: the loop's bits"
        );
    }
}
