//! One `ObjectStore` per bucket, configured by the ecosystem's conventions,
//! and the one small tokio runtime that drives them.
//!
//! S3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION`/`AWS_DEFAULT_REGION` (default `us-east-1`), and for
//! S3-compatible stores `AWS_ENDPOINT_URL` with `AWS_ALLOW_HTTP=true`.
//! GCS: `GOOGLE_APPLICATION_CREDENTIALS` (a service-account or
//! authorized-user file), `GOOGLE_SERVICE_ACCOUNT`, or the metadata server;
//! `STORAGE_EMULATOR_HOST` points at an emulator (no credentials then).
//! Values are read, never printed.

use crate::url::Cloud;
use crate::{Result, StorageError};
use object_store::aws::AmazonS3Builder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{ObjectStore, RetryConfig};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

/// The I/O runtime: two worker threads, so transfers overlap compute while
/// the training threads stay synchronous.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lazytrain-io")
            .enable_all()
            .build()
            .expect("a tokio runtime (threads and a timer) can be built")
    })
}

/// Run `future` on the I/O runtime and wait for it (from a thread that is
/// not one of the runtime's own).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// reqwest's TLS needs a process-wide crypto provider before any client
/// is built; one installed earlier (by an embedding program) is kept.
pub(crate) fn install_crypto_provider() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

type Registry = Mutex<HashMap<(Cloud, String), Arc<dyn ObjectStore>>>;

fn registry() -> &'static Registry {
    static STORES: OnceLock<Registry> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// Use `store` for every URL in `bucket` of `cloud` from now on, instead of
/// one configured from the environment (tests put an in-memory store here).
pub fn register_store(cloud: Cloud, bucket: &str, store: Arc<dyn ObjectStore>) {
    registry().lock().unwrap_or_else(|p| p.into_inner()).insert((cloud, bucket.to_string()), store);
}

/// The store for `bucket` (built from the environment on first use).
pub(crate) fn store_for(cloud: Cloud, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    let mut stores = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(store) = stores.get(&(cloud, bucket.to_string())) {
        return Ok(store.clone());
    }
    let store = build_store(cloud, bucket)?;
    stores.insert((cloud, bucket.to_string()), store.clone());
    Ok(store)
}

/// No retries inside object_store: [`crate::retry`] retries, backs off
/// and counts, so the metrics see every transient failure.
pub(crate) fn no_retries() -> RetryConfig {
    RetryConfig { max_retries: 0, ..RetryConfig::default() }
}

fn build_store(cloud: Cloud, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    install_crypto_provider();
    let url = format!("{}://{bucket}", cloud.scheme());
    let config = |e: object_store::Error| StorageError::Config { url: url.clone(), detail: e.to_string() };
    match cloud {
        Cloud::S3 => {
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(no_retries());
            if std::env::var_os("AWS_REGION").is_none() {
                let region = std::env::var("AWS_DEFAULT_REGION").unwrap_or_else(|_| "us-east-1".to_string());
                builder = builder.with_region(region);
            }
            Ok(Arc::new(builder.build().map_err(config)?))
        }
        Cloud::Gcs => {
            let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket).with_retry(no_retries());
            if let Ok(path) = std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
                builder = builder.with_application_credentials(path);
            }
            if let Some(base) = emulator_base_url() {
                builder = builder.with_base_url(&base).with_credentials(emulator_credentials()).with_client_options(
                    object_store::ClientOptions::new().with_allow_http(base.starts_with("http://")),
                );
            }
            Ok(Arc::new(builder.build().map_err(config)?))
        }
    }
}

/// A fixed bearer token: GCS emulators accept any, and without one the
/// client would ask the metadata server for a real token.
pub(crate) fn emulator_credentials() -> object_store::gcp::GcpCredentialProvider {
    Arc::new(object_store::StaticCredentialProvider::new(object_store::gcp::GcpCredential {
        bearer: "emulator".to_string(),
    }))
}

/// `STORAGE_EMULATOR_HOST` as a base URL (`host:port` gets `http://`), as
/// Google's client libraries read it; object_store does not.
fn emulator_base_url() -> Option<String> {
    let host = std::env::var("STORAGE_EMULATOR_HOST").ok().filter(|h| !h.trim().is_empty())?;
    let host = host.trim().trim_end_matches('/');
    Some(if host.contains("://") { host.to_string() } else { format!("http://{host}") })
}
