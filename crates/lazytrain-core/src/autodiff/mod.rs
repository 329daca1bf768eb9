//! Reverse-mode autodiff as a graph transformation.
//!
//! [`grad`] walks the device's live graph backwards from the loss and emits
//! each primitive's vector-Jacobian product ([`vjp`]) as more lazy ops, so
//! forward, backward and the optimizer update of a step stay one graph, one
//! compile, one executable. Nothing is kept alive between steps: the "tape"
//! is the live graph itself.

pub mod gradcheck;
mod vjp;

use crate::device::trace::TensorState;
use crate::device::{Device, SAVED_ACTIVATION_MIN_ELEMENTS};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Node, NodeId, Op, ReduceOp, UnaryOp};
use crate::tensor::{Tensor, TensorCell};
use rustc_hash::FxHashMap;
use std::panic::Location;

/// Where a tensor sits in the live graph, if it is read there.
fn live_node(t: &Tensor, location: &'static Location<'static>) -> Result<Option<NodeId>> {
    let live = t.device().lock_live();
    let state = t.cell().lock_state();
    match &*state {
        TensorState::Pending(id) => Ok(Some(*id)),
        TensorState::Ready(buffer) => Ok(live.existing_param_node(buffer, t.requires_grad())),
        TensorState::Failed(message) => Err(Error::Data {
            what: "grad",
            detail: format!("the tensor has no value because its graph failed: {message}"),
            location,
        }),
    }
}

/// Gradients of the scalar `loss` with respect to each of `wrt`, as pending
/// tensors in the same graph. A tensor the loss does not depend on gets zeros.
#[track_caller]
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let location = Location::caller();
    if let Some(other) = wrt.iter().find(|t| t.device() != loss.device()) {
        return Err(Error::Data {
            what: "grad",
            detail: format!(
                "a tensor in `wrt` ({}{}) lives on another device than the loss; gradients flow only within one \
                 device's graph (move it with Tensor::from_host first)",
                other.dtype(),
                other.shape()
            ),
            location,
        });
    }
    let ids = wrt.iter().map(|t| live_node(t, location)).collect::<Result<Vec<_>>>()?;
    let found: Vec<NodeId> = ids.iter().flatten().copied().collect();
    let cotangents = backpropagate(loss, &found, location)?;
    wrt.iter()
        .zip(ids)
        .map(|(t, id)| match id.and_then(|id| cotangents.get(&id).cloned()) {
            Some(g) => Ok(g),
            None => Tensor::zeros(t.shape().clone(), t.dtype(), t.device()),
        })
        .collect()
}

impl Tensor {
    /// Accumulate `d self / d leaf` into the gradient of every trainable leaf
    /// (tensor with `requires_grad`) the live graph reads, like PyTorch's
    /// `loss.backward()`. `self` must be a floating-point scalar.
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        let location = Location::caller();
        let leaves = self.device().lock_live().leaves();
        // A leaf assigned earlier in this graph (a second optimizer step
        // before `mark_step`) is read through its new value's node.
        let leaves: Vec<(NodeId, Tensor)> = leaves
            .into_iter()
            .map(|(id, traced)| {
                let cell = traced
                    .as_any()
                    .downcast::<TensorCell>()
                    .unwrap_or_else(|_| unreachable!("only tensors are traced"));
                let leaf = Tensor::from_cell(cell);
                let current = match &*leaf.cell().lock_state() {
                    TensorState::Pending(now) => *now,
                    TensorState::Ready(_) | TensorState::Failed(_) => id,
                };
                (current, leaf)
            })
            .collect();
        let ids: Vec<NodeId> = leaves.iter().map(|(id, _)| *id).collect();
        let cotangents = backpropagate(self, &ids, location)?;
        for (id, leaf) in leaves {
            let Some(g) = cotangents.get(&id) else { continue };
            let total = match leaf.grad() {
                Some(previous) => previous.add(g)?,
                None => g.clone(),
            };
            leaf.set_grad(Some(total));
        }
        Ok(())
    }
}

/// Run the VJP rules from `loss` back to `targets`; returns the cotangent of
/// every target the loss depends on.
fn backpropagate(
    loss: &Tensor,
    targets: &[NodeId],
    location: &'static Location<'static>,
) -> Result<FxHashMap<NodeId, Tensor>> {
    if loss.numel() != 1 || !loss.dtype().is_float() {
        return Err(Error::Data {
            what: "backward",
            detail: format!("the loss must be a floating-point scalar, got {}{}", loss.dtype(), loss.shape()),
            location,
        });
    }
    let device = loss.device().clone();
    let Some(loss_id) = live_node(loss, location)? else {
        // A computed value has no graph left to differentiate; returning no
        // gradients would silently stop training.
        return Err(Error::Data {
            what: "backward",
            detail: "the loss is already computed (reading a value or a sync ran its graph), so there is no traced \
                     graph left to differentiate; call backward() before reading any value of the step"
                .into(),
            location,
        });
    };
    let nodes: Vec<Node> = {
        let live = device.lock_live();
        (0..=loss_id.index()).map(|i| live.builder.node(NodeId(i as u32)).clone()).collect()
    };
    // Which nodes depend on a target: only those carry cotangents.
    let mut depends = vec![false; nodes.len()];
    for t in targets {
        if t.index() < nodes.len() {
            depends[t.index()] = true;
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        if !depends[i] && node.dtype.is_float() {
            depends[i] = node.inputs.iter().any(|id| depends[id.index()]);
        }
    }
    let mut values = ForwardValues::new(&device, &nodes);
    let mut cotangent: FxHashMap<NodeId, Tensor> = FxHashMap::default();
    if !depends[loss_id.index()] {
        return Ok(FxHashMap::default());
    }
    cotangent.insert(loss_id, Tensor::ones(loss.shape().clone(), loss.dtype(), &device)?);
    for i in (0..nodes.len()).rev() {
        let id = NodeId(i as u32);
        let node = &nodes[i];
        if node.inputs.is_empty() || !depends[i] {
            continue;
        }
        let Some(g) = cotangent.remove(&id) else { continue };
        if targets.contains(&id) {
            cotangent.insert(id, g.clone());
        }
        // Rules that compare values (which input was the maximum) read
        // them exactly; the others read saved activations.
        let compares =
            matches!(node.op, Op::Reduce { op: ReduceOp::Max, .. } | Op::Binary(BinaryOp::Max | BinaryOp::Min));
        let inputs: Vec<Tensor> = node.inputs.iter().map(|&j| values.read(j, !compares)).collect::<Result<_>>()?;
        let wanted: Vec<bool> = node.inputs.iter().map(|j| depends[j.index()]).collect();
        let output = values.read(id, !compares)?;
        let grads = vjp::vjp(node, &inputs, &output, &g, &wanted)?;
        for ((input, grad), want) in node.inputs.iter().zip(grads).zip(wanted) {
            let (Some(grad), true) = (grad, want) else { continue };
            let total = match cotangent.remove(input) {
                Some(previous) => previous.add(&grad)?,
                None => grad,
            };
            cotangent.insert(*input, total);
        }
    }
    cotangent.retain(|id, _| targets.contains(id));
    Ok(cotangent)
}

/// The forward values the VJP rules read, as tensors; with
/// [`Device::save_activations_as`] in force, activations are read through a
/// narrow copy (see there).
struct ForwardValues<'a> {
    device: &'a Device,
    nodes: &'a [Node],
    saved_dtype: Option<DType>,
    exact: FxHashMap<NodeId, Tensor>,
    saved: FxHashMap<NodeId, Tensor>,
}

impl<'a> ForwardValues<'a> {
    fn new(device: &'a Device, nodes: &'a [Node]) -> Self {
        let saved_dtype = device.saved_activation_dtype();
        ForwardValues { device, nodes, saved_dtype, exact: FxHashMap::default(), saved: FxHashMap::default() }
    }

    fn exact(&mut self, id: NodeId) -> Tensor {
        self.exact.entry(id).or_insert_with(|| Tensor::from_live_node(self.device, id)).clone()
    }

    /// Node `id`'s value; through its narrow saved copy when `may_narrow`
    /// and the node is an activation worth saving narrow. A widening cast
    /// is read as it is (its narrow input is what is kept), and a cheap op
    /// of one activation and constants or parameters (a bias add, a
    /// scaling, GELU's erf, which the fusion planner recomputes too) is
    /// recomputed from that activation's saved copy, so one narrow copy
    /// serves a chain of such values.
    fn read(&mut self, id: NodeId, may_narrow: bool) -> Result<Tensor> {
        let Some(dtype) = self.saved_dtype.filter(|_| may_narrow && self.is_activation(id)) else {
            return Ok(self.exact(id));
        };
        if let Some(t) = self.saved.get(&id) {
            return Ok(t.clone());
        }
        let node = &self.nodes[id.index()];
        let inputs = node.inputs.clone();
        let activations: Vec<bool> = inputs.iter().map(|&j| self.is_activation(j)).collect();
        let value = match node.op {
            Op::Cast if self.nodes[inputs[0].index()].dtype.size_in_bytes() <= dtype.size_in_bytes() => self.exact(id),
            Op::Unary(op @ (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Erf)) if activations[0] => {
                self.read(inputs[0], true)?.unary(op)?
            }
            Op::Binary(op @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div))
                if activations.iter().filter(|&&a| a).count() == 1 =>
            {
                let a = if activations[0] { self.read(inputs[0], true)? } else { self.exact(inputs[0]) };
                let b = if activations[1] { self.read(inputs[1], true)? } else { self.exact(inputs[1]) };
                a.binary(op, &b)?
            }
            _ => self.exact(id).cast(dtype)?.cast(DType::F32)?,
        };
        self.saved.insert(id, value.clone());
        Ok(value)
    }

    /// An f32 value computed by the forward pass (not a parameter, a
    /// constant, a view of one, or a broadcast of a smaller value, which is
    /// cheap to keep as it is) of at least the minimum size.
    fn is_activation(&self, id: NodeId) -> bool {
        let node = &self.nodes[id.index()];
        if node.dtype != DType::F32 || node.shape.numel() < SAVED_ACTIVATION_MIN_ELEMENTS {
            return false;
        }
        let mut base = node;
        while matches!(base.op, Op::Reshape | Op::Permute(_) | Op::Slice { .. }) {
            base = &self.nodes[base.inputs[0].index()];
        }
        base.op != Op::Expand && !base.inputs.is_empty()
    }
}
