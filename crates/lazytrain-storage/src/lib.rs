//! Object storage for lazytrain: `gs://` and `s3://` buckets, `file://`
//! and plain paths behind one synchronous API.
//!
//! The field's library, `object_store`, talks to the stores; one small
//! tokio runtime owned here drives it, so the compute path stays
//! synchronous. Transient failures are retried with backoff and counted
//! ([`storage_metrics`]); a missing object or refused credentials is a
//! [`StorageError`] naming the URL. Shards are read through
//! [`RangedObject`] (ranged GETs of 8 MiB blocks, cached and fetched
//! ahead); checkpoints leave through an [`Uploader`] (a bounded background
//! queue).

pub mod emulators;
mod error;
mod folders;
mod metrics;
mod ops;
mod ranged;
mod retry;
mod stores;
mod uploader;
mod url;

pub use error::{Result, StorageError};
pub use folders::{cache_root, fetch_folder, upload_folder};
pub use metrics::{storage_metrics, StorageMetrics};
pub use object_store;
pub use ops::{
    delete, download_file, exists, glob, head, list, read, upload_file, write, ObjectInfo, MULTIPART_THRESHOLD,
    PART_SIZE,
};
pub use ranged::{block_cache_budget, RangedObject, ReadMode, BLOCK_SIZE};
pub use retry::RetryPolicy;
pub use stores::register_store;
pub use uploader::{remove_folder, UploadJob, UploadReport, Uploader};
pub use url::{Cloud, StorageUrl};
