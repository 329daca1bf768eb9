//! Errors of lazytrain-models.

/// Errors from configs, checkpoints and model construction.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An error from the layers.
    #[error(transparent)]
    Nn(#[from] lazytrain_nn::NnError),
    /// An error from the tensor engine.
    #[error(transparent)]
    Core(#[from] lazytrain_core::Error),
    /// A `config.json` that cannot be used.
    #[error("{path}: {detail}")]
    Config {
        /// The file (or `preset NAME`).
        path: String,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// A checkpoint whose tensors do not fit the model.
    #[error("checkpoint {path} does not fit the model:\n{}", problems.join("\n"))]
    Checkpoint {
        /// The weights file.
        path: String,
        /// One line per missing, unexpected or mismatched tensor.
        problems: Vec<String>,
    },
    /// File system errors.
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        detail: String,
    },
}

/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// `t`'s `N` dimensions, or an error saying what `what` must be when it
/// has another rank (`layout`, e.g. `[batch, seq, hidden]`).
pub(crate) fn dims_of<const N: usize>(t: &lazytrain_core::Tensor, what: &str, layout: &str) -> Result<[usize; N]> {
    t.dims().try_into().map_err(|_| ModelError::Config {
        path: "model inputs".into(),
        detail: format!("{what} must be {layout} (rank {N}), got shape {}", t.shape()),
    })
}
