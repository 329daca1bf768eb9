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
    /// A record whose framing or checksum is wrong.
    #[error("{path}: record {record} at byte {offset}: {detail}; the shard is corrupt (re-create it, or pass --skip-corrupt to skip bad records)")]
    Corrupt {
        /// The shard.
        path: String,
        /// Record index in the file.
        record: usize,
        /// Byte offset of the record header.
        offset: u64,
        /// What failed.
        detail: String,
    },
    /// A row of labelled data that cannot be used.
    #[error("{path}:{line}: {detail} (fix the row, or pass --skip-bad-rows to skip and count bad rows)")]
    BadRow {
        /// The data file.
        path: String,
        /// 1-based line of the row.
        line: u64,
        /// What is wrong with it.
        detail: String,
    },
    /// Bad input text or arguments.
    #[error("{0}")]
    Invalid(String),
    /// A bucket or file that cannot be reached (the error names the URL).
    #[error(transparent)]
    Storage(#[from] lazytrain_storage::StorageError),
    /// An error from the tensor engine.
    #[error(transparent)]
    Core(#[from] lazytrain_core::Error),
}

/// `Result` with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;
