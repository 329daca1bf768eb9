//! The errors of the lazytrain library and CLI.

/// Everything the lazytrain library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tensor engine.
    #[error(transparent)]
    Core(#[from] lazytrain_core::Error),
    /// Layers, optimizers and state files.
    #[error(transparent)]
    Nn(#[from] lazytrain_nn::NnError),
    /// Model configs and checkpoints.
    #[error(transparent)]
    Model(#[from] lazytrain_models::ModelError),
    /// Tokenizers and data.
    #[error(transparent)]
    Data(#[from] lazytrain_data::DataError),
    /// Inputs a pipeline cannot handle.
    #[error("{0}")]
    Input(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
