//! Initialisers matching BERT's (`_init_weights` in Hugging Face): normal
//! with std 0.02 for weights, zero biases, LayerNorm weight 1 and bias 0.
//!
//! Values are drawn on the host once, from the same Philox generator the
//! graph uses, keyed by `(seed, stream)`: the same seed gives the same model.

use crate::Result;
use lazytrain_core::random::uniform_f32;
use lazytrain_core::{DType, Device, Tensor};

/// BERT's `initializer_range`.
pub const BERT_INIT_STD: f32 = 0.02;

/// `n` samples of N(0, std²) by Box–Muller over Philox uniforms.
pub fn normal_values(n: usize, std: f32, seed: u64, stream: u64) -> Vec<f32> {
    let mut u = vec![0f32; n + n % 2];
    uniform_f32(seed, stream, &mut u);
    let mut out = Vec::with_capacity(u.len());
    for pair in u.chunks(2) {
        let r = (-2.0 * (1.0 - pair[0] as f64).ln()).sqrt();
        let theta = std::f64::consts::TAU * pair[1] as f64;
        out.push((r * theta.cos()) as f32 * std);
        out.push((r * theta.sin()) as f32 * std);
    }
    out.truncate(n);
    out
}

/// A trainable tensor of N(0, std²) values.
pub fn normal(shape: &[usize], std: f32, seed: u64, stream: u64, device: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    parameter(Tensor::from_vec(normal_values(n, std, seed, stream), shape, device)?)
}

/// A trainable tensor filled with `value`.
pub fn constant(shape: &[usize], value: f32, device: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    parameter(Tensor::from_vec(vec![value; n], shape, device)?)
}

/// Mark a device tensor as a trainable parameter.
pub fn parameter(t: Tensor) -> Result<Tensor> {
    if t.dtype() != DType::F32 {
        return Err(crate::NnError::Invalid {
            what: "parameter",
            detail: format!("parameters are f32 master weights, got {}", t.dtype()),
        });
    }
    t.set_requires_grad(true);
    Ok(t)
}

/// Hands out distinct generator streams to the parameters of one model.
#[derive(Debug)]
pub struct Initializer {
    seed: u64,
    next_stream: u64,
    device: Device,
}

impl Initializer {
    /// Initialise a model on `device` from `seed`.
    pub fn new(seed: u64, device: &Device) -> Initializer {
        Initializer { seed, next_stream: 0, device: device.clone() }
    }

    /// The device parameters are created on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A weight drawn from N(0, std²) on a fresh stream.
    pub fn normal(&mut self, shape: &[usize], std: f32) -> Result<Tensor> {
        self.next_stream += 1;
        normal(shape, std, self.seed, self.next_stream, &self.device)
    }

    /// A constant-filled parameter.
    pub fn constant(&self, shape: &[usize], value: f32) -> Result<Tensor> {
        constant(shape, value, &self.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_values_have_the_asked_moments() {
        let v = normal_values(20_000, 0.02, 3, 1);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 5e-4, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 5e-4, "std {}", var.sqrt());
        assert_eq!(v, normal_values(20_000, 0.02, 3, 1));
        assert_ne!(v, normal_values(20_000, 0.02, 3, 2));
    }
}
