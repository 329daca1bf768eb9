//! One training step, the recipe every training loop shares (the Trainer,
//! `lazytrain bench`, user code): autocast → forward → backward (with the
//! saved-activation policy) → gradient reduction over the replicas → clip
//! → optimizer update → zero_grad → `mark_step`. The whole step is one
//! graph, compiled once and run as one executable.

use crate::optimizer::reduce_gradients;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DType, Device, Tensor};
use lazytrain_nn::optim::{clip_grad_norm, Optimizer};
use lazytrain_nn::{NnError, Result};

/// How [`train_step`] runs a step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepConfig<'a> {
    /// Trace the forward pass and the loss under `Device::autocast(dtype)`
    /// (bf16 mixed precision).
    pub autocast: Option<DType>,
    /// Trace the backward pass under `Device::save_activations_as(dtype)`.
    pub saved_activations: Option<DType>,
    /// Scale the gradients of these parameters (in this order, which fixes
    /// the summation order of the norm) so their global norm is at most
    /// the given value, after the replicas averaged them.
    pub clip: Option<(&'a [Tensor], f64)>,
    /// The learning rate of this step (the optimizer's own otherwise).
    pub learning_rate: Option<f64>,
}

/// What a step traced; its values are ready once the step has run.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// The step's loss (the sum over its micro-batches), averaged over the
    /// replicas.
    pub loss: Tensor,
    /// The `shared` values given to [`train_step`], averaged over the replicas.
    pub shared: Option<Tensor>,
}

impl StepOutput {
    /// Read the loss and the shared values (waits for the step).
    pub fn values(&self) -> Result<(f32, Vec<f32>)> {
        let loss = self.loss.item::<f32>()?;
        let shared = match &self.shared {
            Some(t) => t.to_vec::<f32>()?,
            None => Vec::new(),
        };
        Ok((loss, shared))
    }
}

/// Trace and run one training step on `device`: for each micro-batch,
/// `loss_of` traces the forward pass and its loss (under autocast) and the
/// loss is differentiated (gradients accumulate); then the gradients are
/// averaged over the device's replica group, clipped, applied by
/// `optimizer` and cleared, and the step is cut with `mark_step`.
///
/// `shared` host values (e.g. a stop flag) are averaged over the replicas
/// inside the same graph, so every replica learns them without another
/// round trip. With no micro-batches nothing is traced, the optimizer does
/// not step, and the loss is NaN (the shared values are not reduced).
///
/// `loss_of` may fail with the caller's own error type `E` (a model error,
/// say); the step's own failures convert into it.
#[track_caller]
pub fn train_step<B, E>(
    device: &Device,
    optimizer: &mut dyn Optimizer,
    micro_batches: &[B],
    config: &StepConfig,
    shared: &[f32],
    mut loss_of: impl FnMut(&B) -> std::result::Result<Tensor, E>,
) -> std::result::Result<StepOutput, E>
where
    E: From<NnError> + From<lazytrain_core::Error>,
{
    if micro_batches.is_empty() {
        return Ok(StepOutput { loss: Tensor::scalar(f32::NAN, device), shared: None });
    }
    let mut step_loss: Option<Tensor> = None;
    for batch in micro_batches {
        let autocast = config.autocast.map(|dtype| device.autocast(dtype)).transpose()?;
        let loss = loss_of(batch)?;
        drop(autocast);
        let saving = config.saved_activations.map(|dtype| device.save_activations_as(dtype)).transpose()?;
        loss.backward()?;
        drop(saving);
        step_loss = Some(match step_loss {
            Some(total) => total.add(&loss)?,
            None => loss,
        });
    }
    // Replicas average their gradients before clipping, so all clip and
    // apply the same update.
    reduce_gradients(optimizer)?;
    if let Some((params, max_norm)) = config.clip {
        clip_grad_norm(params, max_norm)?;
    }
    if let Some(lr) = config.learning_rate {
        optimizer.set_lr(lr);
    }
    optimizer.step()?;
    optimizer.zero_grad();
    let loss = step_loss.expect("at least one micro-batch");
    let (loss, shared) = replica_means(device, loss, shared)?;
    device.mark_step()?;
    Ok(StepOutput { loss, shared })
}

/// The loss and the shared values, averaged over the replicas in one
/// all-reduce (as they are on a lone device).
fn replica_means(device: &Device, loss: Tensor, shared: &[f32]) -> Result<(Tensor, Option<Tensor>)> {
    let replicated = device.replica_position().1 > 1;
    match (replicated, shared.is_empty()) {
        (false, true) => Ok((loss, None)),
        (false, false) => Ok((loss, Some(Tensor::from_vec(shared.to_vec(), [shared.len()], device)?))),
        (true, _) => {
            let values = Tensor::from_vec(shared.to_vec(), [shared.len()], device)?;
            let both = Tensor::cat(&[&loss.reshape([1])?, &values], 0)?.all_reduce(AllReduceOp::Mean)?;
            let loss = both.narrow(0, 0, 1)?.reshape(Vec::<usize>::new())?;
            let shared = (!shared.is_empty()).then(|| both.narrow(0, 1, shared.len())).transpose()?;
            Ok((loss, shared))
        }
    }
}
