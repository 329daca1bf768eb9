//! Mixed precision scoped per device and thread: autocast (matmuls in
//! bf16) and the dtype autodiff saves activations in. A setting applies to
//! the ops the thread that set it traces; another thread tracing on the
//! same device meanwhile sees f32, and may not set its own.

use super::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::panic::Location;
use std::sync::Mutex;
use std::thread::ThreadId;

/// A precision setting in force and the thread it applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scoped {
    dtype: DType,
    thread: ThreadId,
}

/// The fewest elements an f32 activation has for
/// [`Device::save_activations_as`] to store it narrow: a smaller one costs
/// a kernel output more than its bytes save.
pub const SAVED_ACTIVATION_MIN_ELEMENTS: usize = 4096;

/// A mixed-precision setting that a [`PrecisionGuard`] scopes.
#[derive(Clone, Copy, Debug)]
enum PrecisionSetting {
    Autocast,
    SavedActivations,
}

/// Restores the previous value of the setting it scopes when dropped (see
/// [`Device::autocast`] and [`Device::save_activations_as`]).
#[must_use = "the setting ends when the guard is dropped"]
pub struct PrecisionGuard {
    device: Device,
    setting: PrecisionSetting,
    previous: Option<Scoped>,
}

impl Drop for PrecisionGuard {
    fn drop(&mut self) {
        *self.device.precision(self.setting).lock().unwrap_or_else(|p| p.into_inner()) = self.previous;
    }
}

impl Device {
    /// Mixed precision for the ops traced while the guard lives (PyTorch's
    /// `torch.autocast`): matmuls of f32 values cast their operands to
    /// `dtype` (bf16), multiply with f32 accumulation and cast the product
    /// back to f32. Everything else (softmax, LayerNorm, the loss, the
    /// optimizer) stays f32, and parameters stay f32 master weights. The
    /// casts are graph ops: the backward pass of such a matmul runs in
    /// `dtype` too, and the fuser folds the casts into neighbouring kernels.
    #[track_caller]
    pub fn autocast(&self, dtype: DType) -> Result<PrecisionGuard> {
        self.scope_precision(PrecisionSetting::Autocast, dtype)
    }

    /// The dtype matmuls of f32 values traced by this thread compute in
    /// right now, if it is autocasting.
    pub fn autocast_dtype(&self) -> Option<DType> {
        self.setting_here(PrecisionSetting::Autocast)
    }

    /// Store activations for the backward pass in `dtype` (bf16) while the
    /// guard lives (what `torch.autograd.graph.saved_tensors_hooks` that
    /// pack to bf16 do): every f32 forward value of at least
    /// [`SAVED_ACTIVATION_MIN_ELEMENTS`] elements that a gradient computed
    /// by `backward`/`grad` here reads is rounded to `dtype` once and
    /// widened where the backward reads it. The f32 value then dies with
    /// the forward pass (the fuser writes the narrow copy from the kernel
    /// that computes it and widens it in the kernels that read it), so the
    /// values kept from forward to backward take half the memory. The
    /// forward pass and the loss are unchanged; gradients carry the
    /// rounding of their saved inputs (bf16: 8 significant bits).
    /// Parameters and constants are read as they are.
    #[track_caller]
    pub fn save_activations_as(&self, dtype: DType) -> Result<PrecisionGuard> {
        self.scope_precision(PrecisionSetting::SavedActivations, dtype)
    }

    /// The dtype this thread's saved activations are stored in right now, if narrowed.
    pub fn saved_activation_dtype(&self) -> Option<DType> {
        self.setting_here(PrecisionSetting::SavedActivations)
    }

    /// `setting`'s dtype when it applies to the calling thread.
    fn setting_here(&self, setting: PrecisionSetting) -> Option<DType> {
        let scoped = *self.precision(setting).lock().unwrap_or_else(|p| p.into_inner());
        scoped.filter(|s| s.thread == std::thread::current().id()).map(|s| s.dtype)
    }

    fn precision(&self, setting: PrecisionSetting) -> &Mutex<Option<Scoped>> {
        match setting {
            PrecisionSetting::Autocast => &self.inner.autocast,
            PrecisionSetting::SavedActivations => &self.inner.saved_activations,
        }
    }

    /// Set `setting` to `dtype` (bf16, the one low precision these settings
    /// take) until the returned guard drops.
    #[track_caller]
    fn scope_precision(&self, setting: PrecisionSetting, dtype: DType) -> Result<PrecisionGuard> {
        if dtype != DType::BF16 {
            let (what, rule) = match setting {
                PrecisionSetting::Autocast => ("autocast", "autocast computes matmuls"),
                PrecisionSetting::SavedActivations => ("save_activations_as", "saved activations are stored"),
            };
            return Err(Error::Data {
                what,
                detail: format!("{rule} in bf16, not {dtype}"),
                location: Location::caller(),
            });
        }
        let thread = std::thread::current().id();
        let mut current = self.precision(setting).lock().unwrap_or_else(|p| p.into_inner());
        if current.is_some_and(|s| s.thread != thread) {
            let what = match setting {
                PrecisionSetting::Autocast => "autocast",
                PrecisionSetting::SavedActivations => "save_activations_as",
            };
            return Err(Error::Data {
                what,
                detail: "another thread holds this setting on the same device; mixed precision is scoped per \
                         thread, so trace each thread's steps on its own device (one per replica)"
                    .into(),
                location: Location::caller(),
            });
        }
        let previous = current.replace(Scoped { dtype, thread });
        Ok(PrecisionGuard { device: self.clone(), setting, previous })
    }
}
