//! Head chains: an attention's steps over its heads (the query-key product,
//! the softmax's kernels, dropout, the probability-value product, and the
//! same in its gradient) give the same bits run a head at a time as run
//! one after the other, and the CPU backend really chains them; a chain
//! that defers a step (a permute of the value gradient's heads into tokens)
//! runs it after its last head with the values it had in order.

use common::{node, param};
use lazytrain_core::backend::{Backend, CpuBackend, Executable, ExecutableStats, RecordingBackend, ReferenceBackend};
use lazytrain_core::cache::CompileCache;
use lazytrain_core::compile::optimize;
use lazytrain_core::ir::{BinaryOp, Graph, GraphBuilder, NodeId, Op};
use lazytrain_core::schedule::{Capabilities, HeadRead, Schedule};
use lazytrain_core::{grad, Buffer, DType, Device, HostData, Shape, Tensor};
use std::sync::Arc;

// The shared graph helpers, not all of which this test uses.
#[allow(dead_code)]
mod common;

/// Batch, heads (9 heads: uneven halves on two threads), sequence, head width.
const B: usize = 3;
const H: usize = 3;
const S: usize = 20;
const D: usize = 8;

fn values(len: usize, salt: usize, spread: f32) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * spread).collect()
}

/// `[B * S, H * D]` → `[B, H, S, D]`.
fn heads(x: &Tensor) -> Tensor {
    x.reshape([B, S, H, D]).unwrap().permute(&[0, 2, 1, 3]).unwrap()
}

/// The loss and the gradients of `x`, the three projections and the mask
/// of `sum(attention(x) · r)`: multi-head self-attention with an additive
/// mask and dropout on its probabilities, on `backend`.
fn attention_gradients(backend: Arc<dyn Backend>) -> Vec<Vec<f32>> {
    let dev = Device::with_backend(backend, Arc::new(CompileCache::new()), 0);
    let tensor = |salt, spread, dims: &[usize]| {
        Tensor::from_vec(values(dims.iter().product(), salt, spread), dims, &dev).unwrap()
    };
    let width = H * D;
    let x = tensor(1, 2.0, &[B * S, width]);
    let (wq, wk, wv) =
        (tensor(2, 0.5, &[width, width]), tensor(3, 0.5, &[width, width]), tensor(4, 0.5, &[width, width]));
    let mask = tensor(5, 3.0, &[B, 1, 1, S]);
    let r = tensor(6, 1.0, &[B * S, width]);
    let seed = Tensor::from_vec(vec![17i64], Shape::scalar(), &dev).unwrap();
    // Only the handles the test reads stay alive: a live intermediate would
    // be an output of the graph, changing its kernels.
    let context = {
        let project = |w: &Tensor| heads(&x.matmul_transposed(w, false, true).unwrap());
        let (q, k, v) = (project(&wq), project(&wk), project(&wv));
        let scores = q.matmul_transposed(&k, false, true).unwrap().mul_scalar(0.35).unwrap().add(&mask).unwrap();
        let probs = scores.softmax(-1).unwrap();
        let keep = Tensor::rand_uniform(probs.shape().clone(), DType::F32, &seed).unwrap().ge_scalar(0.1).unwrap();
        let zero = Tensor::zeros([], DType::F32, &dev).unwrap();
        let dropped = Tensor::select(&keep, &probs.mul_scalar(1.0 / 0.9).unwrap(), &zero).unwrap();
        let context = dropped.matmul_transposed(&v, false, false).unwrap();
        context.permute(&[0, 2, 1, 3]).unwrap().reshape([B * S, width]).unwrap()
    };
    let loss = context.mul(&r).unwrap().sum(&[0, 1], false).unwrap();
    let grads = grad(&loss, &[&x, &wq, &wk, &wv, &mask]).unwrap();
    let mut out = vec![loss.to_vec::<f32>().unwrap()];
    out.extend(grads.iter().map(|g| g.to_vec::<f32>().unwrap()));
    out
}

/// The head chains the step's graphs ran, and its values.
fn run(backend: CpuBackend) -> (usize, Vec<Vec<f32>>) {
    let recording = Arc::new(RecordingBackend::new(backend));
    let values = attention_gradients(recording.clone());
    let chains = recording.lowered().iter().map(|s: &ExecutableStats| s.head_chains).sum();
    (chains, values)
}

#[test]
fn attention_keeps_its_bits_run_a_head_at_a_time() {
    let (chains, chained) = run(CpuBackend::default().with_head_chains(Some(0)));
    let (none, separate) = run(CpuBackend::default().with_head_chains(None));
    let reference = attention_gradients(Arc::new(ReferenceBackend));
    assert_eq!(none, 0);
    // The forward's chain and at least one in the gradient.
    assert!(chains >= 2, "{chains} head chains");
    for (k, ((a, b), r)) in chained.iter().zip(&separate).zip(&reference).enumerate() {
        let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "output {k}: running by heads changed {differ} values");
        let scale = r.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!((x - y).abs() <= 1e-4 * scale, "output {k}[{i}]: {x} vs {y}");
        }
    }
}

/// Products of `[batch, heads, seq, width]` heads: `q kᵀ`, a permute of it
/// into tokens (deferred in a chain), and `(q kᵀ) k`.
fn deferring_graph(seq: usize, width: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let q = param(&mut b, 0, &[B, H, seq, width]);
    let k = param(&mut b, 1, &[B, H, seq, width]);
    let scores = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![q, k]);
    let tokens = node(&mut b, Op::Permute(vec![0, 2, 1, 3]), vec![scores]);
    let mixed = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![scores, k]);
    b.finish(vec![tokens, mixed], 2)
}

/// The fused CPU schedule of `graph`.
fn fused_schedule(graph: &Graph) -> Schedule<'_> {
    Schedule::new(graph, &Capabilities { fuse: true, splat: true, in_place: true, permuted_products: true })
}

/// `graph` (two `[B, H, S, D]` inputs) runs one head chain on the CPU
/// backend, with the bits it has run step by step.
fn runs_one_chain_with_the_bits_of_its_steps(graph: &Graph) {
    let optimized = optimize(graph, None).unwrap();
    let compile = |backend: CpuBackend| backend.compile(&optimized).unwrap();
    let (chains, chained) = run_graph((S, D), compile(CpuBackend::default().with_head_chains(Some(0))));
    let (none, separate) = run_graph((S, D), compile(CpuBackend::default().with_head_chains(None)));
    assert_eq!((chains, none), (1, 0));
    assert_eq!(chained, separate);
}

/// The outputs' bits of `exe` (a graph of two `[B, H, seq, width]` inputs) run on this thread's
/// pool, and how many head chains it has.
fn run_graph((seq, width): (usize, usize), exe: Arc<dyn Executable>) -> (usize, Vec<Vec<u32>>) {
    let inputs =
        [1, 2].iter().map(|&salt| Arc::new(Buffer::new(HostData::F32(values(B * H * seq * width, salt, 1.0)))));
    let outs = exe.run(inputs.collect(), &Default::default()).unwrap();
    let values = outs
        .iter()
        .map(|o| match o.wait().unwrap() {
            HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            other => panic!("unexpected {}", other.dtype()),
        })
        .collect();
    (exe.stats().head_chains, values)
}

/// A batched product, a step over its output that cannot run by heads
/// (a permute into tokens), then a product reading the first one's heads:
/// the permute is deferred and the chain reads the product's heads in place.
#[test]
fn a_step_between_members_is_deferred() {
    let graph = deferring_graph(S, D);
    let schedule = fused_schedule(&graph);
    assert_eq!(schedule.head_chains.len(), 1, "{:?}", schedule.head_chains);
    let chain = &schedule.head_chains[0];
    assert_eq!((chain.batch, chain.members.len(), chain.deferred.len()), (B * H, 2, 1));
    assert_eq!(chain.reads[1], [HeadRead::Heads, HeadRead::Before]);
    runs_one_chain_with_the_bits_of_its_steps(&graph);
}

/// `(2 q) kᵀ v` over `[batch, heads, seq, width]` heads: `2 q` is last read
/// by the first product, whose buffer the memory plan would give the second
/// product's output (of the same size) were the chain not keeping it.
#[test]
fn a_chain_keeps_the_buffers_its_members_read() {
    let mut b = GraphBuilder::new();
    let q = param(&mut b, 0, &[B, H, S, D]);
    let k = param(&mut b, 1, &[B, H, S, D]);
    let doubled = node(&mut b, Op::Binary(BinaryOp::Add), vec![q, q]);
    let scores = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![doubled, k]);
    let mixed = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![scores, k]);
    let graph = b.finish(vec![mixed], 2);
    let schedule = fused_schedule(&graph);
    let slot = |id: NodeId| schedule.memory.operands[id.index()];
    assert_ne!(slot(doubled), slot(mixed));
    assert_eq!(schedule.head_chains.len(), 1, "{:?}", schedule.head_chains);
    let chain = &schedule.head_chains[0];
    assert_eq!(chain.members.len(), 2);
    assert_eq!(chain.reads, [[HeadRead::Before, HeadRead::Before], [HeadRead::Heads, HeadRead::Before]]);
    runs_one_chain_with_the_bits_of_its_steps(&graph);
}

/// A chain lowered where its products' matrices each run on one thread (a
/// one-thread pool) but run where they would be split between threads:
/// its steps run one after the other, with their bits.
#[test]
fn a_chain_lowered_for_one_thread_runs_its_steps_in_order_on_more() {
    // 128 x 128 x 128 multiply-adds per matrix: split on two threads.
    let dims = (128, 128);
    let graph = deferring_graph(dims.0, dims.1);
    let optimized = optimize(&graph, None).unwrap();
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let chained_backend = CpuBackend::default().with_head_chains(Some(0));
    let lowered = one_thread.install(|| chained_backend.compile(&optimized).unwrap());
    let (chains, chained) = run_graph(dims, lowered);
    let (_, separate) = run_graph(dims, CpuBackend::default().with_head_chains(None).compile(&optimized).unwrap());
    assert_eq!(chains, 1, "lowered as a chain");
    assert_eq!(chained, separate);
}
