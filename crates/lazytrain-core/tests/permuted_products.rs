//! Batched products stored straight into the layout of the permute that
//! reads them (an attention's heads into tokens): the permute's kernel is
//! gone from the schedule, its slot is the product's, and the values are
//! the bits of the product followed by the permute, whichever kernel
//! computes a matrix (the attention-head kernel, `gemm` through a row-major
//! scratch copy, the bf16 kernels under autocast) and however the matrices
//! are shared between threads.

use common::node;
use half::bf16;
use lazytrain_core::backend::{Backend, CpuBackend, Executable, ReferenceBackend};
use lazytrain_core::compile::optimize;
use lazytrain_core::ir::{Graph, GraphBuilder, Node, NodeId, Op};
use lazytrain_core::schedule::{Capabilities, Operand, Schedule, Step, View};
use lazytrain_core::{Buffer, DType, HostData, Shape};
use std::sync::Arc;

// The shared graph helpers, not all of which this test uses.
#[allow(dead_code)]
mod common;

/// Batch and heads (9 matrices: uneven halves on two threads).
const B: usize = 3;
const H: usize = 3;

fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0).collect()
}

/// Node indices of [`products`]: the stored product and its permute, and a
/// product and its permute that moves the trailing axis.
const CONTEXT: usize = 3;
const TOKENS: usize = 4;
const SCORES: usize = 5;
const TRANSPOSED: usize = 6;

/// Parameter `k` of `dtype` over `dims`.
fn param(b: &mut GraphBuilder, k: usize, dims: &[usize], dtype: DType) -> NodeId {
    b.push(Node { op: Op::Parameter(k), inputs: vec![], shape: Shape::new(dims), dtype })
}

/// `q kᵀ k` over `[B, H, seq, width]` heads permuted into tokens
/// (`[B, seq, H, width]`), and `k qᵀ` with its last two axes swapped, all
/// in `dtype`.
fn products_of(dtype: DType, seq: usize, width: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let q = param(&mut b, 0, &[B, H, seq, width], dtype);
    let k = param(&mut b, 1, &[B, H, seq, width], dtype);
    let scores = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![q, k]);
    let context = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![scores, k]);
    let tokens = node(&mut b, Op::Permute(vec![0, 2, 1, 3]), vec![context]);
    let again = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![k, q]);
    let transposed = node(&mut b, Op::Permute(vec![0, 1, 3, 2]), vec![again]);
    assert_eq!((context.index(), tokens.index()), (CONTEXT, TOKENS));
    assert_eq!((again.index(), transposed.index()), (SCORES, TRANSPOSED));
    b.finish(vec![tokens, transposed], 2)
}

/// [`products_of`] in f32.
fn products(seq: usize, width: usize) -> Graph {
    products_of(DType::F32, seq, width)
}

/// The schedule of [`products`] with and without stored permutes.
fn schedule(graph: &Graph, permuted_products: bool) -> Schedule<'_> {
    Schedule::new(graph, &Capabilities { fuse: true, splat: true, in_place: true, permuted_products })
}

/// The nodes of `schedule`'s primitive steps.
fn node_steps(schedule: &Schedule) -> Vec<usize> {
    schedule
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Node { node, .. } => Some(*node),
            Step::Group { .. } => None,
        })
        .collect()
}

#[test]
fn a_product_read_only_by_a_permute_is_stored_in_its_layout() {
    let (seq, width) = (20, 8);
    let graph = products(seq, width);
    let stored = schedule(&graph, true);
    let strides = vec![seq * H * width, width, H * width, 1];
    assert_eq!(stored.fusion.stored_permuted[CONTEXT], Some(View { base: TOKENS, strides: strides.clone() }));
    // The permute moving the trailing axis stays a copy.
    assert!(stored.fusion.stored_permuted[SCORES].is_none());
    let steps = node_steps(&stored);
    assert!(!steps.contains(&TOKENS) && steps.contains(&CONTEXT) && steps.contains(&TRANSPOSED));
    let product = stored.steps.iter().find(|s| matches!(s, Step::Node { node: CONTEXT, .. })).unwrap();
    let Step::Node { slot, out_strides, .. } = product else { unreachable!("a node step") };
    assert_eq!(out_strides.as_ref(), Some(&strides));
    assert_eq!(stored.memory.operands[TOKENS], Operand::Slot(*slot));
    assert_eq!(stored.memory.operands[CONTEXT], Operand::Fused);
    let copied = schedule(&graph, false);
    assert!(node_steps(&copied).contains(&TOKENS));
    assert!(copied.fusion.stored_permuted.iter().all(Option::is_none));
    // An empty product keeps its own (empty) buffer.
    let empty = products(0, width);
    assert!(schedule(&empty, true).fusion.stored_permuted.iter().all(Option::is_none));
}

/// The outputs' bits of `products_of(dtype, seq, width)` compiled for
/// `backend`, run on a pool of `threads` threads.
fn run(backend: &dyn Backend, dtype: DType, (seq, width): (usize, usize), threads: usize) -> Vec<Vec<u32>> {
    let optimized = optimize(&products_of(dtype, seq, width), None).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let exe: Arc<dyn Executable> = backend.compile(&optimized).unwrap();
        let input = |salt| {
            let v = values(B * H * seq * width, salt);
            Arc::new(Buffer::new(match dtype {
                DType::BF16 => HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
                _ => HostData::F32(v),
            }))
        };
        let outs = exe.run(vec![input(1), input(2)], &Default::default()).unwrap();
        outs.iter()
            .map(|o| match o.wait().unwrap() {
                HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                HostData::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
                other => panic!("unexpected {}", other.dtype()),
            })
            .collect()
    })
}

/// A value of `dtype` from its bits as [`run`] returns them.
fn value(dtype: DType, bits: u32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_bits(bits as u16).to_f32(),
        _ => f32::from_bits(bits),
    }
}

#[test]
fn stored_products_have_the_bits_of_a_product_and_a_permute() {
    // Matrices on the attention-head kernel (on AVX-512), through `gemm`
    // with a shared dimension it does not take (300), and enough work to
    // share the matrices between two threads; in bf16, on the bf16 kernel
    // (AMX tiles or AVX-512 BF16 where the CPU has them, `gemm` on widened
    // values where not), whose k = 300 spans two blocks of its shared
    // dimension.
    for (dtype, tolerance) in [(DType::F32, 1e-3), (DType::BF16, 2e-2)] {
        for dims in [(20, 8), (300, 16), (128, 64)] {
            for threads in [1, 2] {
                let stored = run(&CpuBackend::default().with_permuted_products(true), dtype, dims, threads);
                let copied = run(&CpuBackend::default().with_permuted_products(false), dtype, dims, threads);
                assert_eq!(stored, copied, "{dtype} {dims:?} on {threads} threads");
                let reference = run(&ReferenceBackend, dtype, dims, threads);
                for (ours, theirs) in stored.iter().zip(&reference) {
                    for (x, y) in ours.iter().zip(theirs) {
                        let (x, y) = (value(dtype, *x), value(dtype, *y));
                        assert!((x - y).abs() <= tolerance * (1.0 + y.abs()), "{dtype} {dims:?}: {x} vs {y}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_bf16_product_read_only_by_a_permute_is_stored_in_its_layout() {
    let (seq, width) = (20, 8);
    let graph = products_of(DType::BF16, seq, width);
    let stored = schedule(&graph, true);
    let strides = vec![seq * H * width, width, H * width, 1];
    assert_eq!(stored.fusion.stored_permuted[CONTEXT], Some(View { base: TOKENS, strides }));
    assert!(!node_steps(&stored).contains(&TOKENS));
}
