//! The data-parallel optimizer step: gradients are averaged over the
//! replicas inside the step graph, then the update runs on every replica.

use crate::Replica;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_nn::optim::Optimizer;
use lazytrain_nn::{NnError, Result};

/// Replace every parameter's gradient by its mean over the replicas (an
/// `all_reduce` node in the step graph; the identity for one replica).
/// Call it before clipping, so every replica clips the same gradients.
pub fn reduce_gradients(optimizer: &dyn Optimizer, replica: &Replica) -> Result<()> {
    for param in optimizer.parameters() {
        if param.device() != replica.device() {
            return Err(NnError::Invalid {
                what: "optimizer_step",
                detail: format!(
                    "a parameter lives on {:?}, not on replica {}'s device {:?}; build the model on replica.device()",
                    param.device(),
                    replica.rank(),
                    replica.device()
                ),
            });
        }
        if let Some(grad) = param.grad() {
            param.set_grad(Some(grad.all_reduce(AllReduceOp::Mean)?));
        }
    }
    Ok(())
}

/// PyTorch/XLA's `xm.optimizer_step`: all-reduce the gradients (mean over
/// the replicas) and trace the update. Every replica calls it in the same
/// step; the replicas then hold bit-identical parameters.
pub fn optimizer_step(optimizer: &mut dyn Optimizer, replica: &Replica) -> Result<()> {
    reduce_gradients(optimizer, replica)?;
    optimizer.step()
}
