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
mod narrow_copy;
mod read;
mod reduce;

pub use elementwise::broadcast_shapes;

use crate::device::trace::{TensorState, Traced};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result, RuleError, RuleKind};
use crate::ir::infer::Meta;
use crate::ir::{Node, NodeId, Op};
use crate::shape::Shape;
use crate::storage::Buffer;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The shared part of a tensor handle.
pub(crate) struct TensorCell {
    device: Device,
    shape: Shape,
    dtype: DType,
    state: Mutex<TensorState>,
    requires_grad: AtomicBool,
    grad: Mutex<Option<Tensor>>,
    narrow: Mutex<narrow_copy::NarrowCopy>,
}

impl TensorCell {
    fn new(device: &Device, shape: Shape, dtype: DType, state: TensorState) -> TensorCell {
        TensorCell {
            device: device.clone(),
            shape,
            dtype,
            state: Mutex::new(state),
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            narrow: Mutex::new(narrow_copy::NarrowCopy::None),
        }
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, TensorState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_grad(&self) -> MutexGuard<'_, Option<Tensor>> {
        self.grad.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_narrow(&self) -> MutexGuard<'_, narrow_copy::NarrowCopy> {
        self.narrow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A weak handle the device's live graph keeps.
    pub(crate) fn traced(cell: &Arc<TensorCell>) -> std::sync::Weak<dyn Traced> {
        let weak: std::sync::Weak<TensorCell> = Arc::downgrade(cell);
        weak
    }
}

impl Traced for TensorCell {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn lock_state(&self) -> MutexGuard<'_, TensorState> {
        TensorCell::lock_state(self)
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
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

    pub(crate) fn cell(&self) -> &Arc<TensorCell> {
        &self.cell
    }

    pub(crate) fn ready(buffer: Arc<Buffer>, shape: Shape, device: &Device) -> Tensor {
        let dtype = buffer.dtype();
        Tensor { cell: Arc::new(TensorCell::new(device, shape, dtype, TensorState::Ready(buffer))) }
    }

    pub(crate) fn from_cell(cell: Arc<TensorCell>) -> Tensor {
        Tensor { cell }
    }

    /// A handle to node `id` of the device's live graph (used by autodiff).
    pub(crate) fn from_live_node(device: &Device, id: NodeId) -> Tensor {
        let mut live = device.lock_live();
        let node = live.builder.node(id);
        let cell = Arc::new(TensorCell::new(device, node.shape.clone(), node.dtype, TensorState::Pending(id)));
        live.register(TensorCell::traced(&cell));
        Tensor { cell }
    }

    /// Mark this tensor as a trainable leaf: [`Tensor::backward`] accumulates
    /// its gradient. Leaves are device-resident values (parameters).
    pub fn set_requires_grad(&self, requires_grad: bool) {
        self.cell.requires_grad.store(requires_grad, Ordering::Relaxed);
    }

    /// True for a trainable leaf.
    pub fn requires_grad(&self) -> bool {
        self.cell.requires_grad.load(Ordering::Relaxed)
    }

    /// The gradient accumulated by [`Tensor::backward`], if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.cell.lock_grad().clone()
    }

    /// Replace the accumulated gradient (`None` clears it, like `zero_grad`).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.cell.lock_grad() = grad;
    }

    /// Give this handle the value of `value` (in-place update semantics):
    /// every clone of this handle sees the new value, and once nothing else
    /// holds the old buffer the next sync writes the new value into it
    /// (buffer donation).
    #[track_caller]
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        let location = Location::caller();
        if value.shape() != self.shape() || value.dtype() != self.dtype() {
            let detail = format!(
                "cannot assign a {}{} value to a {}{} tensor",
                value.dtype(),
                value.shape(),
                self.dtype(),
                self.shape()
            );
            return Err(Error::Data { what: "assign", detail, location });
        }
        if value.device() != self.device() {
            let (a, b) = (self.device().name(), value.device().name());
            return Err(Error::DeviceMismatch { op: "assign", a, b, location });
        }
        if self.same_value(value) {
            return Ok(());
        }
        {
            let mut live = self.device().lock_live();
            let new_state = value.cell.lock_state().duplicate();
            let pending = matches!(new_state, TensorState::Pending(_));
            *self.cell.lock_state() = new_state;
            if pending {
                live.register(TensorCell::traced(&self.cell));
            }
        }
        self.renew_narrow_copy()
    }

    /// This value cut from autodiff, as PyTorch's `detach()`: no gradient
    /// flows through the returned handle's uses into `self`, and it has no
    /// `requires_grad` of its own. A computed value is read through a
    /// [`Tensor::stop_gradient`] node; a materialised one shares its buffer
    /// (a snapshot: `self`'s later in-place updates do not change it) and
    /// is read through a graph input of its own, not the leaf's.
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        let state = self.cell.lock_state().duplicate();
        if let TensorState::Pending(_) = state {
            return self.stop_gradient();
        }
        Ok(Tensor { cell: Arc::new(TensorCell::new(self.device(), self.shape().clone(), self.dtype(), state)) })
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
    let bytes = shape.numel().checked_mul(dtype.size_in_bytes()).filter(|&b| b <= isize::MAX as usize);
    if bytes.is_none() {
        let detail = format!("a {dtype} tensor of shape {shape} would not fit in memory (its size overflows)");
        return rule(name, location, Err(RuleError::new(RuleKind::Shape, detail)));
    }
    let mut live = device.lock_live();
    let mut ids = Vec::with_capacity(inputs.len());
    for t in inputs {
        let id = match &*t.cell.lock_state() {
            TensorState::Pending(id) => *id,
            TensorState::Ready(buffer) => {
                let trainable = t.requires_grad();
                let id = live.param_node(buffer, trainable, |k| Node {
                    op: Op::Parameter(k),
                    inputs: Vec::new(),
                    shape: t.cell.shape.clone(),
                    dtype: t.cell.dtype,
                });
                if trainable {
                    live.record_leaf(id, TensorCell::traced(&t.cell));
                }
                id
            }
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
    let cell = Arc::new(TensorCell::new(device, shape, dtype, TensorState::Pending(id)));
    live.register(TensorCell::traced(&cell));
    Ok(Tensor { cell })
}
