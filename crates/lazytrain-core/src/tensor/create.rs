//! Creating tensors: from host data (device-resident inputs) and from
//! traced constants, ranges and random draws.

use super::{rule, trace, Tensor};
use crate::device::Device;
use crate::dtype::{DType, Literal};
use crate::error::{Error, Result};
use crate::ir::{infer, Op};
use crate::shape::Shape;
use crate::storage::{Buffer, Element, HostData};
use std::panic::Location;
use std::sync::Arc;

impl Tensor {
    /// Copy `data` to `device` as a tensor of `shape`. The value is a graph
    /// *input*: changing it between steps never recompiles.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_host(T::into_host(data), shape, device)
    }

    /// Copy typed host data to `device`.
    #[track_caller]
    pub fn from_host(data: HostData, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(Error::Data {
                what: "from_vec",
                detail: format!("{} values cannot fill shape {} ({} elements)", data.len(), shape, shape.numel()),
                location: Location::caller(),
            });
        }
        let bytes = data.size_in_bytes() as u64;
        let buffer = device.backend().copy_in(data)?;
        device.metrics_store().update(|m| m.host_to_device_bytes += bytes);
        Ok(Tensor::ready(Arc::new(buffer), shape, device))
    }

    /// A rank-0 input tensor: the way to feed values that change every step
    /// (learning rate, step counter, RNG seed) without recompiling. When the
    /// backend cannot take the value, the tensor holds that failure and
    /// reports it where it is used.
    pub fn scalar<T: Element>(value: T, device: &Device) -> Tensor {
        let data = T::into_host(vec![value]);
        let bytes = data.size_in_bytes() as u64;
        device.metrics_store().update(|m| m.host_to_device_bytes += bytes);
        let buffer = device.backend().copy_in(data).unwrap_or_else(|e| {
            let failed = Buffer::in_flight(T::DTYPE);
            failed.fulfil(Err(e.to_string().into()));
            failed
        });
        Tensor::ready(Arc::new(buffer), Shape::scalar(), device)
    }

    /// A constant tensor with every element `value`. The value is part of
    /// the graph (and its hash): use [`Tensor::scalar`] for values that change.
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        trace("full", Location::caller(), device, Op::Constant(Literal::new(value, dtype)), &[], (shape, dtype))
    }

    /// All zeros.
    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// All ones.
    #[track_caller]
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// `[0, 1, ..., n-1]`.
    #[track_caller]
    pub fn arange(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::iota([n], 0, dtype, device)
    }

    /// Values counting along `axis` of `shape`, constant along the others.
    #[track_caller]
    pub fn iota(shape: impl Into<Shape>, axis: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let loc = Location::caller();
        let shape = shape.into();
        let out = rule("iota", loc, infer::iota(&shape, axis, dtype))?;
        trace("iota", loc, device, Op::Iota { axis }, &[], out)
    }

    /// Uniform values in `[0, 1)` from the counter-based generator keyed by
    /// `seed` (an integer scalar input). Each call in one graph draws from a
    /// new stream, so two draws with one seed differ, and the same program
    /// with the same seed gives the same values.
    #[track_caller]
    pub fn rand_uniform(shape: impl Into<Shape>, dtype: DType, seed: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let shape = shape.into();
        let out = rule("rand_uniform", loc, infer::rng_uniform(seed.meta(), &shape, dtype))?;
        let stream = seed.device().lock_live().next_rng_stream();
        trace("rand_uniform", loc, seed.device(), Op::RngUniform { stream }, &[seed], out)
    }
}
