//! Storage errors: each names the URL and, where it helps, the fix.

use thiserror::Error;

/// Errors from reading or writing local folders and buckets.
#[derive(Clone, Debug, Error)]
pub enum StorageError {
    /// A URL that cannot be parsed or addressed.
    #[error("`{url}`: {detail}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// The object (or every object under a prefix) does not exist.
    #[error("{url}: no such object{hint}")]
    NotFound {
        /// The URL.
        url: String,
        /// A fix, starting with "; " (or empty).
        hint: String,
    },
    /// The store refused the credentials or the operation.
    #[error(
        "{url}: access denied ({detail}); check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
             GOOGLE_APPLICATION_CREDENTIALS) and the bucket's permissions"
    )]
    Denied {
        /// The URL.
        url: String,
        /// The store's message.
        detail: String,
    },
    /// A transient failure (5xx, timeout, reset) that outlived its retries.
    #[error("{url}{at}: {detail} (gave up after {attempts} attempts)")]
    Unavailable {
        /// The URL.
        url: String,
        /// " at byte N" for ranged reads, or empty.
        at: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        detail: String,
    },
    /// The store could not be configured (endpoint, credentials file, ...).
    #[error("cannot use {url}: {detail}")]
    Config {
        /// The URL (or bucket).
        url: String,
        /// What is missing or wrong.
        detail: String,
    },
    /// Any other failure of an operation on `url`.
    #[error("{url}: {detail}")]
    Other {
        /// The URL or path.
        url: String,
        /// What happened.
        detail: String,
    },
}

/// Result with [`StorageError`].
pub type Result<T> = std::result::Result<T, StorageError>;
