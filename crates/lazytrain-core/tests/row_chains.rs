//! Row chains: consecutive fused kernels over the same rows (a log-softmax
//! and its gradient: add and row max, exp and row sum, the reciprocal of
//! each row's sum, the normalised rows and their column sums) give the same
//! bits run a block of rows at a time as run one after the other, and the
//! CPU backend really chains them; a kernel reading an earlier one's value
//! outside its own rows is not chained.

use lazytrain_core::backend::{Backend, CpuBackend, ReferenceBackend};
use lazytrain_core::compile::optimize;
use lazytrain_core::ir::{BinaryOp, Graph, GraphBuilder, Node, NodeId, Op, ReduceOp, UnaryOp};
use lazytrain_core::schedule::Schedule;
use lazytrain_core::{Buffer, DType, HostData, Shape};
use std::sync::Arc;

mod common;
use common::{constant, node, param};

fn shaped(b: &mut GraphBuilder, op: Op, input: NodeId, dims: &[usize]) -> NodeId {
    b.push(Node { op, inputs: vec![input], shape: Shape::new(dims), dtype: DType::F32 })
}

fn reduce(b: &mut GraphBuilder, op: ReduceOp, x: NodeId, axis: usize) -> NodeId {
    node(b, Op::Reduce { op, axes: vec![axis] }, vec![x])
}

/// `x` broadcast to `dims`.
fn expand(b: &mut GraphBuilder, x: NodeId, dims: &[usize]) -> NodeId {
    shaped(b, Op::Expand, x, dims)
}

/// Where the logits come from.
#[derive(Clone, Copy, PartialEq)]
enum Logits {
    /// A parameter.
    Given,
    /// A parameter, and the exponentials also subtract the logits
    /// transposed (rows == cols), which reads other rows.
    TransposedRead,
    /// A matmul product (`[rows, 8] x [cols, 8]ᵀ`), in whose buffer the
    /// exponentials are written once the row maximum has read it.
    Product,
}

/// Log-softmax of `x + bias` over rows of `[rows, cols]` and its gradient
/// for a loss summing the probabilities scaled by `scale`: outputs the
/// gradient, its column sums, each row's maximum and each row's sum.
fn softmax_graph(rows: usize, cols: usize, source: Logits) -> Graph {
    let mut b = GraphBuilder::new();
    let transposed_read = source == Logits::TransposedRead;
    let x = match source {
        Logits::Given | Logits::TransposedRead => param(&mut b, 0, &[rows, cols]),
        Logits::Product => {
            let a = param(&mut b, 0, &[rows, 8]);
            let w = param(&mut b, 3, &[cols, 8]);
            node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![a, w])
        }
    };
    let bias = param(&mut b, 1, &[cols]);
    let scale = param(&mut b, 2, &[rows, 1]);
    let bias_row = shaped(&mut b, Op::Reshape, bias, &[1, cols]);
    let bias = expand(&mut b, bias_row, &[rows, cols]);
    let logits = node(&mut b, Op::Binary(BinaryOp::Add), vec![x, bias]);
    let max = reduce(&mut b, ReduceOp::Max, logits, 1);
    let max_rows = expand(&mut b, max, &[rows, cols]);
    let mut shifted = node(&mut b, Op::Binary(BinaryOp::Sub), vec![logits, max_rows]);
    if transposed_read {
        let across = node(&mut b, Op::Permute(vec![1, 0]), vec![logits]);
        shifted = node(&mut b, Op::Binary(BinaryOp::Sub), vec![shifted, across]);
    }
    let e = node(&mut b, Op::Unary(UnaryOp::Exp), vec![shifted]);
    let sum = reduce(&mut b, ReduceOp::Sum, e, 1);
    let one = constant(&mut b, 1.0, &[rows, 1]);
    let inverse = node(&mut b, Op::Binary(BinaryOp::Div), vec![one, sum]);
    let factor = node(&mut b, Op::Binary(BinaryOp::Mul), vec![inverse, scale]);
    let factor_rows = expand(&mut b, factor, &[rows, cols]);
    let grad = node(&mut b, Op::Binary(BinaryOp::Mul), vec![e, factor_rows]);
    let columns = reduce(&mut b, ReduceOp::Sum, grad, 0);
    let params = if source == Logits::Product { 4 } else { 3 };
    b.finish(vec![grad, columns, max, sum], params)
}

/// `len` deterministic values in `[-spread, spread]`, varied by `salt`.
fn values(len: usize, salt: usize, spread: f32) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * spread).collect()
}

fn inputs(rows: usize, cols: usize, logits: Logits) -> Vec<HostData> {
    match logits {
        Logits::Given | Logits::TransposedRead => vec![
            HostData::F32(values(rows * cols, 1, 6.0)),
            HostData::F32(values(cols, 2, 1.0)),
            HostData::F32(values(rows, 3, 2.0)),
        ],
        Logits::Product => vec![
            HostData::F32(values(rows * 8, 1, 1.0)),
            HostData::F32(values(cols, 2, 1.0)),
            HostData::F32(values(rows, 3, 2.0)),
            HostData::F32(values(cols * 8, 4, 1.0)),
        ],
    }
}

/// The outputs of `graph` on `backend`, and how many row chains it ran.
fn run(backend: &dyn Backend, graph: &Graph, params: &[HostData]) -> (Vec<Vec<f32>>, usize) {
    let exe = backend.compile(&optimize(graph, None).unwrap()).unwrap();
    let inputs = params.iter().map(|p| Arc::new(Buffer::new(p.clone()))).collect();
    let outputs = exe
        .run(inputs, &Default::default())
        .unwrap()
        .iter()
        .map(|b| match b.wait().unwrap() {
            HostData::F32(v) => v.clone(),
            other => panic!("unexpected {}", other.dtype()),
        })
        .collect();
    (outputs, exe.stats().row_chains)
}

/// Chained and unchained runs give the same bits and agree with the
/// reference interpreter; returns how many kernels each chain the chained
/// run ran has.
fn check(name: &str, rows: usize, cols: usize, logits: Logits) -> Vec<usize> {
    let graph = softmax_graph(rows, cols, logits);
    let params = inputs(rows, cols, logits);
    let (chained, chains) = run(&CpuBackend::default().with_row_chains(Some(0)), &graph, &params);
    let (separate, none) = run(&CpuBackend::default().with_row_chains(None), &graph, &params);
    assert_eq!(none, 0, "{name}");
    for (k, (a, b)) in chained.iter().zip(&separate).enumerate() {
        assert_eq!(a.len(), b.len(), "{name} output {k}");
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name} output {k}: running by blocks of rows changed the values");
    }
    let (reference, _) = run(&ReferenceBackend, &graph, &params);
    for (k, (a, r)) in chained.iter().zip(&reference).enumerate() {
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{name} output {k}[{i}]: {x} vs {y}");
        }
    }
    let optimized = optimize(&graph, None).unwrap();
    let schedule = Schedule::new(&optimized, &CpuBackend::default().capabilities());
    let lengths: Vec<usize> = schedule.row_chains.iter().map(|c| c.reads.len()).collect();
    assert_eq!(lengths.len(), chains, "{name}: the backend runs every chain the schedule names");
    lengths
}

#[test]
fn a_log_softmax_and_its_gradient_run_as_one_chain_with_the_same_bits() {
    // Odd rows: the halves split unevenly and the column sums at the middle row.
    assert_eq!(check("small", 301, 96, Logits::Given), [4], "add+max, exp+sum, reciprocal, gradient");
    // Rows wider than a block: one row per block.
    assert_eq!(check("wide rows", 9, 40_000, Logits::Given), [4]);
    // Large enough for two threads, many blocks per half.
    assert_eq!(check("two threads", 4099, 130, Logits::Given), [4]);
    // The exponentials overwrite the product the row maximum read, row by
    // row after it, and the gradient overwrites the exponentials (panels of
    // the product over 8 MiB: the CPU runs no epilogue after the matmul).
    assert_eq!(check("over the product", 1100, 2100, Logits::Product), [4]);
}

#[test]
fn a_kernel_reading_other_rows_is_not_chained_to_their_producer() {
    // The shifted logits read the logits transposed: they cannot run by
    // blocks of rows behind the kernel computing the row max and the
    // logits (which would read rows not computed yet, and differ) but start
    // a chain of their own with the reciprocal and the gradient.
    assert_eq!(check("transposed", 64, 64, Logits::TransposedRead), [3]);
}

/// The masked-LM head's loss and gradients through the tensor API: the
/// cross-entropy of `h W^T + bias` over the vocabulary gives
/// the same bits with row chains on and off, and agrees with the reference
/// interpreter. Here the logits are stored (their row maxima are taken
/// before the chain, which starts at the exponentials), and the CPU backend
/// runs the chain as fused rows (`kernels/fused/softmax_rows.rs`).
#[test]
fn cross_entropy_gradients_are_the_same_bits_chained() {
    // A vocabulary of whole tiles, and one of parts of tiles.
    for vocab in [2048, 3000] {
        cross_entropy_gradients_chained(600, 16, vocab);
    }
}

fn cross_entropy_gradients_chained(rows: usize, hidden: usize, vocab: usize) {
    use lazytrain_core::cache::CompileCache;
    use lazytrain_core::{grad, Device, Tensor};
    let run = |backend: Arc<dyn Backend>| -> Vec<Vec<f32>> {
        let dev = Device::with_backend(backend, Arc::new(CompileCache::new()), 0);
        let h = Tensor::from_vec(values(rows * hidden, 1, 2.0), [rows, hidden], &dev).unwrap();
        let word = Tensor::from_vec(values(vocab * hidden, 3, 1.0), [vocab, hidden], &dev).unwrap();
        let bias = Tensor::from_vec(values(vocab, 2, 1.0), [vocab], &dev).unwrap();
        let labels: Vec<i64> = (0..rows).map(|i| if i % 7 == 3 { -100 } else { ((i * 131) % vocab) as i64 }).collect();
        let labels = Tensor::from_vec(labels, [2, rows / 2], &dev).unwrap();
        // `[batch, seq, vocab]` logits, as a model's head gives them.
        let logits = h.matmul_transposed(&word, false, true).unwrap().add(&bias).unwrap();
        let logits = logits.reshape([2, rows / 2, vocab]).unwrap();
        let loss = logits.cross_entropy(&labels, -100).unwrap();
        let grads = grad(&loss, &[&h, &word, &bias]).unwrap();
        let mut out = vec![loss.to_vec::<f32>().unwrap()];
        out.extend(grads.iter().map(|g| g.to_vec::<f32>().unwrap()));
        out
    };
    let chained = run(Arc::new(CpuBackend::default().with_row_chains(Some(0))));
    let separate = run(Arc::new(CpuBackend::default().with_row_chains(None)));
    let reference = run(Arc::new(ReferenceBackend));
    for (k, ((a, b), r)) in chained.iter().zip(&separate).zip(&reference).enumerate() {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "vocabulary {vocab}, output {k}: fusing the rows changed the values");
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "output {k}[{i}]: {x} vs {y}");
        }
    }
}
