//! Gradient checks (central differences in f64 against the VJP rules) for
//! every differentiable primitive and composite, and `backward()` semantics.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[x.clone()]` reads better in a table of checks

use lazytrain_core::autodiff::gradcheck::{check_gradients, check_gradients_on};
use lazytrain_core::backend::BACKEND_NAMES;
use lazytrain_core::{grad, DType, Device, Result, Shape, Tensor};

/// Deterministic values in roughly [-1.5, 1.5], away from 0 (kinks) and distinct (no ties).
fn values(n: usize, salt: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let v = (((i as u64 + 1) * 2_654_435_761 + salt * 97) % 1000) as f64 / 1000.0 * 3.0 - 1.5;
            if v.abs() < 0.1 {
                v + 0.3
            } else {
                v
            }
        })
        .collect()
}

fn positive(n: usize, salt: u64) -> Vec<f64> {
    values(n, salt).into_iter().map(|v| v.abs() + 0.2).collect()
}

fn input(shape: &[usize], salt: u64) -> (Vec<f64>, Vec<usize>) {
    (values(shape.iter().product(), salt), shape.to_vec())
}

/// Check `f`'s gradients on every backend.
fn check(name: &str, inputs: &[(Vec<f64>, Vec<usize>)], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    for backend in BACKEND_NAMES {
        let dev = Device::on_backend(backend).unwrap();
        let report = check_gradients_on(&dev, inputs, 1e-6, &f).unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
        assert!(report.checked > 0, "{name} on {backend}: nothing checked");
        assert!(report.max_error < 1e-6, "{name} on {backend}: {} ({})", report.max_error, report.worst);
    }
}

#[test]
fn unary_primitives() {
    let x = input(&[2, 3], 1);
    let p = (positive(6, 2), vec![2, 3]);
    check("neg", &[x.clone()], |t| t[0].neg());
    check("exp", &[x.clone()], |t| t[0].exp());
    check("tanh", &[x.clone()], |t| t[0].tanh());
    check("erf", &[x.clone()], |t| t[0].erf());
    check("abs", &[x.clone()], |t| t[0].abs());
    check("log", &[p.clone()], |t| t[0].log());
    check("sqrt", &[p.clone()], |t| t[0].sqrt());
    check("rsqrt", &[p.clone()], |t| t[0].rsqrt());
    check("recip", &[p.clone()], |t| t[0].recip());
    // Through f32 the function is a staircase at 1e-7 scale: use a wide step.
    let report = check_gradients(&[x], 1e-2, |t| t[0].cast(DType::F32)?.exp()?.cast(DType::F64)).unwrap();
    assert!(report.max_error < 1e-3, "cast: {report:?}");
}

#[test]
fn binary_primitives_with_broadcasting() {
    let a = input(&[2, 1, 3], 3);
    let b = input(&[4, 3], 4);
    check("add", &[a.clone(), b.clone()], |t| t[0].add(&t[1]));
    check("sub", &[a.clone(), b.clone()], |t| t[0].sub(&t[1]));
    check("mul", &[a.clone(), b.clone()], |t| t[0].mul(&t[1]));
    check("div", &[a.clone(), (positive(12, 5), vec![4, 3])], |t| t[0].div(&t[1]));
    check("maximum", &[a.clone(), b.clone()], |t| t[0].maximum(&t[1]));
    check("minimum", &[a.clone(), b.clone()], |t| t[0].minimum(&t[1]));
    check("pow", &[(positive(6, 6), vec![2, 3]), input(&[3], 7)], |t| t[0].pow(&t[1]));
    check("select", &[a.clone(), b.clone()], |t| Tensor::select(&t[0].gt(&t[1])?, &t[0].exp()?, &t[1]));
}

#[test]
fn reductions_over_several_axes() {
    let x = input(&[2, 3, 4], 8);
    check("sum_0_2", &[x.clone()], |t| t[0].sum(&[0, 2], false));
    check("sum_keep", &[x.clone()], |t| t[0].sum(&[1], true));
    check("max_last", &[x.clone()], |t| t[0].max(&[-1], false));
    check("max_0_1", &[x.clone()], |t| t[0].max(&[0, 1], true));
    check("mean", &[x], |t| t[0].mean(&[1, 2], false));
}

#[test]
fn movement_primitives() {
    let x = input(&[2, 3, 4], 9);
    check("reshape", &[x.clone()], |t| t[0].reshape([4, 6]));
    check("permute", &[x.clone()], |t| t[0].permute(&[2, 0, 1]));
    check("broadcast", &[input(&[3, 1], 10)], |t| t[0].broadcast_to(&Shape::new([2, 3, 4])));
    check("slice", &[x.clone()], |t| t[0].slice(&[1, 0, 1], &[1, 2, 3]));
    check("cat", &[input(&[2, 1, 4], 11), x.clone()], |t| Tensor::cat(&[&t[0], &t[1]], 1));
    check("pad", &[input(&[2, 3], 12)], |t| t[0].pad(&[1, 0], &[2, 1], 7.0));
    // Slices tiling an axis (GPT-2's query-key-value split): their padded
    // gradients are summed as one concatenation by the compiler, in either
    // order of the sum, and a slice left out of the tiling keeps its pad.
    check("split_in_three", &[x.clone()], |t| {
        let (q, k, v) = (t[0].narrow(2, 0, 1)?, t[0].narrow(2, 1, 2)?, t[0].narrow(2, 3, 1)?);
        q.mul(&v)?.add(&k.narrow(2, 0, 1)?.exp()?)?.add(&k.narrow(2, 1, 1)?)
    });
    check("split_in_three_reversed", &[x.clone()], |t| {
        let (q, k, v) = (t[0].narrow(2, 0, 1)?, t[0].narrow(2, 1, 2)?, t[0].narrow(2, 3, 1)?);
        v.tanh()?.mul(&k.narrow(2, 1, 1)?)?.add(&q)
    });
    check("split_with_a_gap", &[x.clone()], |t| t[0].narrow(2, 0, 1)?.mul(&t[0].narrow(2, 2, 2)?.sum(&[2], true)?));
}

#[test]
fn gather_and_scatter_add() {
    let src = input(&[4, 5], 13);
    check("gather", &[src.clone()], |t| {
        let idx = Tensor::from_vec(vec![0i64, 4, 2, 1, 1, 3, 4, 0, 0], [3, 3], t[0].device())?;
        t[0].gather(1, &idx)
    });
    check("scatter_add", &[src.clone(), input(&[2, 5], 14)], |t| {
        let idx = Tensor::from_vec(vec![3i64, 0, 1, 2, 0, 1, 1, 1, 1, 1], [2, 5], t[0].device())?;
        t[0].scatter_add(0, &idx, &t[1])
    });
    check("embedding", &[input(&[6, 3], 15)], |t| {
        let ids = Tensor::from_vec(vec![1i64, 5, 1, 0], [2, 2], t[0].device())?;
        t[0].embedding(&ids)
    });
}

#[test]
fn dot_with_every_transpose_and_batching() {
    for (lhs_t, rhs_t) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = if lhs_t { input(&[2, 4, 3], 16) } else { input(&[2, 3, 4], 16) };
        let b = if rhs_t { input(&[2, 5, 4], 17) } else { input(&[2, 4, 5], 17) };
        check(&format!("dot {lhs_t} {rhs_t}"), &[a, b], move |t| t[0].matmul_transposed(&t[1], lhs_t, rhs_t));
    }
    check("matmul 3d x 2d", &[input(&[2, 3, 4], 18), input(&[4, 2], 19)], |t| t[0].matmul(&t[1]));
    check("matmul broadcast batch", &[input(&[2, 3, 4], 20), input(&[1, 4, 2], 21)], |t| t[0].matmul(&t[1]));
}

#[test]
fn composites() {
    let x = input(&[3, 5], 22);
    check("softmax", &[x.clone()], |t| t[0].softmax(-1));
    check("log_softmax", &[x.clone()], |t| t[0].log_softmax(0));
    check("gelu", &[x.clone()], |t| t[0].gelu());
    check("sigmoid", &[x.clone()], |t| t[0].sigmoid());
    check("layer_norm", &[input(&[2, 3, 4], 23), input(&[4], 24), input(&[4], 25)], |t| {
        t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)
    });
    check("cross_entropy with ignored targets", &[input(&[6, 5], 26)], |t| {
        let labels = Tensor::from_vec(vec![1i64, -100, 4, 0, -100, 2], [6], t[0].device())?;
        t[0].cross_entropy(&labels, -100)
    });
}

#[test]
fn backward_accumulates_into_leaves() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &dev)?;
    let unused = Tensor::from_vec(vec![5.0f32], [1], &dev)?;
    w.set_requires_grad(true);
    unused.set_requires_grad(true);
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3], &dev)?;
    let loss = w.mul(&x)?.sum_all()?;
    loss.backward()?;
    let loss2 = w.square()?.sum_all()?;
    loss2.backward()?;
    dev.sync()?;
    // d/dw (w.x) + d/dw |w|^2 = x + 2w
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![2.5, 3.0, 8.0]);
    assert!(unused.grad().is_none(), "a leaf the loss does not read gets no gradient");
    let g = grad(&w.sum_all()?, &[&w, &unused])?;
    assert_eq!(g[0].to_vec::<f32>()?, vec![1.0; 3]);
    assert_eq!(g[1].to_vec::<f32>()?, vec![0.0]);
    Ok(())
}

/// A loss whose graph already ran (a value of the step was read first)
/// cannot be differentiated: an error, not silently no gradients.
#[test]
fn backward_after_the_graph_ran_is_an_error() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)?;
    w.set_requires_grad(true);
    let loss = w.square()?.sum_all()?;
    let accuracy = w.gt_scalar(1.5)?.cast(DType::F32)?.sum_all()?;
    assert_eq!(accuracy.item::<f32>()?, 1.0, "reading runs the whole live graph, the loss included");
    let line = line!() + 1;
    let e = loss.backward().unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("already computed") && msg.contains(&format!("gradients.rs:{line}")), "{msg}");
    assert!(w.grad().is_none());
    Ok(())
}

/// torch's pow gradients at a zero base: no NaN where the exponent is 0
/// (to the base) or where the base is 0 and the exponent is not negative
/// (to the exponent).
#[test]
fn pow_gradients_at_a_zero_base_are_finite() -> Result<()> {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![0.0f32, 0.0, 2.0], [3], &dev)?;
    let b = Tensor::from_vec(vec![0.0f32, 2.0, 3.0], [3], &dev)?;
    let g = grad(&a.pow(&b)?.sum_all()?, &[&a, &b])?;
    assert_eq!(g[0].to_vec::<f32>()?, [0.0, 0.0, 12.0], "b·a^(b-1), 0 where b = 0");
    let to_b = g[1].to_vec::<f32>()?;
    assert_eq!(&to_b[..2], [0.0, 0.0], "a^b·ln a, 0 where a = 0 and b >= 0");
    assert!((to_b[2] - 8.0 * 2f32.ln()).abs() < 1e-5, "{}", to_b[2]);
    Ok(())
}

#[test]
fn backward_needs_a_scalar_loss() {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev).unwrap();
    let e = w.exp().unwrap().backward().unwrap_err();
    assert!(e.to_string().contains("floating-point scalar"), "{e}");
}

#[test]
fn forward_backward_and_update_are_one_graph() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![0.5f32; 4], [2, 2], &dev)?;
    w.set_requires_grad(true);
    for step in 0..5 {
        let x = Tensor::from_vec(vec![1.0f32, step as f32, 2.0, -1.0], [2, 2], &dev)?;
        let loss = x.matmul(&w)?.tanh()?.sum_all()?;
        loss.backward()?;
        let lr = Tensor::scalar(0.1f32, &dev);
        w.assign(&w.sub(&w.grad().unwrap().mul(&lr)?)?)?;
        w.set_grad(None);
        dev.mark_step()?;
    }
    let m = dev.metrics();
    assert_eq!((m.compiles, m.cache_hits, m.executions), (1, 4, 5));
    Ok(())
}

#[test]
fn sigmoid_values_match_the_logistic_function() {
    let device = Device::cpu();
    let x = Tensor::from_vec(vec![0.0f64, 2.0, -30.0, 40.0], [4], &device).unwrap();
    let y = x.sigmoid().unwrap().to_vec::<f64>().unwrap();
    // 1 / (1 + exp(-x)) in f64: 0.5, 0.8807970779778823, 9.357622968840175e-14, 1.
    for (got, want) in y.iter().zip([0.5, 0.880_797_077_977_882_3, 9.357_622_968_840_175e-14, 1.0]) {
        assert!((got - want).abs() <= 1e-15 + 1e-9 * want, "{got} vs {want}");
    }
}

#[test]
fn no_gradient_flows_through_stop_gradient() {
    let device = Device::cpu();
    let x = Tensor::from_vec(vec![1.5f64, -2.0, 3.0], [3], &device).unwrap();
    let y = x.stop_gradient().unwrap().mul(&x).unwrap().sum_all().unwrap();
    let g = grad(&y, &[&x]).unwrap().remove(0).to_vec::<f64>().unwrap();
    assert_eq!(g, [1.5, -2.0, 3.0], "d(c * x)/dx with c = x held constant");
    assert_eq!(y.item::<f64>().unwrap(), 1.5 * 1.5 + 4.0 + 9.0);
}

/// `detach()` cuts autodiff as PyTorch's does: `w * w.detach()` has
/// gradient `w` (not `2w`), for a materialised leaf and for a computed
/// value alike; the detached handle keeps its value when `w` is updated.
#[test]
fn detach_stops_gradients() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3], &dev)?;
    w.set_requires_grad(true);
    let snapshot = w.detach()?;
    w.mul(&snapshot)?.sum_all()?.backward()?;
    dev.sync()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![1.0, -2.0, 3.0], "d/dw (w * const) = const");
    w.set_grad(None);
    // A computed value: v = 2w, then v * v.detach().
    let v = w.mul_scalar(2.0)?;
    let g = grad(&v.mul(&v.detach()?)?.sum_all()?, &[&w])?;
    assert_eq!(g[0].to_vec::<f32>()?, vec![4.0, -8.0, 12.0], "d/dw (2w * const(2w)) = 2 * 2w");
    w.assign(&w.add_scalar(10.0)?)?;
    dev.sync()?;
    assert_eq!(snapshot.to_vec::<f32>()?, vec![1.0, -2.0, 3.0], "the snapshot keeps its value");
    assert_eq!(w.to_vec::<f32>()?, vec![11.0, 8.0, 13.0]);
    Ok(())
}

/// Two optimizer steps in one graph (no `mark_step` between): the second
/// backward differentiates through the assigned parameter's new value.
#[test]
fn a_second_step_in_one_graph_gets_the_updated_parameters_gradient() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)?;
    w.set_requires_grad(true);
    w.square()?.sum_all()?.backward()?;
    let g1 = w.grad().unwrap();
    w.assign(&w.sub(&g1.mul_scalar(0.25)?)?)?; // w ← w − 0.25·2w = 0.5w
    w.set_grad(None);
    w.square()?.sum_all()?.backward()?;
    dev.mark_step()?;
    assert_eq!(w.to_vec::<f32>()?, vec![0.5, 1.0]);
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![1.0, 2.0], "2 × the updated w");
    Ok(())
}

/// `grad` with respect to a tensor of another device is refused by name.
#[test]
fn grad_refuses_a_tensor_of_another_device() -> Result<()> {
    let (a, b) = (Device::cpu(), Device::cpu());
    let w = Tensor::from_vec(vec![1.0f32], [1], &a)?;
    let elsewhere = Tensor::from_vec(vec![1.0f32], [1], &b)?;
    let err = grad(&w.sum_all()?, &[&w, &elsewhere]).unwrap_err().to_string();
    assert!(err.contains("lives on another device than the loss"), "{err}");
    Ok(())
}

/// A forced read in the middle of a step (between micro-batches) does not
/// restart the random streams: the next draws differ from the first ones,
/// and a step without the read draws the same values in the same order.
#[test]
fn random_streams_continue_after_a_mid_step_read() -> Result<()> {
    let draws = |read_between: bool| -> Result<(Vec<f32>, Vec<f32>)> {
        let dev = Device::cpu();
        let key = Tensor::scalar(7i64, &dev);
        let first = Tensor::rand_uniform([64], DType::F32, &key)?;
        if read_between {
            first.sum_all()?.item::<f32>()?; // a forced sync
        }
        let second = Tensor::rand_uniform([64], DType::F32, &key)?;
        dev.mark_step()?;
        Ok((first.to_vec()?, second.to_vec()?))
    };
    let (first, second) = draws(true)?;
    assert_ne!(first, second, "the second micro-batch gets new masks");
    assert_eq!(draws(false)?, (first, second), "the same values as without the read");
    Ok(())
}

/// Autocast applies to the thread that set it; another thread tracing on
/// the same device sees f32 and may not set its own.
#[test]
fn autocast_is_scoped_per_thread() -> Result<()> {
    let dev = Device::cpu();
    let guard = dev.autocast(DType::BF16)?;
    assert_eq!(dev.autocast_dtype(), Some(DType::BF16));
    let other = dev.clone();
    let (seen, refused) =
        std::thread::spawn(move || (other.autocast_dtype(), other.autocast(DType::BF16).err().map(|e| e.to_string())))
            .join()
            .unwrap();
    assert_eq!(seen, None, "another thread traces in f32");
    assert!(refused.unwrap().contains("another thread holds this setting"));
    drop(guard);
    assert_eq!(dev.autocast_dtype(), None);
    Ok(())
}
