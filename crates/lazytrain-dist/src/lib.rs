//! # lazytrain-dist
//!
//! Data-parallel training in the manner of PyTorch/XLA's `xmp.spawn`:
//!
//! - [`spawn`] runs n replicas as threads. Each gets its own [`Device`]
//!   (ordinal, world size, a share of the cores, optionally asynchronous)
//!   and all of them share one compile cache, so a step compiles once for
//!   the whole group. [`spawn_with`] takes the [`Launcher`] that yields
//!   each replica's rank, backend and collective: [`ThreadLauncher`] is
//!   threads of one process; a multi-process launcher plugs in the same way.
//! - `all_reduce` is an IR op; inside a step the executable reduces over the
//!   group through a [`Collective`]. [`InProcessCollective`] meets the
//!   replicas at a barrier and reduces their buffers in shared memory, each
//!   replica summing its own slice of every buffer (no staging copies).
//! - [`optimizer_step`] all-reduces the gradients (mean) and applies the
//!   update, all inside the step graph; [`train_step`] is the whole step
//!   (autocast, forward, backward, reduction, clipping, update, `mark_step`)
//!   that the Trainer, `lazytrain bench` and user loops share.
//! - A replica that fails or panics aborts the group: replicas waiting at a
//!   barrier return at once and [`spawn`] returns the failing replica's error.
//!
//! [`Device`]: lazytrain_core::Device
//! [`Collective`]: lazytrain_core::collective::Collective

mod barrier;
mod broadcast;
mod error;
mod in_process;
mod launcher;
#[cfg(feature = "mpi")]
pub mod mpi;
mod optimizer;
mod process_group;
mod replica;
mod step;

pub use broadcast::{broadcast_from_master, check_same_as_master};
pub use error::SpawnError;
pub use in_process::InProcessCollective;
pub use launcher::{
    default_launcher, finish_process, is_master_process, mpi_job_position, processes_on_this_host, Launcher,
    ReplicaSetup, ThreadLauncher,
};
pub use optimizer::{optimizer_step, reduce_gradients};
pub use process_group::{HierarchicalCollective, ProcessGroup};
pub use replica::{spawn, spawn_with, Replica, SpawnConfig, DEFAULT_COLLECTIVE_TIMEOUT, MAX_REPLICAS};
pub use step::{train_step, StepConfig, StepOutput};
