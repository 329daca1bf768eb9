//! The data-parallel optimizer step: gradients are averaged over the
//! replicas inside the step graph, then the update runs on every replica.

use crate::Replica;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_nn::optim::Optimizer;
use lazytrain_nn::{NnError, Result};

/// Replace every parameter's gradient by its mean over the replicas of its
/// device's group (an `all_reduce` node in the step graph; nothing for a
/// lone device). Call it before clipping, so every replica clips the same
/// gradients.
pub fn reduce_gradients(optimizer: &dyn Optimizer) -> Result<()> {
    for param in optimizer.parameters() {
        let replicated = param.device().replica_position().1 > 1;
        if let (true, Some(grad)) = (replicated, param.grad()) {
            param.set_grad(Some(grad.all_reduce(AllReduceOp::Mean)?));
        }
    }
    Ok(())
}

/// PyTorch/XLA's `xm.optimizer_step`: all-reduce the gradients (mean over
/// the replicas) and trace the update. Every replica calls it in the same
/// step; the replicas then hold bit-identical parameters. Fails when a
/// parameter does not live on `replica`'s device.
pub fn optimizer_step(optimizer: &mut dyn Optimizer, replica: &Replica) -> Result<()> {
    if let Some(param) = optimizer.parameters().iter().find(|p| p.device() != replica.device()) {
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
    reduce_gradients(optimizer)?;
    optimizer.step()
}
