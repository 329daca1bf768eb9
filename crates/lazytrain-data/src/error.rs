//! Errors of lazytrain-data.

/// Errors from tokenizers, shards and loaders.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file that cannot be read or written.
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        detail: String,
    },
    /// A tokenizer that cannot be used.
    #[error("tokenizer {path}: {detail}")]
    Tokenizer {
        /// The tokenizer file or folder.
        path: String,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// Bad input text or arguments.
    #[error("{0}")]
    Invalid(String),
    /// An error from the tensor engine.
    #[error(transparent)]
    Core(#[from] lazytrain_core::Error),
}

/// `Result` with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;
