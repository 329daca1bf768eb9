//! Initialisers matching BERT's (`_init_weights` in Hugging Face): normal
//! with std 0.02 for weights, zero biases, LayerNorm weight 1 and bias 0.
//!
//! Values are drawn on the host once, from the same Philox generator the
//! graph uses, keyed by `(seed, stream)`: the same seed gives the same model.

use crate::Result;
use lazytrain_core::random::uniform_f32_from;
use lazytrain_core::{DType, Device, Tensor};

/// BERT's `initializer_range`.
pub const BERT_INIT_STD: f32 = 0.02;

/// `n` samples of N(0, std²) by Box–Muller over Philox uniforms.
pub fn normal_values(n: usize, std: f32, seed: u64, stream: u64) -> Vec<f32> {
    let mut out = vec![0f32; n];
    fill_normal(&mut out, std, seed, stream);
    out
}

/// Elements per part when a draw is shared between threads: even, so every
/// part holds whole pairs.
const NORMAL_PART: usize = 1 << 16;

/// [`normal_values`] written into `out`, in parts on the threads of
/// rayon's pool (the values do not depend on how many: the uniforms are
/// counted from the start of the draw). 110 M values, BERT-base's, took
/// 2.5 s on one thread (most of it in `sincos`), 1.3 s on two.
fn fill_normal(out: &mut [f32], std: f32, seed: u64, stream: u64) {
    use rayon::prelude::*;
    out.par_chunks_mut(NORMAL_PART)
        .enumerate()
        .for_each(|(part, values)| fill_normal_from(values, part * NORMAL_PART, std, seed, stream));
}

/// Elements `first..first + out.len()` of the draw, `first` even (pairs of
/// uniforms transformed in place; an odd length draws the last pair's second
/// uniform on its own).
fn fill_normal_from(out: &mut [f32], first: usize, std: f32, seed: u64, stream: u64) {
    uniform_f32_from(seed, stream, first, out);
    let n = out.len();
    let mut last = [0f32; 2];
    if n % 2 == 1 {
        uniform_f32_from(seed, stream, first + n - 1, &mut last);
    }
    let transform = |pair: &mut [f32]| {
        let r = (-2.0 * (1.0 - pair[0] as f64).ln()).sqrt();
        let theta = std::f64::consts::TAU * pair[1] as f64;
        pair[0] = (r * theta.cos()) as f32 * std;
        pair[1] = (r * theta.sin()) as f32 * std;
    };
    let mut pairs = out.chunks_exact_mut(2);
    pairs.by_ref().for_each(transform);
    if let [tail] = pairs.into_remainder() {
        transform(&mut last);
        *tail = last[0];
    }
}

/// A host buffer of `value`s for a parameter of `shape`, or an error naming
/// the shape when it cannot exist (a config with absurd sizes) instead of an
/// abort on allocation failure. The values are written on rayon's threads,
/// so each faults in its share of the fresh pages: 110 M values (BERT-base)
/// took 0.24 s on one thread, 0.11 s on two.
fn host_buffer(shape: &[usize], value: f32) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let mut values = Vec::new();
    match n {
        Some(n) if values.try_reserve_exact(n).is_ok() => {
            values.par_extend(rayon::iter::repeat_n(value, n));
            Ok(values)
        }
        _ => Err(crate::NnError::Invalid {
            what: "parameter",
            detail: format!(
                "a parameter of shape {shape:?} is too large to allocate; check the model config's sizes \
                 (vocab_size, hidden_size, intermediate_size, max_position_embeddings)"
            ),
        }),
    }
}

/// A trainable tensor of N(0, std²) values.
pub fn normal(shape: &[usize], std: f32, seed: u64, stream: u64, device: &Device) -> Result<Tensor> {
    let mut values = host_buffer(shape, 0.0)?;
    fill_normal(&mut values, std, seed, stream);
    parameter(Tensor::from_vec(values, shape, device)?)
}

/// A trainable tensor filled with `value`.
pub fn constant(shape: &[usize], value: f32, device: &Device) -> Result<Tensor> {
    let values = host_buffer(shape, value)?;
    parameter(Tensor::from_vec(values, shape, device)?)
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

    /// The in-place transform gives the values of the two-buffer
    /// Box–Muller it replaced (the models of earlier versions), odd lengths
    /// included, and so do long draws made in several parts on the pool's
    /// threads (the last part odd).
    #[test]
    fn normal_values_are_box_muller_over_uniform_pairs() {
        use lazytrain_core::random::uniform_f32;
        for n in [0, 1, 2, 7, 64, 3 * NORMAL_PART + 5] {
            let mut u = vec![0f32; n + n % 2];
            uniform_f32(5, 9, &mut u);
            let expected: Vec<f32> = u
                .chunks(2)
                .flat_map(|p| {
                    let r = (-2.0 * (1.0 - p[0] as f64).ln()).sqrt();
                    let theta = std::f64::consts::TAU * p[1] as f64;
                    [(r * theta.cos()) as f32 * 0.5, (r * theta.sin()) as f32 * 0.5]
                })
                .take(n)
                .collect();
            assert_eq!(normal_values(n, 0.5, 5, 9), expected, "n = {n}");
        }
    }

    #[test]
    fn a_parameter_too_large_to_allocate_is_an_error() {
        let device = Device::cpu();
        let msg = normal(&[1 << 40, 1 << 30], 0.02, 0, 0, &device).err().unwrap().to_string();
        assert!(msg.contains("too large to allocate") && msg.contains("vocab_size"), "{msg}");
        assert!(constant(&[usize::MAX, 2], 1.0, &device).is_err(), "the element count overflows");
        assert!(constant(&[1 << 40, 1 << 10], 1.0, &device).is_err(), "4 PiB: the allocator refuses");
    }
}
