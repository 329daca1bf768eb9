//! Errors of lazytrain-nn.

/// Errors from layers, optimizers and state I/O.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// An error from the tensor engine.
    #[error(transparent)]
    Core(#[from] lazytrain_core::Error),
    /// A state dict does not fit the module or optimizer it is loaded into.
    #[error("cannot load the state dict into {target}:\n{}", problems.join("\n"))]
    StateMismatch {
        /// What was being loaded (`module`, `optimizer`).
        target: String,
        /// One line per missing, unexpected or wrongly shaped tensor.
        problems: Vec<String>,
    },
    /// A safetensors file could not be read or written.
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: String,
        /// What went wrong and how to fix it.
        detail: String,
    },
    /// A bad hyperparameter or argument.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// The argument.
        what: &'static str,
        /// Why it is invalid.
        detail: String,
    },
}

/// `Result` with [`NnError`].
pub type Result<T, E = NnError> = std::result::Result<T, E>;
