//! AdamW and SGD against PyTorch trajectories (fixtures/optim.json from
//! fixtures/gen_optim.py): 10 steps, weight decay on one group only, a new
//! learning rate every step; 1e-6 relative agreement.

use lazytrain_core::backend::{Backend, CpuBackend, RecordingBackend};
use lazytrain_core::cache::CompileCache;
use lazytrain_core::{Device, Tensor};
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup, Sgd, SgdConfig};
use serde_json::Value;
use std::sync::Arc;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn replay(case: &Value, make: impl Fn(Vec<ParamGroup>) -> Box<dyn Optimizer>) {
    let dev = Device::cpu();
    let w = lazytrain_nn::init::parameter(Tensor::from_vec(floats(&case["init"]["w"]), [3, 4], &dev).unwrap()).unwrap();
    let b = lazytrain_nn::init::parameter(Tensor::from_vec(floats(&case["init"]["b"]), [4], &dev).unwrap()).unwrap();
    let groups = vec![
        ParamGroup { params: vec![("w".into(), w.clone())], weight_decay: 0.01 },
        ParamGroup { params: vec![("b".into(), b.clone())], weight_decay: 0.0 },
    ];
    let mut opt = make(groups);
    for t in 0..10 {
        w.set_grad(Some(Tensor::from_vec(floats(&case["grads"][t]["w"]), [3, 4], &dev).unwrap()));
        b.set_grad(Some(Tensor::from_vec(floats(&case["grads"][t]["b"]), [4], &dev).unwrap()));
        opt.set_lr(case["lr"][t].as_f64().unwrap());
        opt.step().unwrap();
        opt.zero_grad();
        dev.mark_step().unwrap();
        for (name, p) in [("w", &w), ("b", &b)] {
            let got = p.to_vec::<f32>().unwrap();
            let want = floats(&case["params"][t][name]);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!((g - e).abs() <= 1e-6 * e.abs() + 1e-7, "step {t} {name}[{i}]: got {g}, want {e}");
            }
        }
    }
    let m = dev.metrics();
    assert_eq!(m.compiles, 1, "the update compiles once: {}", dev.metrics_report());
    assert_eq!(m.cache_hits, 9);
}

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/optim.json")).unwrap()
}

#[test]
fn adamw_matches_torch() {
    replay(&fixture()["adamw"], |g| {
        Box::new(AdamW::new(g, AdamWConfig { lr: 1e-2, ..AdamWConfig::default() }).unwrap())
    });
}

#[test]
fn sgd_with_momentum_and_dampening_matches_torch() {
    replay(&fixture()["sgd_momentum"], |g| {
        Box::new(Sgd::new(g, SgdConfig { lr: 1e-2, momentum: 0.9, dampening: 0.1, nesterov: false }).unwrap())
    });
}

#[test]
fn sgd_nesterov_matches_torch() {
    replay(&fixture()["sgd_nesterov"], |g| {
        Box::new(Sgd::new(g, SgdConfig { lr: 1e-2, momentum: 0.9, dampening: 0.0, nesterov: true }).unwrap())
    });
}

#[test]
fn clipping_scales_by_the_global_norm_in_graph() {
    let dev = Device::cpu();
    let a = lazytrain_nn::init::parameter(Tensor::from_vec(vec![0f32; 2], [2], &dev).unwrap()).unwrap();
    let b = lazytrain_nn::init::parameter(Tensor::from_vec(vec![0f32; 1], [1], &dev).unwrap()).unwrap();
    a.set_grad(Some(Tensor::from_vec(vec![3f32, 0.0], [2], &dev).unwrap()));
    b.set_grad(Some(Tensor::from_vec(vec![4f32], [1], &dev).unwrap()));
    let norm = lazytrain_nn::optim::clip_grad_norm(&[a.clone(), b.clone()], 1.0).unwrap().unwrap();
    assert!(norm.is_pending(), "the norm is not read on the host");
    dev.sync().unwrap();
    assert_eq!(dev.metrics().forced_sync_count(), 0);
    assert_eq!(norm.item::<f32>().unwrap(), 5.0);
    let scale = 1.0 / (5.0 + 1e-6);
    let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((ga[0] - 3.0 * scale as f32).abs() < 1e-6 && ga[1] == 0.0);
    assert!((b.grad().unwrap().item::<f32>().unwrap() - 4.0 * scale as f32).abs() < 1e-6);
}

/// Parameters and their optimizer after three AdamW steps on `backend`:
/// a decaying `[271, 259]` weight (two threads' halves, each ending in a
/// part of a vector) and a 37-element bias without decay, the gradients
/// clipped by their global norm when `clip`.
fn adamw_steps(backend: Arc<dyn Backend>, clip: bool) -> Vec<Vec<u32>> {
    let dev = Device::with_backend(backend, Arc::new(CompileCache::new()), 0);
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len).map(|i| ((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0).collect()
    };
    let (rows, cols) = (271, 259);
    let w =
        lazytrain_nn::init::parameter(Tensor::from_vec(values(rows * cols, 1), [rows, cols], &dev).unwrap()).unwrap();
    let b = lazytrain_nn::init::parameter(Tensor::from_vec(values(37, 2), [37], &dev).unwrap()).unwrap();
    let groups = vec![
        ParamGroup { params: vec![("w".into(), w.clone())], weight_decay: 0.01 },
        ParamGroup { params: vec![("b".into(), b.clone())], weight_decay: 0.0 },
    ];
    let mut opt = AdamW::new(groups, AdamWConfig { lr: 1e-2, ..AdamWConfig::default() }).unwrap();
    for t in 0..3 {
        w.set_grad(Some(Tensor::from_vec(values(rows * cols, 3 + t), [rows, cols], &dev).unwrap()));
        b.set_grad(Some(Tensor::from_vec(values(37, 7 + t), [37], &dev).unwrap()));
        if clip {
            lazytrain_nn::optim::clip_grad_norm(&[w.clone(), b.clone()], 0.5).unwrap();
        }
        opt.step().unwrap();
        opt.zero_grad();
        dev.mark_step().unwrap();
    }
    [&w, &b].iter().map(|p| p.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

/// AdamW's update (with and without weight decay, with and without
/// clipping) runs by a loop of its own, one kernel per parameter, with the
/// bits of the kernels that run it instruction by instruction.
#[test]
fn adamw_updates_run_by_their_own_loop_with_the_interpreters_bits() {
    for clip in [false, true] {
        let fast = Arc::new(RecordingBackend::new(CpuBackend::default().with_fast_paths(true)));
        let interpreted = Arc::new(RecordingBackend::new(CpuBackend::default().with_fast_paths(false)));
        assert_eq!(adamw_steps(fast.clone(), clip), adamw_steps(interpreted.clone(), clip), "clip {clip}");
        let update = fast.lowered().last().copied().unwrap();
        assert_eq!(update.fast_paths, 2, "one loop per parameter (clip {clip}): {update:?}");
        assert_eq!(interpreted.lowered().last().unwrap().fast_paths, 0);
    }
}
