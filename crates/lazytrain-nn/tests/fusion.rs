//! Kernel structure after fusion: what LayerNorm, softmax, an attention
//! block, an AdamW update and GELU compile into (counted from the compile
//! events), and fused executables computing exactly what unfused ones
//! compute.

use lazytrain_core::backend::CpuBackend;
use lazytrain_core::cache::CompileCache;
use lazytrain_core::{Device, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{decay_groups, AdamW, AdamWConfig, Optimizer};
use lazytrain_nn::{named_parameters, Context, LayerNorm, SelfAttention};
use std::sync::Arc;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `(kernels, fused kernels)` of the last compile on `device`.
fn last_compile(device: &Device) -> (usize, usize) {
    let report = device.metrics();
    let event = report.compile_events.last().expect("a compile happened");
    (event.kernels, event.fused_kernels)
}

fn device(fuse: bool) -> Device {
    Device::with_backend(Arc::new(CpuBackend::with_fusion(fuse)), Arc::new(CompileCache::new()), 0)
}

fn input(shape: &[usize], device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    Ok(Tensor::from_vec((0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect(), shape.to_vec(), device)?)
}

#[test]
fn layer_norm_is_one_reduction_and_three_fused_kernels() -> Result<()> {
    let device = device(true);
    let norm = LayerNorm::new(&mut Initializer::new(0, &device), 64, 1e-5)?;
    let _y = norm.forward(&input(&[16, 64], &device)?)?;
    device.sync()?;
    // sum(x); mean = sum / 64 (a [16, 1] kernel with its constant);
    // fused (x - mean)^2 summed over each row as it is computed (neither
    // the centred values nor their squares are stored); fused
    // var / 64 + eps -> rsqrt; fused (x - mean) * rstd * weight + bias,
    // recomputing x - mean and reading the broadcasts in place.
    assert_eq!(last_compile(&device), (6, 3));
    let unfused = device_counts(|d| {
        Ok(vec![LayerNorm::new(&mut Initializer::new(0, d), 64, 1e-5)?.forward(&input(&[16, 64], d)?)?])
    })?;
    assert!(unfused.0 >= 15, "without fusion every op and broadcast is a kernel: {unfused:?}");
    Ok(())
}

/// `(kernels, fused)` of the graph `build` traces, without fusion.
fn device_counts(build: impl Fn(&Device) -> Result<Vec<Tensor>>) -> Result<(usize, usize)> {
    let d = device(false);
    let _kept = build(&d)?;
    d.sync()?;
    Ok(last_compile(&d))
}

#[test]
fn softmax_is_a_row_max_and_two_fused_kernels() -> Result<()> {
    let device = device(true);
    let _y = input(&[16, 64], &device)?.softmax(-1)?;
    device.sync()?;
    // max; fused exp(x - max), stored for the division and summed over
    // each row in the same kernel; the sums' reciprocals (one per row:
    // the division is a product with them); the fused product.
    assert_eq!(last_compile(&device), (4, 2));
    Ok(())
}

#[test]
fn an_attention_block_fuses_its_elementwise_work() -> Result<()> {
    let device = device(true);
    let attention = SelfAttention::new(&mut Initializer::new(1, &device), 32, 2, 0.0)?;
    let mask = Tensor::from_vec(vec![0f32; 2 * 16], [2, 1, 1, 16], &device)?;
    let _y = attention.forward(&input(&[2, 16, 32], &device)?, Some(&mask), &Context::eval())?;
    device.sync()?;
    let (kernels, fused) = last_compile(&device);
    let unfused = device_counts(|d| {
        let attention = SelfAttention::new(&mut Initializer::new(1, d), 32, 2, 0.0)?;
        let mask = Tensor::from_vec(vec![0f32; 2 * 16], [2, 1, 1, 16], d)?;
        Ok(vec![attention.forward(&input(&[2, 16, 32], d)?, Some(&mask), &Context::eval())?])
    })?;
    assert!(fused >= 5 && kernels * 3 <= unfused.0 * 2, "{kernels} kernels ({fused} fused) vs {unfused:?} unfused");
    Ok(())
}

#[test]
fn each_parameter_update_of_adamw_is_one_fused_kernel() -> Result<()> {
    let device = device(true);
    let attention = SelfAttention::new(&mut Initializer::new(1, &device), 32, 2, 0.0)?;
    let params = named_parameters(&attention);
    let mut opt = AdamW::new(decay_groups(params.clone(), 0.01), AdamWConfig::default())?;
    for (_, p) in &params {
        p.set_grad(Some(p.mul_scalar(0.5)?.add_scalar(0.25)?.detach()?));
    }
    device.sync()?;
    opt.step()?;
    device.sync()?;
    let (kernels, fused) = last_compile(&device);
    assert_eq!(fused, params.len(), "weight decay, both moments and the update: one kernel per parameter");
    assert!(kernels - fused <= 16, "the rest are scalar step-size computations: {kernels}");
    Ok(())
}

/// GELU of a matmul output and its gradient: `x / sqrt(2)` is read by the
/// forward kernel and by the backward one, and each recomputes it from `x`
/// instead of storing it (a kernel and a buffer fewer than storing it).
#[test]
fn gelu_recomputes_its_scaled_input_in_the_backward_kernel() -> Result<()> {
    let run = |fuse: bool| -> Result<((usize, usize), u64, Vec<f32>)> {
        let device = device(fuse);
        let w = input(&[64, 64], &device)?.mul_scalar(0.1)?;
        device.sync()?;
        w.set_requires_grad(true);
        let x = input(&[64, 64], &device)?.matmul(&w)?;
        let loss = x.gelu()?.square()?.sum(&[0, 1], false)?;
        loss.backward()?;
        let grad = w.grad().expect("w has a gradient");
        device.sync()?;
        Ok((last_compile(&device), device.metrics().peak_execution_bytes, grad.to_vec::<f32>()?))
    };
    let ((kernels, fused), peak, grad) = run(true)?;
    let (_, _, unfused_grad) = run(false)?;
    assert_eq!(grad, unfused_grad, "recomputing gives the same bits");
    // The matmul; one fused kernel for the GELU forward and y * y, summed
    // as it is computed (y, which the gradient reads too, is stored beside
    // the sum: multi-output fusion); the sum's reshape to a scalar; the
    // fused gradient of the square and the GELU; the gradient matmul.
    // Storing x / sqrt(2) took two kernels more: its own, and the
    // gradient's reading it back.
    assert_eq!((kernels, fused), (5, 2), "{kernels} kernels, {fused} fused");
    // x, y, y * y, w, its gradient and the input: no buffer for x / sqrt(2).
    assert!(peak < 7 * 64 * 64 * 4, "peak {peak} bytes");
    Ok(())
}

#[test]
fn fused_and_unfused_training_steps_agree_bit_for_bit() -> Result<()> {
    for bf16 in [false, true] {
        assert_eq!(training_steps(true, bf16)?, training_steps(false, bf16)?, "bf16 autocast: {bf16}");
    }
    assert_ne!(training_steps(true, true)?, training_steps(true, false)?, "autocast changes the matmuls' precision");
    Ok(())
}

/// Three AdamW steps of attention + LayerNorm (matmuls in bf16 when `bf16`).
fn training_steps(fuse: bool, bf16: bool) -> Result<Vec<Vec<f32>>> {
    let d = device(fuse);
    let attention = SelfAttention::new(&mut Initializer::new(4, &d), 32, 4, 0.1)?;
    let norm = LayerNorm::new(&mut Initializer::new(5, &d), 32, 1e-12)?;
    let mut params = named_parameters(&attention);
    params.extend(named_parameters(&norm));
    let mut opt = AdamW::new(decay_groups(params.clone(), 0.01), AdamWConfig::default())?;
    let x = input(&[2, 16, 32], &d)?;
    for step in 0..3 {
        let ctx = Context::train(&d, 7, step)?;
        let autocast = if bf16 { Some(d.autocast(lazytrain_core::DType::BF16)?) } else { None };
        let y = norm.forward(&attention.forward(&x, None, &ctx)?.add(&x)?)?;
        let loss = y.gelu()?.square()?.mean(&[0, 1, 2], false)?;
        drop(autocast);
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        d.mark_step()?;
    }
    Ok(params.iter().map(|(_, p)| p.to_vec::<f32>()).collect::<lazytrain_core::Result<_>>()?)
}

/// `(kernels, fused kernels)` of the last compile and two results.
type CastRun = ((usize, usize), Vec<f32>, Vec<f32>);

#[test]
fn a_cast_feeding_a_matmul_rides_along_in_the_kernel_of_its_input() -> Result<()> {
    let run = |fuse: bool| -> Result<CastRun> {
        let d = device(fuse);
        let x = input(&[64, 32], &d)?;
        let w = input(&[32, 16], &d)?.cast(lazytrain_core::DType::BF16)?;
        d.sync()?;
        let y = x.mul(&x)?.add(&x)?;
        let product = y.cast(lazytrain_core::DType::BF16)?.matmul(&w)?.cast(lazytrain_core::DType::F32)?;
        let other = y.exp()?;
        d.sync()?;
        Ok((last_compile(&d), product.to_vec::<f32>()?, other.to_vec::<f32>()?))
    };
    let (fused, product, other) = run(true)?;
    let (unfused, product_ref, other_ref) = run(false)?;
    // mul+add+cast (two outputs), the matmul, exp; the cast back to f32 is the
    // matmul's reader and runs alone.
    assert_eq!(fused, (4, 1), "unfused: {unfused:?}");
    assert_eq!((product, other), (product_ref, other_ref));
    Ok(())
}

/// Multi-output fusion: `e = exp(x)` (too costly to recompute) read by two
/// kernels is stored by the first of them instead of by a kernel of its
/// own, unless a reader needs it before that kernel runs; either way the
/// values are the unfused ones.
#[test]
fn a_value_read_by_two_kernels_is_stored_by_the_first_that_runs() -> Result<()> {
    // e's readers: 2e (a kernel feeding the matmul), then e * (2e w): one
    // fused kernel computes e and 2e (four kernels without multi-output
    // fusion), the matmul, and the product (a lone op).
    let later_reader = |d: &Device| -> Result<Vec<Tensor>> {
        let e = input(&[32, 32], d)?.exp()?;
        let product = e.mul_scalar(2.0)?.matmul(&input(&[32, 32], d)?)?;
        Ok(vec![e.mul(&product)?])
    };
    // e's readers: the matmul itself (which needs e's buffer before any
    // fused reader runs), then e * (e w).
    let earlier_reader = |d: &Device| -> Result<Vec<Tensor>> {
        let e = input(&[32, 32], d)?.exp()?;
        let product = e.matmul(&input(&[32, 32], d)?)?;
        Ok(vec![e.mul(&product)?])
    };
    for (build, expected, what) in [
        (&later_reader as &dyn Fn(&Device) -> Result<Vec<Tensor>>, (3, 1), "exp stored by the 2e kernel"),
        (&earlier_reader, (3, 0), "exp computed by its own kernel for the matmul"),
    ] {
        let fused = device(true);
        let values = build(&fused)?[0].to_vec::<f32>()?;
        assert_eq!(last_compile(&fused), expected, "{what}");
        let unfused = device(false);
        assert_eq!(values, build(&unfused)?[0].to_vec::<f32>()?, "{what}: the unfused bits");
    }
    Ok(())
}

/// A sum over leading axes (a bias gradient) of a fused kernel's value,
/// traced after the kernel's other work as a gradient's bias sum is,
/// is accumulated by that kernel as it computes the value (one kernel, the
/// value never stored when nothing else reads it), in the unfused
/// kernel's order: the same bits on odd and even row counts, and within
/// f32 rounding of the f64 sum.
#[test]
fn a_column_sum_is_accumulated_by_the_kernel_computing_its_input() -> Result<()> {
    for shape in [vec![65, 48], vec![4, 33, 16], vec![3000, 200]] {
        let axes: Vec<isize> = (0..shape.len() as isize - 1).collect();
        let build = |d: &Device| -> Result<Vec<Tensor>> {
            let y = input(&shape, d)?.mul_scalar(1.5)?.exp()?.add_scalar(-0.25)?;
            let z = y.mul_scalar(3.0)?;
            Ok(vec![y.sum(&axes, true)?, z])
        };
        let fused = device(true);
        let sums = build(&fused)?[0].to_vec::<f32>()?;
        assert_eq!(last_compile(&fused), (1, 1), "{shape:?}: one kernel computes y * 3 and sums y");
        let unfused = device(false);
        assert_eq!(sums, build(&unfused)?[0].to_vec::<f32>()?, "{shape:?}: the unfused bits");
        let x = input(&shape, &unfused)?.to_vec::<f32>()?;
        let cols = *shape.last().expect("rank >= 2");
        for (c, &got) in sums.iter().enumerate() {
            let exact: f64 = x.iter().skip(c).step_by(cols).map(|&v| (f64::from(v) * 1.5).exp() - 0.25).sum();
            assert!((f64::from(got) - exact).abs() <= 1e-5 * exact.abs(), "{shape:?} column {c}: {got} vs {exact}");
        }
    }
    Ok(())
}

/// Heads split by a permute (`[b, s, h, d]` read as `[b, h, s, d]`) feed
/// the batched matmul as strided views (each head's matrix has unit
/// column stride): no copy kernels, the unfused bits.
#[test]
fn a_head_permute_feeds_the_matmul_without_a_copy() -> Result<()> {
    let build = |d: &Device| -> Result<Vec<Tensor>> {
        let heads = |x: Tensor| -> Result<Tensor> { Ok(x.reshape([2, 16, 2, 16])?.permute(&[0, 2, 1, 3])?) };
        let q = heads(input(&[2, 16, 32], d)?)?;
        let k = heads(input(&[2, 16, 32], d)?.square()?)?;
        Ok(vec![q.matmul_transposed(&k, false, true)?])
    };
    let fused = device(true);
    let scores = build(&fused)?[0].to_vec::<f32>()?;
    assert_eq!(last_compile(&fused), (2, 0), "k's square and the matmul, no permute copies");
    let unfused = device(false);
    assert_eq!(scores, build(&unfused)?[0].to_vec::<f32>()?);
    Ok(())
}

/// A bf16 copy kept for two later kernels (as autocast keeps a linear
/// layer's output) is what the kernel computing it stores: each reader
/// widens it back to f32 as it loads it, so no f32 copy of the value is
/// stored beside it (half its bytes), with the unfused bits.
#[test]
fn a_bf16_copy_read_by_two_kernels_is_stored_narrow() -> Result<()> {
    let run = |fuse: bool, narrow: bool| -> Result<(u64, Vec<f32>)> {
        let d = device(fuse);
        let x = input(&[256, 256], &d)?;
        let w = input(&[256, 256], &d)?;
        d.sync()?;
        // Only the result stays alive: y is no graph output.
        let out = {
            let y = x.mul(&x)?.add(&x)?;
            let y = match narrow {
                true => y.cast(lazytrain_core::DType::BF16)?.cast(lazytrain_core::DType::F32)?,
                false => y,
            };
            // Two kernels read y: its exp (which the matmul reads), and its
            // product with the matmul's result.
            y.mul(&y.exp()?.matmul(&w)?)?
        };
        let values = out.to_vec::<f32>()?;
        Ok((d.metrics().peak_execution_bytes, values))
    };
    let (narrow_peak, narrow) = run(true, true)?;
    let (wide_peak, _) = run(true, false)?;
    assert_eq!(narrow, run(false, true)?.1, "the unfused bits");
    assert_eq!(wide_peak - narrow_peak, 256 * 256 * 2, "y kept in bf16: {narrow_peak} vs {wide_peak} bytes");
    Ok(())
}
