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
    /// Buckets and files (the error names the URL).
    #[error(transparent)]
    Storage(#[from] lazytrain_storage::StorageError),
    /// Tokenizers and data.
    #[error(transparent)]
    Data(#[from] lazytrain_data::DataError),
    /// Inputs a pipeline cannot handle.
    #[error("{0}")]
    Input(String),
    /// A checkpoint that could not be resumed from (a damaged file, files of
    /// two saves), with the newest checkpoint before it, which may be intact.
    #[error("cannot resume from {checkpoint}: {source}{}", earlier_hint(checkpoint, earlier.as_deref()))]
    Resume {
        /// The checkpoint folder.
        checkpoint: String,
        /// The newest checkpoint before it in the same folder, if any.
        earlier: Option<String>,
        /// What was wrong with it.
        source: Box<Error>,
    },
    /// A data-parallel replica failed (its error, or a panic), stopping the others.
    #[error("replica {rank}: {source}")]
    Replica {
        /// The replica that failed first.
        rank: usize,
        /// Its error.
        source: Box<Error>,
    },
}

impl From<lazytrain_dist::SpawnError<Error>> for Error {
    fn from(e: lazytrain_dist::SpawnError<Error>) -> Error {
        match e {
            lazytrain_dist::SpawnError::Replica { rank, error } => Error::Replica { rank, source: Box::new(error) },
            lazytrain_dist::SpawnError::Panicked { rank, message } => {
                Error::Replica { rank, source: Box::new(Error::Input(format!("panicked: {message}"))) }
            }
            lazytrain_dist::SpawnError::Setup(detail) => Error::Input(detail),
        }
    }
}

/// The fix [`Error::Resume`] suggests: the checkpoint before the damaged one.
fn earlier_hint(checkpoint: &str, earlier: Option<&str>) -> String {
    earlier.map_or(String::new(), |e| {
        format!(
            "\nthe checkpoint before it, {e}, may be intact: resume from it with --resume-from-checkpoint {e} \
             (or move {checkpoint} away)"
        )
    })
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
