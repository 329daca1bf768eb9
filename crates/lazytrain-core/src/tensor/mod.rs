//! `Tensor`: a cheap handle to a value that is either pending in the
//! device's live graph or materialised in a device buffer.
//!
//! Every op checks shapes and dtypes at once (failing with the caller's
//! `file:line`), records one node and returns; nothing runs until
//! [`Device::sync`] or a read such as [`Tensor::to_vec`].

mod composite;
mod create;
mod elementwise;
mod movement;
mod read;
mod reduce;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result, RuleError};
use crate::ir::infer::Meta;
use crate::ir::{Node, NodeId, Op};
use crate::shape::Shape;
use crate::storage::Buffer;
use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a tensor's value is.
pub(crate) enum TensorState {
    /// A node of the device's live graph.
    Pending(NodeId),
    /// Computed, in a device buffer.
    Ready(Arc<Buffer>),
    /// The graph that should have computed it failed.
    Failed(Arc<str>),
}

/// The shared part of a tensor handle.
pub(crate) struct TensorCell {
    device: Device,
    shape: Shape,
    dtype: DType,
    state: Mutex<TensorState>,
}

impl TensorCell {
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, TensorState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A lazy tensor. Cloning is cheap and shares the value.
#[derive(Clone)]
pub struct Tensor {
    cell: Arc<TensorCell>,
}

impl Tensor {
    /// The dimensions.
    pub fn shape(&self) -> &Shape {
        &self.cell.shape
    }

    /// The dimensions as a slice.
    pub fn dims(&self) -> &[usize] {
        self.cell.shape.dims()
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.cell.shape.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.cell.shape.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.cell.dtype
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> &Device {
        &self.cell.device
    }

    /// True while the value is still a node of the live graph.
    pub fn is_pending(&self) -> bool {
        matches!(*self.cell.lock_state(), TensorState::Pending(_))
    }

    /// True when both handles share one value.
    pub fn same_value(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell)
    }

    pub(crate) fn meta(&self) -> Meta<'_> {
        (&self.cell.shape, self.cell.dtype)
    }

    pub(crate) fn ready(buffer: Arc<Buffer>, shape: Shape, device: &Device) -> Tensor {
        let dtype = buffer.dtype();
        Tensor {
            cell: Arc::new(TensorCell {
                device: device.clone(),
                shape,
                dtype,
                state: Mutex::new(TensorState::Ready(buffer)),
            }),
        }
    }
}

/// Apply a shape rule, naming the op and caller on failure.
pub(crate) fn rule<T>(op: &'static str, location: &'static Location<'static>, r: Result<T, RuleError>) -> Result<T> {
    r.map_err(|e| Error::from_rule(op, e, location))
}

/// Record `op` over `inputs` with a known output shape and dtype.
pub(crate) fn trace(
    name: &'static str,
    location: &'static Location<'static>,
    device: &Device,
    op: Op,
    inputs: &[&Tensor],
    (shape, dtype): (Shape, DType),
) -> Result<Tensor> {
    for t in inputs {
        if t.device() != device {
            return Err(Error::DeviceMismatch { op: name, a: device.name(), b: t.device().name(), location });
        }
    }
    let mut live = device.lock_live();
    let mut ids = Vec::with_capacity(inputs.len());
    for t in inputs {
        let id = match &*t.cell.lock_state() {
            TensorState::Pending(id) => *id,
            TensorState::Ready(buffer) => live.param_node(buffer, |k| Node {
                op: Op::Parameter(k),
                inputs: Vec::new(),
                shape: t.cell.shape.clone(),
                dtype: t.cell.dtype,
            }),
            TensorState::Failed(message) => {
                return Err(Error::Data {
                    what: name,
                    detail: format!("an input has no value because its graph failed: {message}"),
                    location,
                })
            }
        };
        ids.push(id);
    }
    let id = live.builder.push(Node { op, inputs: ids, shape: shape.clone(), dtype });
    let cell =
        Arc::new(TensorCell { device: device.clone(), shape, dtype, state: Mutex::new(TensorState::Pending(id)) });
    live.register(&cell);
    Ok(Tensor { cell })
}
