//! Retrying transient bucket failures with exponential backoff.
//!
//! object_store reports missing objects, refused credentials and failed
//! preconditions as their own variants and everything transport-level
//! (5xx, timeouts, connection resets or refusals) as `Generic`: the latter
//! is retried, the former never (retrying a 404 only delays the error).

use crate::metrics;
use crate::{Result, StorageError};
use std::future::Future;
use std::time::Duration;

/// How often and how patiently a request is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// Wait before the first retry; doubles each time.
    pub first_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The default (6 attempts, 200 ms doubling to at most 5 s: about 11 s
    /// of waiting), or `LAZYTRAIN_STORAGE_ATTEMPTS` attempts.
    pub fn from_env() -> RetryPolicy {
        let attempts = std::env::var("LAZYTRAIN_STORAGE_ATTEMPTS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
        RetryPolicy {
            attempts: u32::max(attempts, 1),
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }

    fn backoff(&self, retry: u32) -> Duration {
        self.first_backoff.saturating_mul(1u32 << retry.min(16)).min(self.max_backoff)
    }
}

/// The outcome of one failed attempt.
pub(crate) enum Failure {
    /// Worth retrying.
    Transient(String),
    /// Final.
    Fatal(StorageError),
}

/// Classify an object_store error for `url`.
pub(crate) fn classify(url: &str, error: object_store::Error) -> Failure {
    use object_store::Error as E;
    match error {
        E::NotFound { .. } => Failure::Fatal(StorageError::NotFound { url: url.to_string(), hint: String::new() }),
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
            Failure::Fatal(StorageError::Denied { url: url.to_string(), detail: source.to_string() })
        }
        E::Generic { source, .. } => Failure::Transient(source.to_string()),
        // Everything else (bad paths, preconditions, unsupported operations,
        // and variants object_store adds later: it is non-exhaustive) is final.
        other => Failure::Fatal(StorageError::Other { url: url.to_string(), detail: other.to_string() }),
    }
}

/// Run `attempt` until it succeeds, fails for good, or `policy` runs out;
/// `at` (" at byte N" or empty) goes into the final error.
pub(crate) async fn with_retries<T, F, Fut>(url: &str, at: &str, policy: RetryPolicy, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, object_store::Error>>,
{
    let mut retry = 0;
    loop {
        metrics::count_request();
        let detail = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => match classify(url, error) {
                Failure::Fatal(error) => return Err(error),
                Failure::Transient(detail) => detail,
            },
        };
        if retry + 1 >= policy.attempts {
            return Err(StorageError::Unavailable {
                url: url.to_string(),
                at: at.to_string(),
                attempts: policy.attempts,
                detail,
            });
        }
        metrics::count_retry();
        tokio::time::sleep(policy.backoff(retry)).await;
        retry += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let policy =
            RetryPolicy { attempts: 9, first_backoff: Duration::from_millis(200), max_backoff: Duration::from_secs(5) };
        let waits: Vec<u128> = (0..7).map(|r| policy.backoff(r).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
