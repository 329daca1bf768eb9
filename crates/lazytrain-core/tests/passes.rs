//! The compiler: pass structure, memory planning, IR dumps, the verifier, and
//! property tests that random graphs give the same values through the full
//! pipeline as through the reference interpreter.

use lazytrain_core::backend::{Backend, CpuBackend, ReferenceBackend};
use lazytrain_core::compile::{
    dead_code_elimination, fold_constant_indices, fold_constants, gather_from_operands, hoist_product_readers,
    optimize, order_small_nodes, reorder_casts, schedule_narrow_copies, simplify_algebra, split_scatter_sums,
};
use lazytrain_core::interp::interpret;
use lazytrain_core::ir::{
    infer, verify::verify, BinaryOp, CmpOp, Graph, GraphBuilder, Node, NodeId, Op, ReduceOp, UnaryOp,
};
use lazytrain_core::{Buffer, DType, HostData, Literal, Shape};
use proptest::prelude::*;
use std::sync::Arc;

mod common;
use common::{constant, derive, node, param};

/// `graph` optimised and run on the CPU backend.
fn run_compiled(graph: &Graph, params: &[HostData]) -> Vec<HostData> {
    run_on(&CpuBackend::default(), graph, params)
}

/// `graph` optimised and run on `backend`.
fn run_on(backend: &dyn Backend, graph: &Graph, params: &[HostData]) -> Vec<HostData> {
    let optimized = optimize(graph, None).unwrap();
    let exe = backend.compile(&optimized).unwrap();
    let inputs = params.iter().map(|p| Arc::new(Buffer::new(p.clone()))).collect();
    exe.run(inputs, &Default::default()).unwrap().iter().map(|b| b.wait().unwrap().clone()).collect()
}

fn kernels_after_optimize(graph: &Graph, fuse: bool) -> usize {
    CpuBackend::with_fusion(fuse).compile(&optimize(graph, None).unwrap()).unwrap().stats().kernels
}

#[test]
fn constants_fold_and_identities_vanish() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[2, 3]);
    let two = constant(&mut b, 2.0, &[2, 3]);
    let three = constant(&mut b, 3.0, &[2, 3]);
    let five = node(&mut b, Op::Binary(BinaryOp::Add), vec![two, three]);
    let four = constant(&mut b, 4.0, &[2, 3]);
    let one = node(&mut b, Op::Binary(BinaryOp::Sub), vec![five, four]);
    let zero = constant(&mut b, 0.0, &[2, 3]);
    let y = node(&mut b, Op::Binary(BinaryOp::Mul), vec![x, one]);
    let y = node(&mut b, Op::Binary(BinaryOp::Add), vec![y, zero]);
    let y = node(&mut b, Op::Permute(vec![1, 0]), vec![y]);
    let y = node(&mut b, Op::Permute(vec![1, 0]), vec![y]);
    let neg = node(&mut b, Op::Unary(UnaryOp::Neg), vec![y]);
    let y = node(&mut b, Op::Unary(UnaryOp::Neg), vec![neg]);
    let _unused = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let graph = b.finish(vec![y], 1);
    let optimized = optimize(&graph, None).unwrap();
    assert_eq!(
        optimized.nodes.len(),
        1,
        "x*((2+3)-4)+0 with a double transpose and double negation is x:\n{optimized}"
    );
    assert_eq!(optimized.outputs, vec![NodeId(0)]);
    let data = HostData::F32(vec![1.0, -2.0, 3.0, 4.0, 5.5, 6.0]);
    assert_eq!(run_compiled(&graph, std::slice::from_ref(&data)), vec![data]);
}

#[test]
fn each_pass_does_its_own_job() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[4]);
    let c = constant(&mut b, 1.0, &[4]);
    let c2 = node(&mut b, Op::Unary(UnaryOp::Exp), vec![c]);
    let y = node(&mut b, Op::Binary(BinaryOp::Mul), vec![x, c2]);
    let _dead = node(&mut b, Op::Unary(UnaryOp::Tanh), vec![x]);
    let g = b.finish(vec![y], 1);
    assert_eq!(dead_code_elimination(&g).nodes.len(), 4);
    let folded = fold_constants(&g);
    let e = std::f64::consts::E as f32 as f64;
    assert!(folded.nodes.iter().any(|n| matches!(n.op, Op::Constant(v) if (v.as_f64() - e).abs() < 1e-6)), "{folded}");
    assert_eq!(simplify_algebra(&g).nodes.len(), g.nodes.len(), "nothing to simplify without folding");
}

/// A float division by a broadcast value (a softmax's row sums through
/// `expand`, a scalar such as Adam's bias correction) becomes a product with
/// the value's reciprocal, within an ulp or so of the quotient; a division
/// of equal shapes and an integer division stay divisions.
#[test]
fn divisions_by_broadcast_values_become_products_with_reciprocals() {
    let (rows, cols) = (64, 48);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[rows, cols]);
    let s = param(&mut b, 1, &[rows, 1]);
    let scalar = param(&mut b, 2, &[1, 1]);
    let splat =
        b.push(Node { op: Op::Expand, inputs: vec![scalar], shape: Shape::new([rows, cols]), dtype: DType::F32 });
    let by_scalar = node(&mut b, Op::Binary(BinaryOp::Div), vec![x, splat]);
    let wide = b.push(Node { op: Op::Expand, inputs: vec![s], shape: Shape::new([rows, cols]), dtype: DType::F32 });
    let by_rows = node(&mut b, Op::Binary(BinaryOp::Div), vec![x, wide]);
    let same_shape = node(&mut b, Op::Binary(BinaryOp::Div), vec![x, by_rows]);
    let graph = b.finish(vec![by_scalar, by_rows, same_shape], 3);
    let simplified = simplify_algebra(&graph);
    verify(&simplified).unwrap();
    let count = |g: &Graph, op: Op| g.nodes.iter().filter(|n| n.op == op).count();
    assert_eq!(count(&simplified, Op::Binary(BinaryOp::Div)), 1, "only the equal-shape division:\n{simplified}");
    assert_eq!(count(&simplified, Op::Unary(UnaryOp::Recip)), 2, "the reciprocals:\n{simplified}");
    let params = [uniform_input(1, rows * cols), uniform_input(2, rows), uniform_input(3, 1)];
    let refs: Vec<&HostData> = params.iter().collect();
    let (exact, rewritten) = (interpret(&graph, &refs).unwrap(), interpret(&simplified, &refs).unwrap());
    for (k, (a, b)) in exact.iter().zip(&rewritten).enumerate() {
        let (HostData::F32(a), HostData::F32(b)) = (a, b) else { panic!("f32 outputs") };
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 2.0 * f32::EPSILON * x.abs(), "output {k}[{i}]: {x} vs {y}");
        }
    }

    let mut b = GraphBuilder::new();
    let i = b.push(Node { op: Op::Parameter(0), inputs: vec![], shape: Shape::new([rows, cols]), dtype: DType::I64 });
    let j = b.push(Node { op: Op::Parameter(1), inputs: vec![], shape: Shape::new([rows, 1]), dtype: DType::I64 });
    let j = b.push(Node { op: Op::Expand, inputs: vec![j], shape: Shape::new([rows, cols]), dtype: DType::I64 });
    let q = b.push(Node {
        op: Op::Binary(BinaryOp::Div),
        inputs: vec![i, j],
        shape: Shape::new([rows, cols]),
        dtype: DType::I64,
    });
    let integers = b.finish(vec![q], 2);
    assert_eq!(count(&simplify_algebra(&integers), Op::Binary(BinaryOp::Div)), 1, "integer division stays");
}

#[test]
fn composed_permutes_and_reshapes_collapse() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[2, 3, 4]);
    let p1 = node(&mut b, Op::Permute(vec![2, 0, 1]), vec![x]);
    let p2 = node(&mut b, Op::Permute(vec![0, 2, 1]), vec![p1]);
    let r1 = b.push(Node { op: Op::Reshape, inputs: vec![p2], shape: Shape::new([4, 6]), dtype: DType::F32 });
    let r2 = b.push(Node { op: Op::Reshape, inputs: vec![r1], shape: Shape::new([24]), dtype: DType::F32 });
    let g = b.finish(vec![r2], 1);
    let opt = optimize(&g, None).unwrap();
    assert_eq!(opt.nodes.len(), 3, "parameter, one permute, one reshape:\n{opt}");
    assert!(matches!(&opt.nodes[1].op, Op::Permute(p) if p == &vec![2, 1, 0]));
    let data = HostData::F32((0..24).map(|i| i as f32).collect());
    assert_eq!(run_compiled(&g, std::slice::from_ref(&data)), interpret(&g, &[&data]).unwrap());
    // A reshape round trip back to the original shape vanishes.
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[4, 6]);
    let r1 = b.push(Node { op: Op::Reshape, inputs: vec![x], shape: Shape::new([2, 2, 6]), dtype: DType::F32 });
    let r2 = b.push(Node { op: Op::Reshape, inputs: vec![r1], shape: Shape::new([4, 6]), dtype: DType::F32 });
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![r2]);
    let opt = optimize(&b.finish(vec![e], 1), None).unwrap();
    assert_eq!(opt.nodes.len(), 2, "parameter and exp:\n{opt}");
}

/// A concatenation reads a reshape of contiguous data in place (the heads'
/// gradients of GPT-2's split projection, joined): no copy kernel; a
/// permuted input still gets a buffer of its own first.
#[test]
fn concatenations_read_reshapes_of_contiguous_values_in_place() {
    for permuted in [false, true] {
        let mut b = GraphBuilder::new();
        let x = param(&mut b, 0, &[4, 6]);
        let y = param(&mut b, 1, &[4, 2, 3]);
        let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
        let part = match permuted {
            false => b.push(Node { op: Op::Reshape, inputs: vec![e], shape: Shape::new([4, 2, 3]), dtype: DType::F32 }),
            true => {
                let r =
                    b.push(Node { op: Op::Reshape, inputs: vec![e], shape: Shape::new([4, 3, 2]), dtype: DType::F32 });
                node(&mut b, Op::Permute(vec![0, 2, 1]), vec![r])
            }
        };
        let c = b.push(Node {
            op: Op::Concat { axis: 1 },
            inputs: vec![part, y],
            shape: Shape::new([4, 4, 3]),
            dtype: DType::F32,
        });
        let g = b.finish(vec![c], 2);
        if !permuted {
            assert_eq!(kernels_after_optimize(&g, true), 2, "exp and concat");
        }
        let data = [
            HostData::F32((0..24).map(|i| i as f32 * 0.1 - 1.0).collect()),
            HostData::F32((0..24).map(|i| 100.0 + i as f32).collect()),
        ];
        assert_eq!(run_compiled(&g, &data), interpret(&g, &[&data[0], &data[1]]).unwrap());
    }
}

/// An optimizer-like step: `m' = 0.1 g + 0.9 m`, `p' = p - m'` with the
/// gradient `g = x · w` materialised by a matmul and dying in the update.
/// Fed its own outputs as donated inputs, a recurring step allocates
/// nothing: the outputs leave in the donated inputs' memory, not in the
/// gradient's.
#[test]
fn steady_state_steps_allocate_nothing() {
    for fuse in [true, false] {
        let mut b = GraphBuilder::new();
        let p = param(&mut b, 0, &[64, 64]);
        let m = param(&mut b, 1, &[64, 64]);
        let x = param(&mut b, 2, &[64, 64]);
        let g = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![x, x]);
        let tenth = constant(&mut b, 0.1, &[64, 64]);
        let scaled_g = node(&mut b, Op::Binary(BinaryOp::Mul), vec![g, tenth]);
        let nine_tenths = constant(&mut b, 0.9, &[64, 64]);
        let scaled_m = node(&mut b, Op::Binary(BinaryOp::Mul), vec![m, nine_tenths]);
        let m_new = node(&mut b, Op::Binary(BinaryOp::Add), vec![scaled_g, scaled_m]);
        let p_new = node(&mut b, Op::Binary(BinaryOp::Sub), vec![p, m_new]);
        let mut graph = b.finish(vec![m_new, p_new], 3);
        graph.donated = vec![true, true, false];
        let exe = CpuBackend::with_fusion(fuse).compile(&graph).unwrap();
        let x = Arc::new(Buffer::new(HostData::F32((0..64 * 64).map(|i| (i % 7) as f32 * 0.01).collect())));
        let mut state = vec![HostData::F32(vec![1.0; 64 * 64]), HostData::F32(vec![0.0; 64 * 64])];
        let mut allocated = Vec::new();
        for _ in 0..4 {
            let [m, p] = state.clone().try_into().unwrap();
            let inputs = vec![Arc::new(Buffer::new(p)), Arc::new(Buffer::new(m)), x.clone()];
            let outputs = exe.run(inputs, &Default::default()).unwrap();
            let reference = run_compiled(&graph, &[state[1].clone(), state[0].clone(), x.wait().unwrap().clone()]);
            state = outputs.iter().map(|b| b.wait().unwrap().clone()).collect();
            assert_eq!(state, reference, "fuse {fuse}");
            allocated.push(exe.stats().allocated_bytes);
        }
        // The reference runs in between are other graphs, so after the first
        // run (a graph that has run once) the buffers are let go and the
        // second run allocates them again; from then on the graph recurs.
        assert!(allocated[0] >= 64 * 64 * 4, "the first run allocates the gradient's slot: {allocated:?}");
        assert_eq!(allocated[2], allocated[1], "fuse {fuse}: the third run allocates nothing: {allocated:?}");
        assert_eq!(allocated[3], allocated[1], "fuse {fuse}: nor does the fourth: {allocated:?}");
    }
}

/// Row sums and maxima of fused values are accumulated inside the fused
/// kernel, tile by tile, in the unfused reduction's order: the same bits,
/// for rows longer and shorter than a tile, of lengths that are not a
/// multiple of 8, and outputs big enough to be split between threads.
#[test]
fn reductions_fused_into_their_producers_match_the_unfused_bits() {
    for (rows, cols) in [(300, 1001), (7, 100), (3, 5000), (64, 8)] {
        let mut b = GraphBuilder::new();
        let x = param(&mut b, 0, &[rows, cols]);
        let half = constant(&mut b, 0.5, &[rows, cols]);
        let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![x, half]);
        let y = node(&mut b, Op::Unary(UnaryOp::Exp), vec![scaled]);
        let sum = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![y]);
        let max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![y]);
        let graph = b.finish(vec![sum, max, y], 1);
        let mut u = vec![0f32; rows * cols];
        lazytrain_core::random::uniform_f32(11, 0, &mut u);
        let input = HostData::F32(u.iter().map(|v| 6.0 * v - 3.0).collect());
        let run = |fuse: bool| {
            let exe = CpuBackend::with_fusion(fuse).compile(&graph).unwrap();
            let out = exe.run(vec![Arc::new(Buffer::new(input.clone()))], &Default::default()).unwrap();
            (exe.stats().kernels, out.iter().map(|b| b.wait().unwrap().clone()).collect::<Vec<_>>())
        };
        let (fused_kernels, fused) = run(true);
        let (_, unfused) = run(false);
        assert_eq!(fused, unfused, "{rows}x{cols}");
        assert_eq!(fused_kernels, 1, "{rows}x{cols}: one kernel computes y, its row sums and the maxima");
        let HostData::F32(sums) = &fused[0] else { panic!("f32 sums") };
        let HostData::F32(x) = &input else { unreachable!() };
        for (r, &s) in sums.iter().enumerate() {
            let exact: f64 = x[r * cols..(r + 1) * cols].iter().map(|&v| f64::from(v * 0.5).exp()).sum();
            assert!((f64::from(s) - exact).abs() <= 1e-5 * exact, "{rows}x{cols} row {r}: {s} vs {exact}");
        }
    }
}

/// The column sums of a scatter-add's result (a vocabulary bias gradient
/// under the cross-entropy's label updates) are split into the sums of the
/// scattered-into value, which then run in the kernel computing it, plus
/// the updates scattered into one row: the same sums (labels repeat, and
/// one row's update is zero), no reduction over the scattered result.
#[test]
fn column_sums_of_a_scatter_are_split_off_into_the_producer() {
    let (rows, cols) = (37, 300);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[rows, cols]);
    let index = b.push(Node { op: Op::Parameter(1), inputs: vec![], shape: Shape::new([rows, 1]), dtype: DType::I64 });
    let updates = param(&mut b, 2, &[rows, 1]);
    let half = constant(&mut b, 0.5, &[rows, cols]);
    let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![x, half]);
    let shape = Shape::new([rows, cols]);
    let scattered =
        b.push(Node { op: Op::ScatterAdd { axis: 1 }, inputs: vec![scaled, index, updates], shape, dtype: DType::F32 });
    let sums = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, vec![scattered]);
    let graph = b.finish(vec![sums, scattered], 3);

    let split = split_scatter_sums(&graph);
    let reduces_a_scatter = |g: &Graph| {
        g.nodes.iter().any(|n| {
            matches!(n.op, Op::Reduce { .. }) && matches!(g.nodes[n.inputs[0].index()].op, Op::ScatterAdd { .. })
        })
    };
    assert!(reduces_a_scatter(&graph) && !reduces_a_scatter(&split), "{split}");
    assert!(!reduces_a_scatter(&optimize(&graph, None).unwrap()), "the pipeline runs the pass");
    verify(&split).unwrap();

    let mut u = vec![0f32; rows * cols];
    lazytrain_core::random::uniform_f32(3, 0, &mut u);
    let labels: Vec<i64> = (0..rows).map(|r| (r * r % 7) as i64 * 41 % cols as i64).collect();
    let mut v: Vec<f32> = (0..rows).map(|r| r as f32 * 0.25 - 3.0).collect();
    v[5] = 0.0;
    let params = [HostData::F32(u.clone()), HostData::I64(labels.clone()), HostData::F32(v.clone())];
    let out = run_compiled(&graph, &params);
    let HostData::F32(got) = &out[0] else { panic!("f32 sums") };
    for (j, &g) in got.iter().enumerate() {
        let column: f64 = (0..rows).map(|r| f64::from(u[r * cols + j] * 0.5)).sum();
        let scattered: f64 = (0..rows).filter(|&r| labels[r] == j as i64).map(|r| f64::from(v[r])).sum();
        let exact = column + scattered;
        assert!((f64::from(g) - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "column {j}: {g} vs {exact}");
    }
    let reference = interpret(&graph, &params.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(out[1], reference[1], "the scattered result itself is unchanged");
}

/// The cross-entropy of `x · wᵀ + bias` over `[rows, vocab]` logits at
/// `labels`: the label logits gather from the product and the bias, not
/// from their sum, which is then never stored (the row max recomputes it
/// beside the max, the exponentials beside themselves); the same bits
/// fused and unfused, the interpreter's values.
#[test]
fn label_logits_gather_from_the_product_and_the_bias_which_are_not_added_in_memory() {
    let (rows, hidden, vocab) = (40, 8, 300);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[rows, hidden]);
    let w = param(&mut b, 1, &[vocab, hidden]);
    let bias = param(&mut b, 2, &[vocab]);
    let labels = b.push(Node { op: Op::Parameter(3), inputs: vec![], shape: Shape::new([rows, 1]), dtype: DType::I64 });
    let product = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![x, w]);
    let row = b.push(Node { op: Op::Reshape, inputs: vec![bias], shape: Shape::new([1, vocab]), dtype: DType::F32 });
    let bias = b.push(Node { op: Op::Expand, inputs: vec![row], shape: Shape::new([rows, vocab]), dtype: DType::F32 });
    let logits = node(&mut b, Op::Binary(BinaryOp::Add), vec![product, bias]);
    let max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![logits]);
    let max_rows =
        b.push(Node { op: Op::Expand, inputs: vec![max], shape: Shape::new([rows, vocab]), dtype: DType::F32 });
    let shifted = node(&mut b, Op::Binary(BinaryOp::Sub), vec![logits, max_rows]);
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![shifted]);
    let sum = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![e]);
    let picked = b.push(Node {
        op: Op::Gather { axis: 1 },
        inputs: vec![logits, labels],
        shape: Shape::new([rows, 1]),
        dtype: DType::F32,
    });
    let log_sum = node(&mut b, Op::Unary(UnaryOp::Log), vec![sum]);
    let lse = node(&mut b, Op::Binary(BinaryOp::Add), vec![log_sum, max]);
    let loss = node(&mut b, Op::Binary(BinaryOp::Sub), vec![lse, picked]);
    let graph = b.finish(vec![loss, e], 4);

    let gathers_a_sum = |g: &Graph| {
        g.nodes.iter().any(|n| {
            matches!(n.op, Op::Gather { .. }) && matches!(g.nodes[n.inputs[0].index()].op, Op::Binary(BinaryOp::Add))
        })
    };
    let rewritten = gather_from_operands(&graph);
    verify(&rewritten).unwrap();
    assert!(gathers_a_sum(&graph) && !gathers_a_sum(&rewritten), "{rewritten}");
    let optimized = optimize(&graph, None).unwrap();
    assert!(!gathers_a_sum(&optimized), "the pipeline runs the pass");

    // The sum is a member of two fused kernels and an output of neither.
    let schedule = lazytrain_core::schedule::Schedule::new(&optimized, &CpuBackend::default().capabilities());
    let adds: Vec<usize> = (0..optimized.nodes.len())
        .filter(|&i| {
            let n = &optimized.nodes[i];
            matches!(n.op, Op::Binary(BinaryOp::Add)) && n.shape.dims() == [rows, vocab]
        })
        .collect();
    assert_eq!(adds.len(), 1, "{optimized}");
    let groups = &schedule.fusion.groups;
    assert_eq!(groups.iter().filter(|g| g.members.contains(&adds[0])).count(), 2, "recomputed in two kernels");
    assert!(!groups.iter().any(|g| g.outputs.contains(&adds[0])), "never stored");

    let labels: Vec<i64> = (0..rows).map(|r| (r * 37 % vocab) as i64).collect();
    let params = [
        uniform_input(1, rows * hidden),
        uniform_input(2, vocab * hidden),
        uniform_input(3, vocab),
        HostData::I64(labels),
    ];
    let reference = interpret(&graph, &params.iter().collect::<Vec<_>>()).unwrap();
    let fused = run_compiled(&graph, &params);
    assert!(fused == run_on(&CpuBackend::with_fusion(false), &graph, &params), "fused and unfused: the same bits");
    assert!(fused.iter().zip(&reference).all(|(a, b)| close(a, b)), "the interpreter's values");
}

/// A loss's bookkeeping traced between two large kernels over the same rows
/// moves out of their way: what only the loss needs goes to the end, what
/// depends on inputs alone to the start; large values keep their order and
/// every value its bits.
#[test]
fn small_values_move_out_from_between_large_kernels() {
    let (rows, cols) = (300, 400);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[rows, cols]);
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let sums = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![e]);
    let logs = node(&mut b, Op::Unary(UnaryOp::Log), vec![sums]);
    let loss = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, vec![logs]);
    let weights = param(&mut b, 1, &[rows, 1]);
    let count = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, vec![weights]);
    let count = b.push(Node { op: Op::Expand, inputs: vec![count], shape: Shape::new([rows, 1]), dtype: DType::F32 });
    let scale = node(&mut b, Op::Binary(BinaryOp::Div), vec![weights, count]);
    // A value read twice by one reader.
    let scale = node(&mut b, Op::Binary(BinaryOp::Mul), vec![scale, scale]);
    let factor = node(&mut b, Op::Binary(BinaryOp::Div), vec![scale, sums]);
    let factor =
        b.push(Node { op: Op::Expand, inputs: vec![factor], shape: Shape::new([rows, cols]), dtype: DType::F32 });
    let grad = node(&mut b, Op::Binary(BinaryOp::Mul), vec![e, factor]);
    let graph = b.finish(vec![loss, grad], 2);

    let ordered = order_small_nodes(&graph);
    verify(&ordered).unwrap();
    let at = |g: &Graph, pick: &dyn Fn(&Node) -> bool| g.nodes.iter().position(pick).expect("present");
    let is = |op: Op, dims: &'static [usize]| move |n: &Node| n.op == op && n.shape.dims() == dims;
    let exp = |g: &Graph| at(g, &is(Op::Unary(UnaryOp::Exp), &[300, 400]));
    let mul = |g: &Graph| at(g, &is(Op::Binary(BinaryOp::Mul), &[300, 400]));
    let log = |g: &Graph| at(g, &is(Op::Unary(UnaryOp::Log), &[300, 1]));
    let squared_scale = |g: &Graph| at(g, &|n: &Node| n.op == Op::Binary(BinaryOp::Mul) && n.inputs[0] == n.inputs[1]);
    assert!(log(&graph) < mul(&graph) && squared_scale(&graph) > exp(&graph), "traced between the two:\n{graph}");
    assert!(log(&ordered) > mul(&ordered), "the loss's log after the gradient:\n{ordered}");
    assert!(squared_scale(&ordered) < exp(&ordered), "the input-only scale before the exponentials:\n{ordered}");
    let big =
        |g: &Graph| g.nodes.iter().filter(|n| n.shape.numel() > 1 << 16).map(|n| n.op.clone()).collect::<Vec<_>>();
    assert_eq!(big(&graph), big(&ordered), "large values keep their order");
    assert!(lazytrain_core::compile::PIPELINE.iter().any(|p| p.name == "order_small_nodes"));

    let params = [uniform_input(1, rows * cols), uniform_input(2, rows)];
    let refs: Vec<&HostData> = params.iter().collect();
    assert_eq!(interpret(&ordered, &refs).unwrap(), interpret(&graph, &refs).unwrap());
}

/// A product's elementwise readers (and the values of earlier ones they
/// need) move ahead of a weight-gradient matmul traced between them and the
/// product, never ahead of anything else: a backward-pass reader of a
/// forward value stays in the backward pass. Values keep their bits.
#[test]
fn product_readers_move_ahead_of_matmuls_only() {
    let (rows, k, n) = (64, 8, 16);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[rows, k]);
    let w = param(&mut b, 1, &[n, k]);
    let g = param(&mut b, 2, &[rows, n]);
    // Forward: a product and a reader of it.
    let h = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![x, w]);
    let u = node(&mut b, Op::Unary(UnaryOp::Exp), vec![h]);
    // Something of the forward pass that is not a matmul.
    let other = node(&mut b, Op::Unary(UnaryOp::Neg), vec![x]);
    // Backward: the input gradient, the weight gradient traced next, then
    // readers of the input gradient, one also needing `u * u` (traced after
    // the weight gradient, from a forward value).
    let dx = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![other, w]);
    let dw = node(&mut b, Op::Dot { lhs_t: true, rhs_t: false }, vec![g, x]);
    let square = node(&mut b, Op::Binary(BinaryOp::Mul), vec![u, u]);
    let scaled = node(&mut b, Op::Binary(BinaryOp::Mul), vec![dx, square]);
    let sums = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, vec![scaled]);
    let graph = b.finish(vec![dw, scaled, sums], 3);

    let hoisted = hoist_product_readers(&graph);
    verify(&hoisted).unwrap();
    let at = |g: &Graph, pick: &dyn Fn(&Node) -> bool| g.nodes.iter().position(pick).expect("present");
    let weight_gradient = |g: &Graph| at(g, &|n: &Node| n.op == Op::Dot { lhs_t: true, rhs_t: false });
    let square_at = |g: &Graph| at(g, &|n: &Node| n.op == Op::Binary(BinaryOp::Mul) && n.inputs[0] == n.inputs[1]);
    let sums_at = |g: &Graph| at(g, &|n: &Node| matches!(n.op, Op::Reduce { .. }));
    let neg_at = |g: &Graph| at(g, &|n: &Node| n.op == Op::Unary(UnaryOp::Neg));
    assert!(sums_at(&graph) > weight_gradient(&graph) && square_at(&graph) > weight_gradient(&graph));
    assert!(sums_at(&hoisted) < weight_gradient(&hoisted), "the readers and their sums first:\n{hoisted}");
    assert!(square_at(&hoisted) < weight_gradient(&hoisted), "with the value they need:\n{hoisted}");
    assert!(square_at(&hoisted) > neg_at(&hoisted), "but not into the forward pass:\n{hoisted}");
    assert!(lazytrain_core::compile::PIPELINE.iter().any(|p| p.name == "hoist_product_readers"));

    let params = [uniform_input(1, rows * k), uniform_input(2, n * k), uniform_input(3, rows * n)];
    let refs: Vec<&HostData> = params.iter().collect();
    assert_eq!(interpret(&hoisted, &refs).unwrap(), interpret(&graph, &refs).unwrap());
}

/// A value read by a node that has a group of its own for its row
/// reductions (and is computed again by the groups of its other readers):
/// the value is computed, or stored, before every one of those groups
/// reads it. First an f32 value (`tanh`, too dear to compute twice, read
/// by the scaled scores whose row maximum is taken beside them and by one
/// more reader); then a bf16 copy of a sum widened for a softmax.
#[test]
fn values_read_beside_row_reductions_are_there_when_read() {
    let (rows, cols) = (64, 128);
    let wide = |b: &mut GraphBuilder, rowwise: NodeId| {
        let column =
            b.push(Node { op: Op::Reshape, inputs: vec![rowwise], shape: Shape::new([rows, 1]), dtype: DType::F32 });
        b.push(Node { op: Op::Expand, inputs: vec![column], shape: Shape::new([rows, cols]), dtype: DType::F32 })
    };
    let softmax_parts = |b: &mut GraphBuilder, scores: NodeId| {
        let max = node(b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![scores]);
        let max = wide(b, max);
        let shifted = node(b, Op::Binary(BinaryOp::Sub), vec![scores, max]);
        node(b, Op::Unary(UnaryOp::Exp), vec![shifted])
    };
    let mut b = GraphBuilder::new();
    let a = param(&mut b, 0, &[rows, cols]);
    let t = node(&mut b, Op::Unary(UnaryOp::Tanh), vec![a]);
    let two = constant(&mut b, 2.0, &[rows, cols]);
    let scores = node(&mut b, Op::Binary(BinaryOp::Mul), vec![t, two]);
    let e = softmax_parts(&mut b, scores);
    let squared = node(&mut b, Op::Binary(BinaryOp::Mul), vec![t, t]);
    let tanh_graph = b.finish(vec![e, squared], 1);

    let mut b = GraphBuilder::new();
    let (x, y) = (param(&mut b, 0, &[rows, cols]), param(&mut b, 1, &[rows, cols]));
    let sum = node(&mut b, Op::Binary(BinaryOp::Add), vec![x, y]);
    let narrow = b.push(Node { op: Op::Cast, inputs: vec![sum], shape: Shape::new([rows, cols]), dtype: DType::BF16 });
    let widened =
        b.push(Node { op: Op::Cast, inputs: vec![narrow], shape: Shape::new([rows, cols]), dtype: DType::F32 });
    let e = softmax_parts(&mut b, widened);
    let total = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![e]);
    let total = wide(&mut b, total);
    let probabilities = node(&mut b, Op::Binary(BinaryOp::Div), vec![e, total]);
    let softmax_graph = b.finish(vec![probabilities], 2);

    for (name, graph) in [("tanh", tanh_graph), ("narrow copy", softmax_graph)] {
        let params: Vec<HostData> = (0..graph.num_params).map(|k| uniform_input(k as u64 + 1, rows * cols)).collect();
        let refs: Vec<&HostData> = params.iter().collect();
        let expected = interpret(&graph, &refs).unwrap();
        for (k, (a, b)) in expected.iter().zip(&run_compiled(&graph, &params)).enumerate() {
            assert!(close(a, b), "{name} output {k}: {a:?} vs {b:?}");
        }
    }
}

/// Under autocast a bf16 weight gradient is copied to f32 for the
/// optimizer right after it is computed: the input gradient's readers move
/// ahead of that copy as they move ahead of the weight gradient itself
/// (never ahead of a cast of anything but the matmuls they overtake).
/// Values keep their bits.
#[test]
fn product_readers_move_ahead_of_a_weight_gradient_and_its_f32_copy() {
    // A weight of 90 000 elements: not small, so its copy stays where traced.
    let (rows, k, n) = (64, 300, 300);
    // The input and weight gradients, then an f32 copy of the weight
    // gradient (or of the weight, which reads no matmul), then a reader of
    // the input gradient.
    let graph = |copy_of_weight_gradient: bool| {
        let mut b = GraphBuilder::new();
        let cast = |b: &mut GraphBuilder, x: NodeId, dtype: DType| {
            let shape = b.node(x).shape.clone();
            b.push(Node { op: Op::Cast, inputs: vec![x], shape, dtype })
        };
        let mut bf16_param = |index: usize, dims: &[usize]| {
            let p = param(&mut b, index, dims);
            cast(&mut b, p, DType::BF16)
        };
        let (x, w, g) = (bf16_param(0, &[rows, k]), bf16_param(1, &[n, k]), bf16_param(2, &[rows, n]));
        let dx = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![g, w]);
        let dw = node(&mut b, Op::Dot { lhs_t: true, rhs_t: false }, vec![g, x]);
        let copy = cast(&mut b, if copy_of_weight_gradient { dw } else { w }, DType::F32);
        let dx_f32 = cast(&mut b, dx, DType::F32);
        let squared = node(&mut b, Op::Binary(BinaryOp::Mul), vec![dx_f32, dx_f32]);
        b.finish(vec![dw, copy, squared], 3)
    };
    let at = |g: &Graph, pick: &dyn Fn(&Node) -> bool| g.nodes.iter().position(pick).expect("present");
    let weight_gradient = |g: &Graph| at(g, &|n: &Node| n.op == Op::Dot { lhs_t: true, rhs_t: false });
    let squared_at = |g: &Graph| at(g, &|n: &Node| n.op == Op::Binary(BinaryOp::Mul));

    let traced = graph(true);
    let hoisted = hoist_product_readers(&traced);
    verify(&hoisted).unwrap();
    assert!(squared_at(&traced) > weight_gradient(&traced) + 1, "traced after the copy:\n{traced}");
    assert!(squared_at(&hoisted) < weight_gradient(&hoisted), "the reader first:\n{hoisted}");
    let kept = hoist_product_readers(&graph(false));
    assert!(squared_at(&kept) > weight_gradient(&kept), "kept after the other cast:\n{kept}");

    let params = [uniform_input(1, rows * k), uniform_input(2, n * k), uniform_input(3, rows * n)];
    let refs: Vec<&HostData> = params.iter().collect();
    assert_eq!(interpret(&hoisted, &refs).unwrap(), interpret(&traced, &refs).unwrap());
}

/// `len` f32 values drawn uniformly from [0, 1) with `seed`.
fn uniform_input(seed: u64, len: usize) -> HostData {
    let mut v = vec![0f32; len];
    lazytrain_core::random::uniform_f32(seed, 0, &mut v);
    HostData::F32(v)
}

/// A gather along axis 0 of `x` with the constant index `row` everywhere
/// over `shape`: the gather and the index.
fn gather_rows(b: &mut GraphBuilder, x: NodeId, row: i64, shape: Shape) -> (NodeId, NodeId) {
    let literal = Literal::new(row as f64, DType::I64);
    let index = b.push(Node { op: Op::Constant(literal), inputs: vec![], shape: shape.clone(), dtype: DType::I64 });
    (b.push(Node { op: Op::Gather { axis: 0 }, inputs: vec![x, index], shape, dtype: DType::F32 }), index)
}

/// A gather and a scatter-add whose index is one constant (token types of
/// inputs without them) become a broadcast row and a sum padded into that
/// row: the reference interpreter's values, no gather or scatter left, and
/// an index past the axis is left for the kernel to report.
#[test]
fn constant_indices_fold_into_a_row_and_a_sum() {
    let (rows, cols, table) = (50, 6, 3);
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[table, cols]);
    let u = param(&mut b, 1, &[rows, cols]);
    let (picked, one) = gather_rows(&mut b, x, 1, Shape::new([rows, cols]));
    let zeros = constant(&mut b, 0.0, &[table, cols]);
    let table_shape = Shape::new([table, cols]);
    let grad = b.push(Node {
        op: Op::ScatterAdd { axis: 0 },
        inputs: vec![zeros, one, u],
        shape: table_shape.clone(),
        dtype: DType::F32,
    });
    let onto =
        b.push(Node { op: Op::ScatterAdd { axis: 0 }, inputs: vec![x, one, u], shape: table_shape, dtype: DType::F32 });
    let g = b.finish(vec![picked, grad, onto], 2);
    let folded = fold_constant_indices(&g);
    verify(&folded).unwrap();
    assert!(!folded.nodes.iter().any(|n| matches!(n.op, Op::Gather { .. } | Op::ScatterAdd { .. })), "{folded}");
    let params = [uniform_input(4, table * cols), uniform_input(5, rows * cols)];
    let reference = interpret(&g, &params.iter().collect::<Vec<_>>()).unwrap();
    let got = run_compiled(&g, &params);
    assert_eq!(got[0], reference[0], "the gathered rows are copies");
    assert!(got.iter().zip(&reference).all(|(a, b)| close(a, b)), "{got:?} vs {reference:?}");

    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[table, cols]);
    let (picked, _) = gather_rows(&mut b, x, 3, Shape::new([rows, cols]));
    let g = b.finish(vec![picked], 1);
    assert!(fold_constant_indices(&g).nodes.iter().any(|n| matches!(n.op, Op::Gather { .. })));
}

/// bf16 widened to f32 and narrowed back is the bf16 value itself (autocast
/// casting a merged-heads value the model holds in f32 back for a matmul):
/// the two casts go. f32 narrowed to bf16 and widened back rounds, so
/// those two stay.
#[test]
fn a_narrow_value_widened_and_narrowed_back_is_itself() {
    let mut b = GraphBuilder::new();
    let x = b.push(Node { op: Op::Parameter(0), inputs: vec![], shape: Shape::new([4, 8]), dtype: DType::BF16 });
    let y = param(&mut b, 1, &[4, 8]);
    let wide = cast(&mut b, x, DType::F32);
    let back = cast(&mut b, wide, DType::BF16);
    let rounded = cast(&mut b, y, DType::BF16);
    let widened = cast(&mut b, rounded, DType::F32);
    let g = b.finish(vec![back, widened], 2);
    let out = dead_code_elimination(&reorder_casts(&g));
    assert_eq!(out.outputs[0], NodeId(0), "the parameter itself: {out}");
    assert_eq!(out.nodes.iter().filter(|n| n.op == Op::Cast).count(), 2, "f32 -> bf16 -> f32 rounds: {out}");
}

/// Folding integer constants keeps every bit (3 * 3002399751580331 =
/// 2^53 + 1, which f64 cannot hold), and an empty reduction folds to its
/// identity.
#[test]
fn integer_constants_fold_exactly_and_empty_reductions_to_their_identity() {
    let int = |b: &mut GraphBuilder, v: i64| {
        b.push(Node { op: Op::Constant(Literal::Int(v)), inputs: vec![], shape: Shape::new([2]), dtype: DType::I64 })
    };
    let mut b = GraphBuilder::new();
    let (three, big) = (int(&mut b, 3), int(&mut b, 3_002_399_751_580_331));
    let product = node(&mut b, Op::Binary(BinaryOp::Mul), vec![three, big]);
    let x = param(&mut b, 0, &[3, 0]);
    let max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![x]);
    let graph = b.finish(vec![product, max], 1);
    let folded = fold_constants(&graph);
    let op_of = |id: NodeId| &folded.nodes[id.index()].op;
    assert_eq!(op_of(folded.outputs[0]), &Op::Constant(Literal::Int((1 << 53) + 1)));
    assert_eq!(op_of(folded.outputs[1]), &Op::Constant(Literal::Float(f64::NEG_INFINITY.to_bits())));
}

/// Row reductions over an empty axis, fused into their producer or not,
/// write the identity: 0 for sums, -inf for maxima.
#[test]
fn reductions_over_an_empty_axis_write_the_identity() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[5, 0]);
    let y = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let sum = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![y]);
    let max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![y]);
    let plain_max = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![x]);
    let graph = b.finish(vec![sum, max, plain_max], 1);
    for fuse in [true, false] {
        let exe = CpuBackend::with_fusion(fuse).compile(&graph).unwrap();
        let out = exe.run(vec![Arc::new(Buffer::new(HostData::F32(Vec::new())))], &Default::default()).unwrap();
        let values: Vec<HostData> = out.iter().map(|b| b.wait().unwrap().clone()).collect();
        let minus_inf = HostData::F32(vec![f32::NEG_INFINITY; 5]);
        assert_eq!(values, [HostData::F32(vec![0.0; 5]), minus_inf.clone(), minus_inf], "fuse {fuse}");
    }
}

/// A graph that has run once (like the first training step, which creates
/// the optimizer state) does not keep its intermediate buffers once another
/// graph runs on the same device: it hands them to that graph, whose first
/// run fills its slots with them instead of allocating; graphs that recur
/// keep theirs for their next run; and what runs on another device
/// (another backend instance) takes nothing from here.
#[test]
fn one_off_graphs_release_their_buffers_when_another_graph_runs() {
    let device = CpuBackend::default();
    let other_device = CpuBackend::default();
    let exp_chain = |op: UnaryOp| {
        let mut b = GraphBuilder::new();
        let x = param(&mut b, 0, &[256, 256]);
        let m = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![x, x]);
        let y = node(&mut b, Op::Unary(op), vec![m]);
        let s = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, vec![y]);
        let graph = b.finish(vec![s], 1);
        device.compile(&graph).unwrap()
    };
    let (once, recurring, elsewhere) = (exp_chain(UnaryOp::Tanh), exp_chain(UnaryOp::Exp), exp_chain(UnaryOp::Neg));
    let input = || vec![Arc::new(Buffer::new(HostData::F32(vec![0.01; 256 * 256])))];
    let context = Default::default();
    device.execute(&*once, input(), &context).unwrap();
    other_device.execute(&*elsewhere, input(), &context).unwrap();
    assert!(once.stats().kept_bytes >= 256 * 256 * 4, "another device's run takes nothing from here");
    let product_bytes = 256 * 256 * 4;
    assert!(elsewhere.stats().allocated_bytes >= product_bytes, "the other device's graph had nothing to take");
    device.execute(&*recurring, input(), &context).unwrap();
    assert_eq!(once.stats().kept_bytes, 0, "a graph that ran once lets go when another runs");
    assert!(
        recurring.stats().allocated_bytes < product_bytes,
        "the next graph took the product's buffer over: {} bytes allocated",
        recurring.stats().allocated_bytes
    );
    device.execute(&*recurring, input(), &context).unwrap();
    device.execute(&*once, input(), &context).unwrap();
    assert!(recurring.stats().kept_bytes >= product_bytes, "a recurring graph keeps its buffers");
}

/// A reduction of a reshape of contiguous data (a bias gradient summing the
/// rows of a `[batch, seq, features]` gradient) reads the data in place:
/// no copy kernel for the reshape.
#[test]
fn reductions_read_reshapes_of_contiguous_data_in_place() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[4, 8, 16]);
    let y = node(&mut b, Op::Unary(UnaryOp::Neg), vec![x]);
    let rows = b.push(Node { op: Op::Reshape, inputs: vec![y], shape: Shape::new([32, 16]), dtype: DType::F32 });
    let sum = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, vec![rows]);
    let graph = b.finish(vec![sum], 1);
    let input = HostData::F32((0..512).map(|i| (i % 13) as f32 - 6.0).collect());
    let fused = CpuBackend::default().compile(&graph).unwrap();
    assert_eq!(fused.stats().kernels, 2, "-x, then the column sums read its buffer as [32, 16]");
    let run = |exe: &std::sync::Arc<dyn lazytrain_core::backend::Executable>| {
        exe.run(vec![Arc::new(Buffer::new(input.clone()))], &Default::default()).unwrap()[0].wait().unwrap().clone()
    };
    let unfused = CpuBackend::with_fusion(false).compile(&graph).unwrap();
    assert_eq!(run(&fused), run(&unfused));
    let HostData::F32(sums) = run(&fused) else { panic!("f32") };
    let HostData::F32(x) = &input else { unreachable!() };
    for (j, &s) in sums.iter().enumerate() {
        assert_eq!(s, (0..32).map(|r| -x[r * 16 + j]).sum::<f32>(), "column {j}");
    }
}

#[test]
fn memory_plan_reuses_dead_buffers() {
    let mut b = GraphBuilder::new();
    let mut y = param(&mut b, 0, &[1000]);
    for i in 0..10 {
        let op = if i % 2 == 0 { UnaryOp::Tanh } else { UnaryOp::Exp };
        y = node(&mut b, Op::Unary(op), vec![y]);
    }
    let g = b.finish(vec![y], 1);
    let unfused = CpuBackend::with_fusion(false);
    let stats = unfused.compile(&g).unwrap().stats();
    assert_eq!(stats.kernels, 10);
    assert_eq!(stats.in_place, 9, "every op after the first overwrites its dying input");
    assert_eq!(stats.buffers, 1);
    assert_eq!(stats.planned_bytes, 4000);
    assert_eq!(stats.unplanned_bytes, 10 * 4000);
    // A value read twice cannot be overwritten by its first reader.
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[1000]);
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let t = node(&mut b, Op::Unary(UnaryOp::Tanh), vec![e]);
    let s = node(&mut b, Op::Binary(BinaryOp::Add), vec![t, e]);
    let g = b.finish(vec![s], 1);
    let stats = unfused.compile(&g).unwrap().stats();
    assert_eq!((stats.in_place, stats.buffers), (1, 2), "tanh keeps exp's buffer alive; add overwrites one of them");
    let fused = CpuBackend::default().compile(&g).unwrap().stats();
    assert_eq!((fused.kernels, fused.fused_kernels, fused.buffers), (1, 1, 1), "one kernel, only its output in memory");
    assert_eq!(fused.planned_bytes, 4000);
}

#[test]
fn kernel_counts_follow_the_ir() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[2, 3]);
    let m = node(&mut b, Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, vec![x]);
    let mb = b.push(Node { op: Op::Expand, inputs: vec![m], shape: Shape::new([2, 3]), dtype: DType::F32 });
    let s = node(&mut b, Op::Binary(BinaryOp::Sub), vec![x, mb]);
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![s]);
    let g = b.finish(vec![e], 1);
    assert_eq!(kernels_after_optimize(&g, false), 4, "max, expand, sub, exp");
    assert_eq!(kernels_after_optimize(&g, true), 2, "max, then sub+exp reading the max through a broadcast");
}

/// Merged attention heads (a permute of `[b, h, s, d]` read as `[b*s, h*d]`
/// by a matmul and as `[b, s, h*d]` by a bias-gradient sum): the permute is
/// copied once and both reshapes read that copy in place (they were copies
/// of their own, reading the permute as a view).
#[test]
fn reshapes_of_a_copied_permute_are_views_of_the_copy() {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[2, 3, 4, 5]);
    let w = param(&mut b, 1, &[15, 6]);
    let merged = node(&mut b, Op::Permute(vec![0, 2, 1, 3]), vec![x]);
    let rows = b.push(Node { op: Op::Reshape, inputs: vec![merged], shape: Shape::new([8, 15]), dtype: DType::F32 });
    let projected = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![rows, w]);
    let batched =
        b.push(Node { op: Op::Reshape, inputs: vec![merged], shape: Shape::new([2, 4, 15]), dtype: DType::F32 });
    let sums = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, vec![batched]);
    let g = b.finish(vec![projected, sums], 2);
    assert_eq!(kernels_after_optimize(&g, false), 5, "permute, two reshapes, matmul, sum");
    assert_eq!(kernels_after_optimize(&g, true), 3, "the permute's copy, the matmul and the sum");
    let params = [uniform_input(1, 120), uniform_input(2, 90)];
    let reference = interpret(&g, &params.iter().collect::<Vec<_>>()).unwrap();
    let got = run_compiled(&g, &params);
    assert!(got.iter().zip(&reference).all(|(a, b)| close(a, b)), "{got:?} vs {reference:?}");
}

fn cast(b: &mut GraphBuilder, x: NodeId, dtype: DType) -> NodeId {
    let shape = b.node(x).shape.clone();
    b.push(Node { op: Op::Cast, inputs: vec![x], shape, dtype })
}

/// `h = exp(x)`, read by a forward op and, after a long chain of other
/// work, again (by a row sum): directly, or through a bf16 round trip (how
/// autodiff reads an activation saved in bf16).
fn late_reader_graph(round_trip: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[64, 64]);
    let h = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let forward = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, vec![h]);
    let mut late = node(&mut b, Op::Unary(UnaryOp::Tanh), vec![x]);
    for _ in 0..4 {
        late = node(&mut b, Op::Unary(UnaryOp::Tanh), vec![late]);
        late = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![late]);
        late = b.push(Node { op: Op::Reshape, inputs: vec![late], shape: Shape::new([64, 1]), dtype: DType::F32 });
        late = b.push(Node { op: Op::Expand, inputs: vec![late], shape: Shape::new([64, 64]), dtype: DType::F32 });
        late = node(&mut b, Op::Unary(UnaryOp::Exp), vec![late]);
    }
    let read = if round_trip {
        let narrow = cast(&mut b, h, DType::BF16);
        cast(&mut b, narrow, DType::F32)
    } else {
        h
    };
    let product = node(&mut b, Op::Binary(BinaryOp::Mul), vec![late, read]);
    let out = node(&mut b, Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, vec![product]);
    b.finish(vec![forward, out], 1)
}

/// The narrow copy is scheduled right after its value and written by the
/// value's kernel, so the f32 value dies with its forward reader: the plan
/// keeps only the bf16 copy for the late reader.
#[test]
fn narrow_copies_are_made_where_their_value_is_computed() {
    let g = late_reader_graph(true);
    let scheduled = schedule_narrow_copies(&g);
    verify(&scheduled).unwrap();
    let position = |pred: &dyn Fn(&Node) -> bool| scheduled.nodes.iter().position(pred).unwrap();
    let exp_at = position(&|n| n.op == Op::Unary(UnaryOp::Exp));
    let copy_at = position(&|n| n.op == Op::Cast && n.dtype == DType::BF16);
    assert_eq!(copy_at, exp_at + 1, "{scheduled}");
    let values: Vec<f32> = (0..64 * 64).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let params = [HostData::F32(values)];
    let expected = interpret(&g, &[&params[0]]).unwrap();
    for (a, b) in expected.iter().zip(&run_compiled(&g, &params)) {
        assert!(close(a, b), "{a:?} vs {b:?}");
    }
    let peak = |g: &Graph| CpuBackend::default().compile(&optimize(g, None).unwrap()).unwrap().stats().peak_bytes;
    let (narrow, direct) = (peak(&g), peak(&late_reader_graph(false)));
    assert_eq!(direct - narrow, 64 * 64 * 2, "the late reader keeps half the bytes: {narrow} vs {direct}");
}

#[test]
fn ir_dumps_before_and_after_every_pass() {
    let dir = std::env::temp_dir().join(format!("lazytrain-dump-{}", std::process::id()));
    let mut b = GraphBuilder::new();
    let x = param(&mut b, 0, &[2]);
    let y = node(&mut b, Op::Unary(UnaryOp::Exp), vec![x]);
    let g = b.finish(vec![y], 1);
    optimize(&g, Some(&dir)).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 1 + lazytrain_core::compile::PIPELINE.len());
    assert!(names[0].ends_with("-00-input.txt") && names[1].ends_with("-01-dead_code_elimination.txt"), "{names:?}");
    let text = std::fs::read_to_string(dir.join(&names[0])).unwrap();
    assert!(text.contains("%1: f32[2] = exp %0") && text.contains("return %1"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn verifier_rejects_broken_graphs() {
    let bad_shape = Graph {
        nodes: vec![
            Node { op: Op::Parameter(0), inputs: vec![], shape: Shape::new([2]), dtype: DType::F32 },
            Node { op: Op::Unary(UnaryOp::Exp), inputs: vec![NodeId(0)], shape: Shape::new([3]), dtype: DType::F32 },
        ],
        outputs: vec![NodeId(1)],
        num_params: 1,
        donated: vec![false],
    };
    assert!(verify(&bad_shape).unwrap_err().contains("exp records f32[3]"));
    let forward_ref = Graph {
        nodes: vec![Node {
            op: Op::Unary(UnaryOp::Exp),
            inputs: vec![NodeId(0)],
            shape: Shape::new([2]),
            dtype: DType::F32,
        }],
        outputs: vec![NodeId(0)],
        num_params: 0,
        donated: vec![],
    };
    assert!(verify(&forward_ref).unwrap_err().contains("does not precede"));
}

/// One random instruction: an op choice and operand picks.
#[derive(Clone, Debug)]
struct Instr {
    op: u8,
    a: usize,
    b: usize,
    c: usize,
}

fn build_random_graph(instrs: &[Instr], extra_outputs: &[usize]) -> Graph {
    let mut b = GraphBuilder::new();
    let mut pool = vec![param(&mut b, 0, &[2, 3]), param(&mut b, 1, &[2, 3]), param(&mut b, 2, &[3, 2])];
    pool.push(constant(&mut b, 1.0, &[2, 3]));
    pool.push(constant(&mut b, 0.0, &[3, 2]));
    for ins in instrs {
        let pick = |k: usize| pool[k % pool.len()];
        let (x, y, z) = (pick(ins.a), pick(ins.b), pick(ins.c));
        let xs = b.node(x).shape.clone();
        let (op, inputs, explicit): (Op, Vec<NodeId>, Option<Shape>) = match ins.op % 16 {
            0 => (Op::Unary(UnaryOp::Tanh), vec![x], None),
            1 => (Op::Unary(UnaryOp::Exp), vec![x], None),
            2 => (Op::Unary(UnaryOp::Neg), vec![x], None),
            3 => (Op::Binary(BinaryOp::Add), vec![x, y], None),
            4 => (Op::Binary(BinaryOp::Mul), vec![x, y], None),
            5 => (Op::Binary(BinaryOp::Max), vec![x, y], None),
            6 => (Op::Reduce { op: ReduceOp::Sum, axes: vec![ins.b % xs.rank().max(1)] }, vec![x], None),
            7 => (Op::Reduce { op: ReduceOp::Max, axes: vec![ins.b % xs.rank().max(1)] }, vec![x], None),
            8 => (Op::Permute((0..xs.rank()).rev().collect()), vec![x], None),
            9 => (Op::Reshape, vec![x], Some(Shape::new([xs.numel()]))),
            10 => {
                let target: Vec<usize> = xs.dims().iter().map(|&d| if d == 1 { 3 } else { d }).collect();
                (Op::Expand, vec![x], Some(Shape::new(target)))
            }
            11 => (Op::Dot { lhs_t: ins.c % 2 == 1, rhs_t: ins.b % 2 == 1 }, vec![x, y], None),
            12 => (Op::Concat { axis: 0 }, vec![x, y], None),
            13 => (
                Op::Pad { low: vec![1; xs.rank()], high: vec![0; xs.rank()], value: Literal::new(0.5, DType::F32) },
                vec![x],
                None,
            ),
            14 => {
                let cmp = b.node(x).shape == b.node(y).shape;
                if !cmp {
                    continue;
                }
                let c = node(&mut b, Op::Compare(CmpOp::Gt), vec![x, y]);
                (Op::Select, vec![c, y, z], None)
            }
            _ => {
                let sizes: Vec<usize> = xs.dims().iter().map(|&d| d.div_ceil(2)).collect();
                (Op::Slice { starts: vec![0; xs.rank()] }, vec![x], Some(Shape::new(sizes)))
            }
        };
        let metas: Vec<_> = inputs.iter().map(|i| (&b.node(*i).shape, b.node(*i).dtype)).collect();
        let derived = match &explicit {
            Some(shape) => match &op {
                Op::Reshape => infer::reshape(metas[0], shape),
                Op::Expand => infer::expand(metas[0], shape),
                Op::Slice { starts } => infer::slice(metas[0], starts, shape.dims()),
                _ => unreachable!(),
            },
            None => derive(&op, &metas),
        };
        if let Ok((shape, dtype)) = derived {
            if shape.numel() <= 4096 {
                pool.push(b.push(Node { op, inputs, shape, dtype }));
            }
        }
    }
    let mut outputs = vec![*pool.last().unwrap()];
    outputs.extend(extra_outputs.iter().map(|k| pool[k % pool.len()]));
    b.finish(outputs, 3)
}

fn close(a: &HostData, b: &HostData) -> bool {
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    a.dtype() == b.dtype()
        && x.len() == y.len()
        && x.iter()
            .zip(&y)
            .all(|(p, q)| (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn optimized_graphs_match_the_interpreter(
        instrs in prop::collection::vec((any::<u8>(), 0usize..64, 0usize..64, 0usize..64).prop_map(|(op, a, b, c)| Instr { op, a, b, c }), 1..24),
        extra in prop::collection::vec(0usize..64, 0..3),
        data in prop::collection::vec(-2.0f32..2.0, 18),
        donated in any::<[bool; 3]>(),
    ) {
        let mut graph = build_random_graph(&instrs, &extra);
        graph.donated = donated.to_vec();
        prop_assert!(verify(&graph).is_ok());
        let params = vec![
            HostData::F32(data[0..6].to_vec()),
            HostData::F32(data[6..12].to_vec()),
            HostData::F32(data[12..18].to_vec()),
        ];
        let refs: Vec<&HostData> = params.iter().collect();
        let expected = interpret(&graph, &refs).unwrap();
        // The optimised graph on both backends (the same schedule interface,
        // fused and unfused; the CPU also with every row chain run by blocks
        // of rows) against the unoptimised graph.
        let chained = CpuBackend::default().with_row_chains(Some(0));
        for got in [run_compiled(&graph, &params), run_on(&chained, &graph, &params), run_on(&ReferenceBackend, &graph, &params)] {
            prop_assert_eq!(expected.len(), got.len());
            for (e, g) in expected.iter().zip(&got) {
                prop_assert!(close(g, e), "graph:\n{}\nexpected {:?}\ngot {:?}", graph, e, g);
            }
        }
    }
}

#[test]
fn a_scatter_into_zeros_added_to_a_value_scatters_into_the_value() {
    let mut b = GraphBuilder::new();
    let y = param(&mut b, 0, &[3, 4]);
    let index = b.push(Node { op: Op::Parameter(1), inputs: vec![], shape: Shape::new([3, 1]), dtype: DType::I64 });
    let updates = param(&mut b, 2, &[3, 1]);
    let zeros = constant(&mut b, 0.0, &[3, 4]);
    let scatter = b.push(Node {
        op: Op::ScatterAdd { axis: 1 },
        inputs: vec![zeros, index, updates],
        shape: Shape::new([3, 4]),
        dtype: DType::F32,
    });
    let sum = node(&mut b, Op::Binary(BinaryOp::Add), vec![scatter, y]);
    let g = b.finish(vec![sum], 3);
    let opt = optimize(&g, None).unwrap();
    assert!(!opt.nodes.iter().any(|n| matches!(n.op, Op::Constant(_))), "no dense zeros:\n{opt}");
    assert_eq!(opt.nodes.iter().filter(|n| matches!(n.op, Op::ScatterAdd { .. })).count(), 1);
    let params = [
        HostData::F32((0..12).map(|i| i as f32 * 0.5).collect()),
        HostData::I64(vec![3, 0, 2]),
        HostData::F32(vec![10.0, 20.0, 30.0]),
    ];
    let expected: Vec<f32> = vec![0.0, 0.5, 1.0, 11.5, 22.0, 2.5, 3.0, 3.5, 4.0, 4.5, 35.0, 5.5];
    assert_eq!(run_compiled(&g, &params), vec![HostData::F32(expected)]);
}
