//! Counters of the storage layer, read into the training metrics.

use std::sync::atomic::{AtomicU64, Ordering};

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);
static BYTES_READ: AtomicU64 = AtomicU64::new(0);
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
static FAILED_UPLOADS: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the storage counters (process-wide, since start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageMetrics {
    /// Requests sent to buckets (retries included).
    pub requests: u64,
    /// Transient failures retried (5xx, timeouts, connection resets).
    pub retries: u64,
    /// Bytes read from buckets.
    pub bytes_read: u64,
    /// Bytes written to buckets.
    pub bytes_written: u64,
    /// Background uploads that failed for good.
    pub failed_uploads: u64,
}

impl std::fmt::Display for StorageMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} transient failures retried, {:.1} MB read, {:.1} MB written, {} uploads failed",
            self.requests,
            self.retries,
            self.bytes_read as f64 / 1e6,
            self.bytes_written as f64 / 1e6,
            self.failed_uploads
        )
    }
}

/// The counters now.
pub fn storage_metrics() -> StorageMetrics {
    StorageMetrics {
        requests: REQUESTS.load(Ordering::Relaxed),
        retries: RETRIES.load(Ordering::Relaxed),
        bytes_read: BYTES_READ.load(Ordering::Relaxed),
        bytes_written: BYTES_WRITTEN.load(Ordering::Relaxed),
        failed_uploads: FAILED_UPLOADS.load(Ordering::Relaxed),
    }
}

pub(crate) fn count_request() {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_retry() {
    RETRIES.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_read(bytes: u64) {
    BYTES_READ.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn count_written(bytes: u64) {
    BYTES_WRITTEN.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn count_failed_upload() {
    FAILED_UPLOADS.fetch_add(1, Ordering::Relaxed);
}
