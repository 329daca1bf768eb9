//! Reading values back to the host (each read of a pending value forces a sync).

use super::{Tensor, TensorState};
use crate::error::{Error, Result};
use crate::storage::{Element, HostData};
use std::fmt;
use std::panic::Location;

impl Tensor {
    /// The value on the host. A pending value forces a sync of the whole live
    /// graph, counted in the metrics with this call's location.
    #[track_caller]
    pub fn to_host(&self) -> Result<HostData> {
        let location = Location::caller();
        if self.is_pending() {
            self.device().forced_sync(location)?;
        }
        let state = self.cell.lock_state().duplicate();
        let data = match state {
            TensorState::Ready(buffer) => {
                let start = std::time::Instant::now();
                let in_flight = !buffer.is_ready();
                let value = buffer.wait_memory().map(|_| ());
                if in_flight {
                    self.device().record_host_wait(start);
                }
                if let Err(message) = value {
                    return Err(Error::Data {
                        what: "to_vec",
                        detail: format!("the value could not be computed: {message}"),
                        location,
                    });
                }
                self.device().backend().copy_out(&buffer)?
            }
            TensorState::Failed(message) => {
                return Err(Error::Data {
                    what: "to_vec",
                    detail: format!("the value could not be computed: {message}"),
                    location,
                })
            }
            TensorState::Pending(_) => {
                return Err(Error::Data {
                    what: "to_vec",
                    detail: "the value is still pending after a sync".into(),
                    location,
                })
            }
        };
        let bytes = data.size_in_bytes() as u64;
        self.device().metrics_store().update(|m| m.device_to_host_bytes += bytes);
        Ok(data)
    }

    /// The elements as a flat vector of `T` (which must match the dtype).
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let location = Location::caller();
        if T::DTYPE != self.dtype() {
            return Err(Error::Data {
                what: "to_vec",
                detail: format!(
                    "asked for {} elements of a {} tensor {}; cast it first",
                    T::DTYPE,
                    self.dtype(),
                    self.shape()
                ),
                location,
            });
        }
        let data = self.to_host()?;
        Ok(T::from_host(&data).map(<[T]>::to_vec).unwrap_or_default())
    }

    /// The elements widened to `f64`, whatever the dtype.
    #[track_caller]
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }

    /// The single element of a one-element tensor.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::Data {
                what: "item",
                detail: format!("item() needs exactly one element, the tensor has shape {}", self.shape()),
                location: Location::caller(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

fn write_nested(f: &mut fmt::Formatter<'_>, values: &[f64], dims: &[usize], float: bool) -> fmt::Result {
    if dims.is_empty() {
        return if float { write!(f, "{:.4}", values[0]) } else { write!(f, "{}", values[0]) };
    }
    let inner: usize = dims[1..].iter().product();
    write!(f, "[")?;
    for i in 0..dims[0] {
        if i > 0 {
            write!(f, ", ")?;
        }
        write_nested(f, &values[i * inner..(i + 1) * inner], &dims[1..], float)?;
    }
    write!(f, "]")
}

impl fmt::Display for Tensor {
    /// Prints the values (forcing a sync if pending), like `tensor([...], dtype=f32)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_f64_vec() {
            Ok(values) => {
                write!(f, "tensor(")?;
                write_nested(f, &values, self.dims(), self.dtype().is_float())?;
                write!(f, ", dtype={})", self.dtype())
            }
            Err(e) => write!(f, "tensor(<error: {e}>)"),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}{}, {}, {})",
            self.dtype(),
            self.shape(),
            if self.is_pending() { "pending" } else { "ready" },
            self.device().name()
        )
    }
}
