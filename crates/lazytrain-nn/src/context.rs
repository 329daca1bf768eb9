//! The forward-pass context: train/eval mode and the dropout key.

use crate::Result;
use lazytrain_core::{DType, Device, Tensor};

/// Seeds are spread by this prime (2^32 + 15, exact in the IR's literals)
/// before the step is added, so runs shorter than 2^32 steps never share a key.
const SEED_STRIDE: f64 = 4_294_967_311.0;

/// How a forward pass runs.
///
/// In training mode dropout draws its masks from the in-graph counter-based
/// generator keyed by `seed * C + step`, both fed as `i64` scalar *inputs*:
/// every step gets new masks without a recompile, and the same seed and step
/// reproduce the same masks bit for bit.
#[derive(Clone)]
pub struct Context {
    training: bool,
    key: Option<Tensor>,
}

impl Context {
    /// Evaluation mode: dropout is the identity.
    pub fn eval() -> Context {
        Context { training: false, key: None }
    }

    /// Training mode for optimizer step `step` of a run seeded with `seed`.
    pub fn train(device: &Device, seed: i64, step: i64) -> Result<Context> {
        let seed = Tensor::scalar(seed, device);
        let step = Tensor::scalar(step, device);
        let key = seed.mul(&Tensor::full([], SEED_STRIDE, DType::I64, device)?)?.add(&step)?;
        Ok(Context { training: true, key: Some(key) })
    }

    /// True in training mode.
    pub fn training(&self) -> bool {
        self.training
    }

    /// The dropout key (an `i64` scalar), in training mode.
    pub fn key(&self) -> Option<&Tensor> {
        self.key.as_ref()
    }
}
