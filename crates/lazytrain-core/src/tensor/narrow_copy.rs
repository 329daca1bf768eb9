//! A materialised value's narrow copy, computed with the step that
//! assigned the value instead of at its next cast.
//!
//! Under autocast every step casts each f32 weight to bf16 before its first
//! product: a kernel per weight that reads the value the optimizer wrote at
//! the end of the previous step and writes a bf16 copy (3–4 % of a bf16
//! BERT step on a 2-core Intel Xeon). When an f32 tensor is cast to a
//! 16-bit float type, its cell remembers the type; the next
//! [`Tensor::assign`] (the optimizer's update) then traces the cast of the
//! new value right away, in the same step as the update (whose fused loop
//! writes the copy beside the value), and keeps it. A later cast of that
//! value to the same type is still traced as a cast, so autodiff sees the
//! same graph, but the sync that cuts the graph reads the kept copy in its
//! place (`LiveGraph::provide`): the same bits, one kernel and one pass over
//! the weights fewer per step. Any assignment drops the copy of the value
//! it replaces. The memory plan gives each new copy the slot of the copy
//! it replaces (`schedule::memory`), so steady steps still allocate nothing.

use super::{Tensor, TensorCell};
use crate::device::trace::TensorState;
use crate::dtype::DType;
use crate::storage::Buffer;
use std::sync::Arc;

/// What a cell keeps of its value in a narrower float type.
pub(crate) enum NarrowCopy {
    /// Nothing, and no cast asked for one.
    None,
    /// The value was cast to this type: the next assigned value gets a
    /// copy in it.
    Wanted(DType),
    /// The current value cast to this type (pending until the sync that
    /// computes the value).
    Kept(DType, Tensor),
}

/// True for the casts a kept copy stands for: f32 to a 16-bit float.
fn narrows(from: DType, to: DType) -> bool {
    from == DType::F32 && matches!(to, DType::BF16 | DType::F16)
}

impl TensorCell {
    /// The materialised copy of this value in `dtype`, if one is kept, with
    /// the buffer of the value it copies; an f32 value cast to a 16-bit
    /// float without one asks for one from its next assignment on (a weight
    /// before the optimizer's first update).
    pub(super) fn narrow_copy_for_cast(&self, dtype: DType) -> Option<(Arc<Buffer>, Arc<Buffer>)> {
        let ready = |state: &TensorState| match state {
            TensorState::Ready(buffer) => Some(buffer.clone()),
            TensorState::Pending(_) | TensorState::Failed(_) => None,
        };
        let mut narrow = self.lock_narrow();
        match &*narrow {
            NarrowCopy::Kept(kept, copy) if *kept == dtype => {
                Some((ready(&self.lock_state())?, ready(&copy.cell.lock_state())?))
            }
            NarrowCopy::None if narrows(self.dtype, dtype) => {
                *narrow = NarrowCopy::Wanted(dtype);
                None
            }
            NarrowCopy::None | NarrowCopy::Wanted(_) | NarrowCopy::Kept(..) => None,
        }
    }

    /// Drop the copy of the value being replaced, returning the type a copy
    /// of the new value should have.
    pub(super) fn take_narrow_type(&self) -> Option<DType> {
        match std::mem::replace(&mut *self.lock_narrow(), NarrowCopy::None) {
            NarrowCopy::Wanted(dtype) | NarrowCopy::Kept(dtype, _) => Some(dtype),
            NarrowCopy::None => None,
        }
    }

    /// Keep `copy`, the current value cast to `dtype`.
    pub(super) fn keep_narrow(&self, dtype: DType, copy: Tensor) {
        *self.lock_narrow() = NarrowCopy::Kept(dtype, copy);
    }
}

impl Tensor {
    /// After an assignment: trace the new value's copy in the type a cast of
    /// the old one asked for, and keep it.
    #[track_caller]
    pub(super) fn renew_narrow_copy(&self) -> crate::Result<()> {
        if let Some(dtype) = self.cell.take_narrow_type() {
            let copy = self.cast(dtype)?;
            self.cell.keep_narrow(dtype, copy);
        }
        Ok(())
    }
}
