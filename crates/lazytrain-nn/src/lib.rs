//! # lazytrain-nn
//!
//! What a model is made of, on top of `lazytrain-core`'s lazy tensors:
//!
//! - [`Module`]: named, ordered parameters with dotted Hugging Face-style
//!   names (`encoder.layer.0.attention.self.query.weight`);
//! - layers: [`Linear`], [`Conv1D`], [`Embedding`], [`LayerNorm`], [`Dropout`],
//!   [`SelfAttention`], with BERT's initialisers ([`init`]);
//! - [`Context`]: train/eval mode and the in-graph dropout key (seed and
//!   step are graph inputs, so masks never come from the host);
//! - optimizers ([`optim::AdamW`], [`optim::Sgd`]) whose updates are traced
//!   into the step graph, LR schedules fed as scalar inputs, global-norm
//!   gradient clipping inside the graph;
//! - state I/O ([`state`]): `state_dict`/`load_state_dict` and safetensors files.

mod attention;
mod context;
mod error;
pub mod init;
mod layers;
mod module;
pub mod optim;
pub mod state;

pub use attention::SelfAttention;
pub use context::Context;
pub use error::{NnError, Result};
pub use layers::{Conv1D, Dropout, Embedding, LayerNorm, Linear};
pub use module::{named_parameters, Module};
