//! Shape and data movement: reshape, permute, broadcast, slice, concat, pad,
//! gather/scatter, matmul and the replica all-reduce.

use super::elementwise::broadcast_shapes;
use super::reduce::normalize_axis;
use super::{rule, trace, Tensor};
use crate::dtype::{DType, Literal};
use crate::error::{Error, Result, RuleError, RuleKind};
use crate::ir::{infer, AllReduceOp, Op};
use crate::shape::Shape;
use std::panic::Location;

impl Tensor {
    /// The same elements in a new shape (row-major order).
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let loc = Location::caller();
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        let out = rule("reshape", loc, infer::reshape(self.meta(), &shape))?;
        trace("reshape", loc, self.device(), Op::Reshape, &[self], out)
    }

    /// Reorder axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let out = rule("permute", loc, infer::permute(self.meta(), perm))?;
        trace("permute", loc, self.device(), Op::Permute(perm.to_vec()), &[self], out)
    }

    /// Swap two axes (negative counts from the end).
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let a = rule("transpose", loc, normalize_axis(a, self.shape()))?;
        let b = rule("transpose", loc, normalize_axis(b, self.shape()))?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Insert a size-1 axis at `axis` (`-1` appends).
    #[track_caller]
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let extended = Shape::new(vec![1; self.rank() + 1]);
        let axis = rule("unsqueeze", loc, normalize_axis(axis, &extended))?;
        let mut dims = self.dims().to_vec();
        dims.insert(axis, 1);
        self.reshape(dims)
    }

    /// Remove the size-1 axis `axis`.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = rule("squeeze", loc, normalize_axis(axis, self.shape()))?;
        if self.dims()[axis] != 1 {
            let e = RuleError::new(
                RuleKind::Shape,
                format!("cannot squeeze axis {axis} of size {} in {}", self.dims()[axis], self.shape()),
            );
            return Err(Error::from_rule("squeeze", e, loc));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(axis);
        self.reshape(dims)
    }

    /// Broadcast to `shape` with NumPy rules (leading axes are added as needed).
    #[track_caller]
    pub fn broadcast_to(&self, shape: &Shape) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let loc = Location::caller();
        let fits = rule("broadcast_to", loc, broadcast_shapes(self.shape(), shape))?;
        if &fits != shape {
            let e = RuleError::new(RuleKind::Shape, format!("cannot broadcast {} to {}", self.shape(), shape));
            return Err(Error::from_rule("broadcast_to", e, loc));
        }
        let mut dims = vec![1; shape.rank() - self.rank()];
        dims.extend_from_slice(self.dims());
        let ranked = self.reshape(dims)?;
        let out = rule("broadcast_to", loc, infer::expand(ranked.meta(), shape))?;
        trace("broadcast_to", loc, self.device(), Op::Expand, &[&ranked], out)
    }

    /// The window `starts .. starts + sizes` (step 1).
    #[track_caller]
    pub fn slice(&self, starts: &[usize], sizes: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let out = rule("slice", loc, infer::slice(self.meta(), starts, sizes))?;
        trace("slice", loc, self.device(), Op::Slice { starts: starts.to_vec() }, &[self], out)
    }

    /// `len` elements of `axis` from `start` (`torch.narrow`).
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = rule("narrow", loc, normalize_axis(axis, self.shape()))?;
        let mut starts = vec![0; self.rank()];
        let mut sizes = self.dims().to_vec();
        starts[axis] = start;
        sizes[axis] = len;
        self.slice(&starts, &sizes)
    }

    /// Join tensors along `axis` (`torch.cat`).
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let Some(first) = tensors.first() else {
            return Err(Error::from_rule(
                "cat",
                RuleError::new(RuleKind::Argument, "cat needs at least one tensor"),
                loc,
            ));
        };
        let axis = rule("cat", loc, normalize_axis(axis, first.shape()))?;
        let metas: Vec<_> = tensors.iter().map(|t| t.meta()).collect();
        let out = rule("cat", loc, infer::concat(&metas, axis))?;
        trace("cat", loc, first.device(), Op::Concat { axis }, tensors, out)
    }

    /// Pad with `low[d]` elements before and `high[d]` after axis `d`, all `value`.
    #[track_caller]
    pub fn pad(&self, low: &[usize], high: &[usize], value: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let out = rule("pad", loc, infer::pad(self.meta(), low, high))?;
        let op = Op::Pad { low: low.to_vec(), high: high.to_vec(), value: Literal::new(value, self.dtype()) };
        trace("pad", loc, self.device(), op, &[self], out)
    }

    /// `torch.gather`: `out[i][j] = self[index[i][j]][j]` for `axis = 0`, etc.
    #[track_caller]
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = rule("gather", loc, normalize_axis(axis, self.shape()))?;
        let out = rule("gather", loc, infer::gather(self.meta(), index.meta(), axis))?;
        trace("gather", loc, self.device(), Op::Gather { axis }, &[self, index], out)
    }

    /// `torch.scatter_add`: a copy of `self` with `updates[i][j]` added at
    /// `[index[i][j]][j]` for `axis = 0`, etc.
    #[track_caller]
    pub fn scatter_add(&self, axis: isize, index: &Tensor, updates: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = rule("scatter_add", loc, normalize_axis(axis, self.shape()))?;
        let out = rule("scatter_add", loc, infer::scatter_add(self.meta(), index.meta(), updates.meta(), axis))?;
        trace("scatter_add", loc, self.device(), Op::ScatterAdd { axis }, &[self, index, updates], out)
    }

    /// Rows of this `[vocab, hidden]` table picked by integer `ids` of any
    /// shape: the result has shape `ids.shape + [hidden]`.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        if self.rank() != 2 {
            let e = RuleError::new(
                RuleKind::Shape,
                format!("the embedding table must be [vocab, hidden], got {}", self.shape()),
            );
            return Err(Error::from_rule("embedding", e, loc));
        }
        let hidden = self.dims()[1];
        let n = ids.numel();
        let index = ids.reshape([n, 1])?.broadcast_to(&Shape::new([n, hidden]))?;
        let rows = self.gather(0, &index)?;
        let mut dims = ids.dims().to_vec();
        dims.push(hidden);
        rows.reshape(dims)
    }

    /// Matrix product with NumPy semantics for rank >= 2: batch dimensions
    /// broadcast; a rank-2 right operand is shared by every batch entry.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        if self.rank() < 2 || rhs.rank() < 2 {
            let e = RuleError::new(
                RuleKind::Shape,
                format!(
                    "matmul needs operands of rank >= 2, got {} and {}; unsqueeze vectors first",
                    self.shape(),
                    rhs.shape()
                ),
            );
            return Err(Error::from_rule("matmul", e, loc));
        }
        if rhs.rank() == 2 && self.rank() > 2 {
            let (k, rows) = (self.dims()[self.rank() - 1], self.numel() / self.dims()[self.rank() - 1].max(1));
            let flat = self.reshape([rows, k])?;
            let product = flat.matmul_transposed(rhs, false, false)?;
            let mut dims = self.dims()[..self.rank() - 1].to_vec();
            dims.push(rhs.dims()[1]);
            return product.reshape(dims);
        }
        let (ba, bb) = (Shape::new(&self.dims()[..self.rank() - 2]), Shape::new(&rhs.dims()[..rhs.rank() - 2]));
        let batch = rule("matmul", loc, broadcast_shapes(&ba, &bb))?;
        let full = |t: &Tensor| {
            let mut dims = batch.dims().to_vec();
            dims.extend_from_slice(&t.dims()[t.rank() - 2..]);
            Shape::new(dims)
        };
        let a = self.broadcast_to(&full(self))?;
        let b = rhs.broadcast_to(&full(rhs))?;
        a.matmul_transposed(&b, false, false)
    }

    /// The `dot` primitive: `[.., M, K] x [.., K, N]` with equal batch
    /// dimensions, where `lhs_t`/`rhs_t` say an operand is stored transposed.
    /// Inside [`Device::autocast`] an f32 product computes in bf16 (operands
    /// cast, f32 accumulation) and is cast back to f32.
    #[track_caller]
    pub fn matmul_transposed(&self, rhs: &Tensor, lhs_t: bool, rhs_t: bool) -> Result<Tensor> {
        let loc = Location::caller();
        if let Some(low) = self.device().autocast_dtype() {
            if self.dtype() == DType::F32 || rhs.dtype() == DType::F32 {
                let cast = |t: &Tensor| if t.dtype() == DType::F32 { t.cast(low) } else { Ok(t.clone()) };
                let (a, b) = (cast(self)?, cast(rhs)?);
                let out = rule("matmul", loc, infer::dot(a.meta(), b.meta(), lhs_t, rhs_t))?;
                return trace("matmul", loc, self.device(), Op::Dot { lhs_t, rhs_t }, &[&a, &b], out)?.cast(DType::F32);
            }
        }
        let out = rule("matmul", loc, infer::dot(self.meta(), rhs.meta(), lhs_t, rhs_t))?;
        trace("matmul", loc, self.device(), Op::Dot { lhs_t, rhs_t }, &[self, rhs], out)
    }

    /// Combine this value across data-parallel replicas (the identity with one replica).
    #[track_caller]
    pub fn all_reduce(&self, op: AllReduceOp) -> Result<Tensor> {
        let loc = Location::caller();
        trace("all_reduce", loc, self.device(), Op::AllReduce(op), &[self], (self.shape().clone(), self.dtype()))
    }

    /// This value, treated as a constant by autodiff: no gradient flows
    /// through it (`torch.Tensor.detach` inside a traced step). It costs
    /// nothing at run time.
    #[track_caller]
    pub fn stop_gradient(&self) -> Result<Tensor> {
        let loc = Location::caller();
        trace("stop_gradient", loc, self.device(), Op::StopGradient, &[self], (self.shape().clone(), self.dtype()))
    }
}
