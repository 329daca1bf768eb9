//! `train_step`: the one training-step recipe gives what the same step
//! written out by hand gives, bit for bit, and averages shared values over
//! the replicas in the step's own graph.

use lazytrain_core::{DType, Device, Tensor};
use lazytrain_dist::{reduce_gradients, spawn, train_step, SpawnConfig, StepConfig};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamGroup};
use lazytrain_nn::{named_parameters, Linear, NnError};

/// A layer, its optimizer and its parameters in model order.
fn setup(device: &Device) -> Result<(Linear, AdamW, Vec<Tensor>), NnError> {
    let layer = Linear::new(&mut Initializer::new(5, device), 6, 3, true)?;
    let named = named_parameters(&layer);
    let params = named.iter().map(|(_, p)| p.clone()).collect();
    let opt = AdamW::new(vec![ParamGroup { params: named, weight_decay: 0.01 }], AdamWConfig::default())?;
    Ok((layer, opt, params))
}

/// Micro-batch `k` of step `step`: inputs and class labels.
fn batch(step: usize, k: usize, device: &Device) -> Result<(Tensor, Tensor), NnError> {
    let x: Vec<f32> = (0..4 * 6).map(|i| ((i * 7 + step * 5 + k * 3) % 13) as f32 / 6.0 - 1.0).collect();
    let y: Vec<i64> = (0..4).map(|i| ((i + step + k) % 3) as i64).collect();
    Ok((Tensor::from_vec(x, [4, 6], device)?, Tensor::from_vec(y, [4], device)?))
}

#[test]
fn train_step_is_the_written_out_step_bit_for_bit() -> Result<(), NnError> {
    for bf16 in [false, true] {
        let run = |by_hand: bool| -> Result<(Vec<f32>, Vec<Vec<f32>>), NnError> {
            let device = Device::cpu();
            let (layer, mut opt, params) = setup(&device)?;
            let mut losses = Vec::new();
            for step in 0..4 {
                let batches = [batch(step, 0, &device)?, batch(step, 1, &device)?];
                let lr = 0.01 / (1.0 + step as f64);
                let loss = if by_hand {
                    let mut total: Option<Tensor> = None;
                    for (x, y) in &batches {
                        let autocast = bf16.then(|| device.autocast(DType::BF16)).transpose()?;
                        let loss = layer.forward(x)?.cross_entropy(y, -100)?;
                        drop(autocast);
                        loss.backward()?;
                        total = Some(match total {
                            Some(t) => t.add(&loss)?,
                            None => loss,
                        });
                    }
                    reduce_gradients(&opt)?;
                    clip_grad_norm(&params, 0.5)?;
                    opt.set_lr(lr);
                    opt.step()?;
                    opt.zero_grad();
                    device.mark_step()?;
                    total.expect("two micro-batches")
                } else {
                    let config = StepConfig {
                        autocast: bf16.then_some(DType::BF16),
                        clip: Some((&params, 0.5)),
                        learning_rate: Some(lr),
                        ..StepConfig::default()
                    };
                    let out = train_step(&device, &mut opt, &batches, &config, &[], |(x, y)| -> Result<_, NnError> {
                        Ok(layer.forward(x)?.cross_entropy(y, -100)?)
                    })?;
                    assert!(out.shared.is_none());
                    out.loss
                };
                losses.push(loss.item::<f32>()?);
            }
            let values = params.iter().map(|p| p.to_vec::<f32>()).collect::<Result<Vec<_>, _>>()?;
            Ok((losses, values))
        };
        let (by_hand, by_step) = (run(true)?, run(false)?);
        assert_eq!(by_hand, by_step, "bf16 {bf16}");
        assert_ne!(by_step.0[0], by_step.0[3], "the steps trained");
    }
    Ok(())
}

#[test]
fn shared_values_and_the_loss_are_averaged_over_the_replicas() {
    let results = spawn(&SpawnConfig::new(2), |replica| -> Result<_, NnError> {
        let device = replica.device();
        let (layer, mut opt, _) = setup(device)?;
        let batches = [batch(replica.rank(), 0, device)?];
        let flag = [replica.rank() as f32];
        let out =
            train_step(device, &mut opt, &batches, &StepConfig::default(), &flag, |(x, y)| -> Result<_, NnError> {
                Ok(layer.forward(x)?.cross_entropy(y, -100)?)
            })?;
        let (loss, shared) = out.values()?;
        Ok((loss, shared))
    })
    .unwrap();
    assert_eq!(results[0], results[1], "every replica learns the same values");
    assert_eq!(results[0].1, vec![0.5], "the mean of the replicas' flags 0 and 1");
    assert!(results[0].0.is_finite() && results[0].0 > 0.0);
}

#[test]
fn a_step_without_micro_batches_has_a_nan_loss() -> Result<(), NnError> {
    let device = Device::cpu();
    let (_, mut opt, _) = setup(&device)?;
    let none: [(); 0] = [];
    let out = train_step(&device, &mut opt, &none, &StepConfig::default(), &[], |_| -> Result<Tensor, NnError> {
        unreachable!("no micro-batches")
    })?;
    assert!(out.loss.item::<f32>()?.is_nan());
    Ok(())
}
