//! AdamW and SGD against PyTorch trajectories (fixtures/optim.json from
//! fixtures/gen_optim.py): 10 steps, weight decay on one group only, a new
//! learning rate every step; 1e-6 relative agreement.

use lazytrain_core::{Device, Tensor};
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup, Sgd, SgdConfig};
use serde_json::Value;

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
