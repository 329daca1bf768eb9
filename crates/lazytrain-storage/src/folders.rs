//! Whole folders to and from buckets: publishing a prepared dataset or a
//! tokenizer, and fetching a model folder into a local cache once.

use crate::ops::{download_file, list, upload_file, ObjectInfo};
use crate::url::StorageUrl;
use crate::{Result, StorageError};
use std::path::{Path, PathBuf};

/// Upload every file of the local folder `from` (recursively) under `to`,
/// the files named in `last` after all others: a reader that waits for
/// them (`manifest.json`, `trainer_state.json`) never sees a half-uploaded
/// folder.
pub fn upload_folder(from: &Path, to: &StorageUrl, last: &[&str]) -> Result<()> {
    let mut files: Vec<(String, PathBuf)> = list(&StorageUrl::Local(from.to_path_buf()))?
        .into_iter()
        .filter_map(|info| {
            let path = info.url.local_path()?.to_path_buf();
            let relative = path.strip_prefix(from).ok()?.to_string_lossy().into_owned();
            Some((relative, path))
        })
        .collect();
    files.sort_by_key(|(relative, _)| (last.contains(&relative.as_str()), relative.clone()));
    for (relative, path) in files {
        upload_file(&path, &to.join(&relative))?;
    }
    Ok(())
}

/// Where fetched folders are cached: `LAZYTRAIN_CACHE`, else
/// `$XDG_CACHE_HOME/lazytrain`, else `~/.cache/lazytrain`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("LAZYTRAIN_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("lazytrain")
}

/// The files directly under `url` (not in sub-folders such as
/// `checkpoint-N/`), as a local folder: a local URL is returned as it is;
/// a bucket folder is downloaded into [`cache_root`]`/remote/…` once and
/// reused while every object's version (ETag) is unchanged.
pub fn fetch_folder(url: &StorageUrl) -> Result<PathBuf> {
    if let StorageUrl::Local(path) = url {
        return Ok(path.clone());
    }
    let prefix = url.to_string();
    let objects: Vec<ObjectInfo> = list(url)?
        .into_iter()
        .filter(|o| {
            o.url.to_string().strip_prefix(&prefix).is_some_and(|rest| !rest.trim_start_matches('/').contains('/'))
        })
        .collect();
    if objects.is_empty() {
        // One object (a `tokenizer.json`, say) rather than a folder.
        return match crate::ops::head(url) {
            Ok(object) => fetch_object(&object),
            Err(StorageError::NotFound { .. }) => Err(StorageError::NotFound {
                url: prefix,
                hint: "; expected a folder (a model or tokenizer folder) or a file".into(),
            }),
            Err(e) => Err(e),
        };
    }
    let fingerprint: String =
        objects.iter().map(|o| format!("{} {} {}\n", o.url, o.size, o.version.as_deref().unwrap_or("-"))).collect();
    let dir = cache_root().join("remote").join(format!("{:016x}", fnv1a(prefix.as_bytes())));
    let stamp = dir.join(".lazytrain-source");
    if std::fs::read_to_string(&stamp).is_ok_and(|seen| seen == fingerprint) {
        return Ok(dir);
    }
    let io =
        |path: &Path, e: std::io::Error| StorageError::Other { url: path.display().to_string(), detail: e.to_string() };
    let staging = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| io(&staging, e))?;
    for object in &objects {
        let name = object.url.file_name().unwrap_or_default();
        download_file(&object.url, &staging.join(name))?;
    }
    std::fs::write(staging.join(".lazytrain-source"), &fingerprint).map_err(|e| io(&staging, e))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staging, &dir).map_err(|e| io(&dir, e))?;
    Ok(dir)
}

/// One object, cached like a folder (by URL, size and version).
fn fetch_object(object: &ObjectInfo) -> Result<PathBuf> {
    let url = object.url.to_string();
    let name = object.url.file_name().unwrap_or_else(|| "object".into());
    let version = format!("{} {}", object.size, object.version.as_deref().unwrap_or("-"));
    let dir = cache_root().join("remote").join(format!("{:016x}", fnv1a(format!("{url}\n{version}").as_bytes())));
    let file = dir.join(&name);
    if !file.is_file() {
        download_file(&object.url, &file)?;
    }
    Ok(file)
}

/// 64-bit FNV-1a: a stable folder name for a URL.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
