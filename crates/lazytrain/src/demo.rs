//! `lazytrain demo`: fit a linear model by gradient descent, every step one
//! lazily traced graph that compiles once and then hits the cache.

use clap::Args;
use lazytrain_core::{metrics, DType, Device, Tensor};

/// Options for `lazytrain demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Training steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Peak learning rate (decays linearly to zero; fed as a graph input).
    #[arg(long, default_value_t = 0.5)]
    lr: f32,
    /// Seed of the in-graph random data.
    #[arg(long, default_value_t = 0)]
    seed: i64,
}

const FEATURES: usize = 8;
const BATCH: usize = 64;

/// Run the demo and print the loss curve and the metrics report.
pub fn run(args: &DemoArgs) -> lazytrain_core::Result<()> {
    let dev = Device::cpu();
    let true_w: Vec<f32> = (0..FEATURES).map(|i| (i as f32 - 3.5) / 2.0).collect();
    let true_w = Tensor::from_vec(true_w, [FEATURES, 1], &dev)?;
    let mut w = Tensor::from_vec(vec![0f32; FEATURES], [FEATURES, 1], &dev)?;
    let mut last_loss = f32::NAN;
    for step in 0..args.steps {
        let seed = Tensor::scalar(args.seed.wrapping_mul(1_000_003).wrapping_add(step as i64), &dev);
        let lr = Tensor::scalar(args.lr * (1.0 - step as f32 / args.steps as f32), &dev);
        let x = Tensor::rand_uniform([BATCH, FEATURES], DType::F32, &seed)?.mul_scalar(2.0)?.add_scalar(-1.0)?;
        let y = x.matmul(&true_w)?;
        let residual = x.matmul(&w)?.sub(&y)?;
        let loss = residual.square()?.mean_all()?;
        let grad = x.matmul_transposed(&residual, true, false)?.mul_scalar(2.0 / BATCH as f64)?;
        w = w.sub(&grad.mul(&lr)?)?;
        dev.mark_step()?;
        last_loss = loss.item::<f32>()?;
        if step % 10 == 0 || step + 1 == args.steps {
            println!("step {step:4}  loss {last_loss:.6}");
        }
    }
    println!("final loss {last_loss:.6}");
    println!("{}", metrics::report());
    Ok(())
}
