//! # lazytrain-core
//!
//! Lazy tensors and the engine behind them:
//!
//! 1. **Trace.** [`Tensor`] ops check shapes and dtypes (a bad op fails at the
//!    caller's line with a typed [`Error`]), append a hash-consed node to the
//!    device's live graph ([`ir`]) and return immediately.
//! 2. **Cut.** [`Device::sync`] (or reading a value) makes every live pending
//!    tensor an output and every device buffer read a numbered parameter.
//! 3. **Cache.** The graph's structural hash keys the compile cache
//!    ([`cache`]); a miss is explained by comparing with the nearest graph
//!    from the same sync site ([`metrics`]).
//! 4. **Compile.** A declared pipeline of pure passes ([`compile`]) simplifies
//!    the graph; the backend-neutral [`schedule`] decides fusion, views and
//!    the liveness memory plan for the backend's capabilities; the backend
//!    ([`backend`]) lowers that schedule into its executable.
//! 5. **Run.** The executable computes the outputs into device buffers.
//!
//! The reference interpreter ([`interp`]) evaluates graphs without any of
//! this and is the oracle the tests compare against; the reference backend
//! ([`backend::ReferenceBackend`]) runs the same oracle kernels behind the
//! backend trait (`LAZYTRAIN_BACKEND=reference`).
//!
//! ```
//! use lazytrain_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], &dev)?;
//! let y = x.matmul(&x)?.softmax(-1)?;
//! dev.sync()?;
//! assert_eq!(y.dims(), &[2, 2]);
//! assert!((y.to_vec::<f32>()?.iter().sum::<f32>() - 2.0).abs() < 1e-6);
//! # Ok::<(), lazytrain_core::Error>(())
//! ```

pub mod atomic_file;
pub mod autodiff;
pub mod backend;
pub mod cache;
pub mod collective;
pub mod compile;
mod device;
mod dtype;
mod error;
pub mod interp;
pub mod ir;
mod kernels;
mod line_aligned;
pub mod metrics;
pub mod output_folder;
pub mod random;
pub mod schedule;
mod scratch_dir;
mod shape;
mod storage;
mod tensor;

pub use autodiff::grad;
pub use device::{available_memory_bytes, Device, DeviceOptions, PrecisionGuard, SAVED_ACTIVATION_MIN_ELEMENTS};
pub use dtype::{DType, Literal};
pub use error::{panic_message, Error, Result, RuleError, RuleKind};
pub use kernels::{bf16_matmul_method, fma_peak_gflops, MatmulKernel};
pub use line_aligned::LineAligned;
pub use output_folder::{check_output_folder, FileInPlaceOfFolder};
pub use scratch_dir::ScratchDir;
pub use shape::Shape;
pub use storage::{live_buffer_bytes, peak_buffer_bytes, BackendMemory, Buffer, DeviceMemory, Element, HostData};
pub use tensor::{broadcast_shapes, Tensor};
