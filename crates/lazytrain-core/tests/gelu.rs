//! GELU in a two-layer MLP through the tensor API, forward and backward:
//! the CPU backend computes the CDF again in the backward pass instead of
//! keeping it, moves the gradient's kernel ahead of the weight gradient
//! traced between it and its input gradient's matmul so that it runs as
//! that matmul's epilogue (column sums and all), and runs both GELU
//! programs by their own loops on AVX-512 CPUs (reading and writing their
//! operands in place, as epilogues and as kernels of their own). Each of
//! these gives the bits of the plain schedule; all agree with the
//! reference backend.

use lazytrain_core::backend::{Backend, CpuBackend, ExecutableStats, RecordingBackend, ReferenceBackend};
use lazytrain_core::cache::CompileCache;
use lazytrain_core::{grad, DType, Device, Tensor};
use std::sync::Arc;

/// Rows: three product panels (1024, 1024, 452), the middle row inside one
/// (and inside a tile: 125 000 elements in, a part of a vector).
const ROWS: usize = 2500;
const HIDDEN: usize = 40;
const INNER: usize = 100;

fn values(len: usize, salt: usize, spread: f32) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * spread).collect()
}

/// The loss and the gradients of every parameter of
/// `sum(gelu(x W1ᵀ + b1) W2ᵀ · r)` on `backend`; with `bf16`, as under
/// autocast: the expansion stored in bf16, GELU computed in f32 from it and
/// rounded to bf16 for a bf16 second matmul (its gradient rounded likewise).
fn mlp_gradients(backend: Arc<dyn Backend>, bf16: bool) -> Vec<Vec<f32>> {
    let dev = Device::with_backend(backend, Arc::new(CompileCache::new()), 0);
    let tensor = |len, salt, spread, dims: &[usize]| Tensor::from_vec(values(len, salt, spread), dims, &dev).unwrap();
    let x = tensor(ROWS * HIDDEN, 1, 2.0, &[ROWS, HIDDEN]);
    let w1 = tensor(INNER * HIDDEN, 2, 0.5, &[INNER, HIDDEN]);
    let b1 = tensor(INNER, 3, 1.0, &[INNER]);
    let w2 = tensor(HIDDEN * INNER, 4, 0.5, &[HIDDEN, INNER]);
    let r = tensor(ROWS * HIDDEN, 5, 1.0, &[ROWS, HIDDEN]);
    // Only the handles the test reads stay alive: a live intermediate would
    // be materialised as an output of the graph, changing its kernels.
    let y = {
        let pre = x.matmul_transposed(&w1, false, true).unwrap().add(&b1).unwrap();
        if bf16 {
            let stored = pre.cast(DType::BF16).unwrap().cast(DType::F32).unwrap();
            let h = stored.gelu().unwrap().cast(DType::BF16).unwrap();
            let w2 = w2.cast(DType::BF16).unwrap();
            h.matmul_transposed(&w2, false, true).unwrap().cast(DType::F32).unwrap()
        } else {
            pre.gelu().unwrap().matmul_transposed(&w2, false, true).unwrap()
        }
    };
    let loss = y.mul(&r).unwrap().sum(&[0, 1], false).unwrap();
    let grads = grad(&loss, &[&x, &w1, &b1, &w2]).unwrap();
    let mut out = vec![loss.to_vec::<f32>().unwrap()];
    out.extend(grads.iter().map(|g| g.to_vec::<f32>().unwrap()));
    out
}

/// The stats of the graphs the step compiled, and its values.
fn run(backend: CpuBackend, bf16: bool) -> (ExecutableStats, Vec<Vec<f32>>) {
    let recording = Arc::new(RecordingBackend::new(backend));
    let values = mlp_gradients(recording.clone(), bf16);
    let total = recording.lowered().iter().fold(ExecutableStats::default(), |sum, s| ExecutableStats {
        epilogues: sum.epilogues + s.epilogues,
        fast_paths: sum.fast_paths + s.fast_paths,
        ..sum
    });
    (total, values)
}

#[test]
fn gelu_gradients_keep_their_bits_through_epilogues_and_fast_paths() {
    let (fast, with_fast_paths) = run(CpuBackend::default().with_fast_paths(true), false);
    let (interpreted, without) = run(CpuBackend::default().with_fast_paths(false), false);
    let (_, separate) = run(CpuBackend::default().with_epilogues(false).with_fast_paths(false), false);
    // The GELU loops on their own kernels, reading and writing in place.
    let (_, separate_fast) = run(CpuBackend::default().with_epilogues(false).with_fast_paths(true), false);
    let reference = mlp_gradients(Arc::new(ReferenceBackend), false);
    // Forward GELU after its matmul, the loss's row sums after the second
    // one, and GELU's gradient (CDF recomputed, bias column sums) after the
    // input gradient's matmul, moved ahead of the weight gradient traced
    // between them.
    assert_eq!(interpreted.epilogues, 3, "{interpreted:?}");
    assert_eq!(interpreted.fast_paths, 0);
    assert_eq!(fast.fast_paths, if avx512() { 2 } else { 0 }, "both GELU programs are recognised");
    for (k, (((a, b), c), r)) in with_fast_paths.iter().zip(&without).zip(&separate).zip(&reference).enumerate() {
        let same = |u: &[f32], v: &[f32]| u.iter().zip(v).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same(a, b), "output {k}: the fast paths changed the values");
        assert!(same(b, c), "output {k}: the epilogues changed the values");
        assert!(same(c, &separate_fast[k]), "output {k}: the loops on their own kernels changed the values");
        let scale = r.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!((x - y).abs() <= 1e-4 * scale, "output {k}[{i}]: {x} vs {y}");
        }
    }
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The autocast form: GELU of a bf16-stored expansion, rounded to bf16, and
/// its gradient rounded likewise run by their own loops with the
/// interpreter's bits, and agree with the reference backend within bf16
/// rounding.
#[test]
fn bf16_gelu_programs_keep_their_bits_through_fast_paths() {
    let (fast, with_fast_paths) = run(CpuBackend::default().with_fast_paths(true), true);
    let (interpreted, without) = run(CpuBackend::default().with_fast_paths(false), true);
    let reference = mlp_gradients(Arc::new(ReferenceBackend), true);
    assert_eq!(interpreted.fast_paths, 0);
    assert_eq!(fast.fast_paths, if avx512() { 2 } else { 0 }, "both bf16 GELU programs are recognised: {fast:?}");
    for (k, ((a, b), r)) in with_fast_paths.iter().zip(&without).zip(&reference).enumerate() {
        let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "output {k}: the fast paths changed {differ} values");
        let scale = r.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!((x - y).abs() <= 2e-2 * scale, "output {k}[{i}]: {x} vs {y}");
        }
    }
}
