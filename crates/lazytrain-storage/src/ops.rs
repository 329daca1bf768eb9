//! Synchronous operations on local paths and bucket objects alike.

use crate::metrics;
use crate::retry::{with_retries, RetryPolicy};
use crate::stores::{block_on, store_for};
use crate::url::StorageUrl;
use crate::{Result, StorageError};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// Objects above this size are uploaded in parts.
pub const MULTIPART_THRESHOLD: u64 = 16 << 20;
/// Size of each uploaded part.
pub const PART_SIZE: usize = 8 << 20;

/// An object (or local file) found by [`list`] or [`head`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Where it is.
    pub url: StorageUrl,
    /// Its size in bytes.
    pub size: u64,
    /// The store's version tag (ETag or generation), when it has one.
    pub version: Option<String>,
}

/// The store and object path behind a remote URL.
pub(crate) fn locate(url: &StorageUrl) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    match url {
        StorageUrl::Remote { cloud, bucket, key } => {
            let path = ObjectPath::parse(key)
                .map_err(|e| StorageError::InvalidUrl { url: url.to_string(), detail: e.to_string() })?;
            Ok((store_for(*cloud, bucket)?, path))
        }
        StorageUrl::Local(_) => unreachable!("locate is only called for remote URLs"),
    }
}

fn local_error(path: &Path, e: std::io::Error) -> StorageError {
    if e.kind() == std::io::ErrorKind::NotFound {
        StorageError::NotFound { url: path.display().to_string(), hint: String::new() }
    } else {
        StorageError::Other { url: path.display().to_string(), detail: e.to_string() }
    }
}

/// Size and version of one object or file.
pub fn head(url: &StorageUrl) -> Result<ObjectInfo> {
    match url {
        StorageUrl::Local(path) => {
            let meta = std::fs::metadata(path).map_err(|e| local_error(path, e))?;
            Ok(ObjectInfo { url: url.clone(), size: meta.len(), version: None })
        }
        StorageUrl::Remote { .. } => {
            let (store, path) = locate(url)?;
            let name = url.to_string();
            let meta =
                block_on(async move { with_retries(&name, "", RetryPolicy::from_env(), || store.head(&path)).await })?;
            Ok(ObjectInfo { url: url.clone(), size: meta.size, version: meta.e_tag.or(meta.version) })
        }
    }
}

/// True when the object or file exists.
pub fn exists(url: &StorageUrl) -> Result<bool> {
    match head(url) {
        Ok(_) => Ok(true),
        Err(StorageError::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The whole object or file.
pub fn read(url: &StorageUrl) -> Result<Vec<u8>> {
    match url {
        StorageUrl::Local(path) => std::fs::read(path).map_err(|e| local_error(path, e)),
        StorageUrl::Remote { .. } => {
            let (store, path) = locate(url)?;
            let name = url.to_string();
            let bytes = block_on(async move {
                with_retries(&name, "", RetryPolicy::from_env(), || async { store.get(&path).await?.bytes().await })
                    .await
            })?;
            metrics::count_read(bytes.len() as u64);
            Ok(bytes.to_vec())
        }
    }
}

/// `range` of a remote object (one ranged GET, retried).
pub(crate) async fn read_range_async(url: &StorageUrl, range: Range<u64>) -> Result<Bytes> {
    let (store, path) = locate(url)?;
    let at = format!(" at byte {}", range.start);
    let bytes =
        with_retries(&url.to_string(), &at, RetryPolicy::from_env(), || store.get_range(&path, range.clone())).await?;
    metrics::count_read(bytes.len() as u64);
    Ok(bytes)
}

/// Every object (file) under the folder or prefix `url`, sorted by URL.
pub fn list(url: &StorageUrl) -> Result<Vec<ObjectInfo>> {
    match url {
        StorageUrl::Local(dir) => {
            let mut found = Vec::new();
            list_local(dir, &mut found)?;
            found.sort_by_key(|info| info.url.to_string());
            Ok(found)
        }
        StorageUrl::Remote { key, .. } => {
            let (store, _) = locate(url)?;
            let prefix = (!key.is_empty()).then(|| ObjectPath::from(key.as_str()));
            let name = url.to_string();
            let base = url.clone();
            let root = key.clone();
            let metas = block_on(async move {
                with_retries(&name, "", RetryPolicy::from_env(), || store.list(prefix.as_ref()).try_collect::<Vec<_>>())
                    .await
            })?;
            let mut found: Vec<ObjectInfo> = metas
                .into_iter()
                .map(|meta| {
                    let key = meta.location.to_string();
                    let relative = key.strip_prefix(root.as_str()).unwrap_or(&key).trim_start_matches('/');
                    ObjectInfo { url: base.join(relative), size: meta.size, version: meta.e_tag.or(meta.version) }
                })
                .collect();
            found.sort_by_key(|info| info.url.to_string());
            Ok(found)
        }
    }
}

fn list_local(dir: &Path, found: &mut Vec<ObjectInfo>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| local_error(dir, e))? {
        let path = entry.map_err(|e| local_error(dir, e))?.path();
        if path.is_dir() {
            list_local(&path, found)?;
        } else {
            let size = std::fs::metadata(&path).map_err(|e| local_error(&path, e))?.len();
            found.push(ObjectInfo { url: StorageUrl::Local(path), size, version: None });
        }
    }
    Ok(())
}

/// The objects matching `pattern`, sorted, as `tf.io.gfile.glob` matches
/// them: `*` (any run of characters but `/`) and `?` (one character) in
/// any component after the bucket. A pattern without wildcards matches
/// itself when it exists.
pub fn glob(pattern: &StorageUrl) -> Result<Vec<StorageUrl>> {
    let text = pattern.to_string();
    let Some(first_wildcard) = text.find(['*', '?']) else {
        return Ok(if exists(pattern)? { vec![pattern.clone()] } else { Vec::new() });
    };
    let root_end = text[..first_wildcard].rfind('/').map(|i| i + 1).unwrap_or(0);
    let root = match &text[..root_end] {
        "" => StorageUrl::Local(".".into()),
        root => StorageUrl::parse(root)?,
    };
    let relative_pattern = &text[root_end..];
    if !root.is_remote() && !root.local_path().is_some_and(Path::is_dir) {
        return Ok(Vec::new());
    }
    let mut matches: Vec<StorageUrl> = list(&root)?
        .into_iter()
        .filter(|info| {
            let full = info.url.to_string();
            let relative = full.strip_prefix(&text[..root_end]).unwrap_or(&full);
            let relative = relative.strip_prefix("./").unwrap_or(relative);
            wildcard_match(relative_pattern.as_bytes(), relative.as_bytes())
        })
        .map(|info| info.url)
        .collect();
    matches.sort_by_key(|url| url.to_string());
    Ok(matches)
}

/// `*` and `?` matching where neither crosses `/`.
fn wildcard_match(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            wildcard_match(&pattern[1..], name)
                || (name.first().is_some_and(|&c| c != b'/') && wildcard_match(pattern, &name[1..]))
        }
        (Some(b'?'), Some(&c)) => c != b'/' && wildcard_match(&pattern[1..], &name[1..]),
        (Some(p), Some(c)) => p == c && wildcard_match(&pattern[1..], &name[1..]),
        (Some(_), None) | (None, Some(_)) => false,
    }
}

/// Write `bytes` to `url`: atomically (a temporary file renamed) on local
/// disk, one PUT (or a multipart upload when large) in a bucket.
pub fn write(url: &StorageUrl, bytes: Vec<u8>) -> Result<()> {
    match url {
        StorageUrl::Local(path) => write_local_atomically(path, &bytes),
        StorageUrl::Remote { .. } => {
            let (store, path) = locate(url)?;
            let name = url.to_string();
            let payload = Bytes::from(bytes);
            let len = payload.len() as u64;
            block_on(async move { put_with_retries(&name, store, path, payload).await })?;
            metrics::count_written(len);
            Ok(())
        }
    }
}

/// [`lazytrain_core::atomic_file::write_atomically`], creating the folder first.
fn write_local_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| StorageError::Other { url: path.display().to_string(), detail: e.to_string() };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    lazytrain_core::atomic_file::write_atomically(path, bytes).map_err(io)
}

async fn put_with_retries(name: &str, store: Arc<dyn ObjectStore>, path: ObjectPath, payload: Bytes) -> Result<()> {
    if (payload.len() as u64) < MULTIPART_THRESHOLD {
        return with_retries(name, "", RetryPolicy::from_env(), || {
            store.put(&path, PutPayload::from_bytes(payload.clone()))
        })
        .await
        .map(drop);
    }
    // A failed part cannot be re-sent through object_store's upload API:
    // retry the whole upload (aborting the broken one).
    with_retries(name, "", RetryPolicy::from_env(), || async {
        let upload = store.put_multipart(&path).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        writer.put(payload.clone());
        writer.finish().await.map(drop)
    })
    .await
}

/// Upload the local file `from` to `to` (multipart above
/// [`MULTIPART_THRESHOLD`]), or copy it when `to` is local.
pub fn upload_file(from: &Path, to: &StorageUrl) -> Result<()> {
    let bytes = std::fs::read(from).map_err(|e| local_error(from, e))?;
    write(to, bytes)
}

/// Download `from` into the local file `to` (written atomically).
pub fn download_file(from: &StorageUrl, to: &Path) -> Result<()> {
    let bytes = read(from)?;
    write_local_atomically(to, &bytes)
}

/// Delete one object or file (a missing one is not an error).
pub fn delete(url: &StorageUrl) -> Result<()> {
    match url {
        StorageUrl::Local(path) => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(local_error(path, e)),
            _ => Ok(()),
        },
        StorageUrl::Remote { .. } => {
            let (store, path) = locate(url)?;
            let name = url.to_string();
            match block_on(
                async move { with_retries(&name, "", RetryPolicy::from_env(), || store.delete(&path)).await },
            ) {
                Err(StorageError::NotFound { .. }) => Ok(()),
                other => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_stay_inside_a_component() {
        assert!(wildcard_match(b"texts/*.txt", b"texts/a.txt"));
        assert!(!wildcard_match(b"texts/*.txt", b"texts/sub/a.txt"));
        assert!(wildcard_match(b"*/a?.txt", b"x/ab.txt"));
        assert!(!wildcard_match(b"a?.txt", b"a.txt"));
        assert!(wildcard_match(b"train-*", b"train-00000-of-00002.tfrecord"));
    }

    #[test]
    fn local_glob_lists_and_matches() {
        let dir = std::env::temp_dir().join(format!("lazytrain-glob-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for name in ["a.txt", "b.txt", "c.csv", "sub/d.txt"] {
            write(&StorageUrl::Local(dir.join(name)), b"x".to_vec()).unwrap();
        }
        let pattern = StorageUrl::parse(&format!("{}/*.txt", dir.display())).unwrap();
        let names: Vec<String> = glob(&pattern).unwrap().iter().filter_map(StorageUrl::file_name).collect();
        assert_eq!(names, ["a.txt", "b.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
