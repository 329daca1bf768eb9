//! Errors of a replica group.

/// Why [`crate::spawn`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError<E> {
    /// A replica's function returned an error; the others were stopped.
    #[error("replica {rank} failed: {error}")]
    Replica {
        /// The replica that failed first.
        rank: usize,
        /// Its error.
        error: E,
    },
    /// A replica panicked; the others were stopped.
    #[error("replica {rank} panicked: {message}")]
    Panicked {
        /// The replica that panicked.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The group could not be set up (bad replica count, no threads).
    #[error("cannot start the replicas: {0}")]
    Setup(String),
}
