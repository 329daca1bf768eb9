//! `StorageUrl`: where a file or folder lives — a local path, or an object
//! (prefix) in an S3 or GCS bucket.

use crate::{Result, StorageError};
use std::fmt;
use std::path::{Path, PathBuf};

/// The cloud a bucket lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cloud {
    /// Amazon S3 or an S3-compatible store (`s3://`).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
}

impl Cloud {
    /// The URL scheme, without `://`.
    pub fn scheme(self) -> &'static str {
        match self {
            Cloud::S3 => "s3",
            Cloud::Gcs => "gs",
        }
    }
}

/// A local path or a bucket object (or prefix): what every `--files`,
/// `--train-data`, `--output`, `--model` and `--push-to` accepts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StorageUrl {
    /// A path on this machine (a plain path or `file://`).
    Local(PathBuf),
    /// `s3://bucket/key` or `gs://bucket/key` (key without a trailing `/`;
    /// empty for the bucket's root).
    Remote {
        /// Which cloud.
        cloud: Cloud,
        /// Bucket name.
        bucket: String,
        /// Object key or prefix.
        key: String,
    },
}

impl StorageUrl {
    /// Parse `text`: `s3://bucket/key`, `gs://bucket/key`, `file:///path` or
    /// a plain path. Other schemes (`https://`, `az://`, ...) are refused by name.
    pub fn parse(text: &str) -> Result<StorageUrl> {
        let invalid = |detail: &str| StorageError::InvalidUrl { url: text.to_string(), detail: detail.to_string() };
        let Some((scheme, rest)) = text.split_once("://") else {
            if text.is_empty() {
                return Err(invalid("an empty path"));
            }
            return Ok(StorageUrl::Local(PathBuf::from(text)));
        };
        let cloud = match scheme {
            "s3" | "s3a" => Cloud::S3,
            "gs" | "gcs" => Cloud::Gcs,
            "file" => {
                if !rest.starts_with('/') {
                    return Err(invalid("a file:// URL needs an absolute path (file:///data/shards)"));
                }
                return Ok(StorageUrl::Local(PathBuf::from(rest)));
            }
            _ => return Err(invalid("unsupported scheme; use s3://, gs://, file:// or a plain path")),
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket name (expected s3://bucket/prefix or gs://bucket/prefix)"));
        }
        let key = key.trim_matches('/').to_string();
        if key.split('/').any(|part| part == "." || part == "..") {
            return Err(invalid("`.` and `..` are not allowed in an object key"));
        }
        Ok(StorageUrl::Remote { cloud, bucket: bucket.to_string(), key })
    }

    /// True for bucket URLs.
    pub fn is_remote(&self) -> bool {
        matches!(self, StorageUrl::Remote { .. })
    }

    /// The local path, for local URLs.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            StorageUrl::Local(path) => Some(path),
            StorageUrl::Remote { .. } => None,
        }
    }

    /// `self/name` (`name` may hold `/`).
    pub fn join(&self, name: &str) -> StorageUrl {
        match self {
            StorageUrl::Local(path) => StorageUrl::Local(path.join(name)),
            StorageUrl::Remote { cloud, bucket, key } => {
                let name = name.trim_matches('/');
                let key = if key.is_empty() { name.to_string() } else { format!("{key}/{name}") };
                StorageUrl::Remote { cloud: *cloud, bucket: bucket.clone(), key }
            }
        }
    }

    /// The last component (file or folder name), if any.
    pub fn file_name(&self) -> Option<String> {
        match self {
            StorageUrl::Local(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()),
            StorageUrl::Remote { key, .. } => key.rsplit('/').next().filter(|n| !n.is_empty()).map(str::to_string),
        }
    }

    /// The parent folder (`None` at a bucket's root or a path without one).
    pub fn parent(&self) -> Option<StorageUrl> {
        match self {
            StorageUrl::Local(path) => path.parent().map(|p| StorageUrl::Local(p.to_path_buf())),
            StorageUrl::Remote { cloud, bucket, key } => (!key.is_empty()).then(|| StorageUrl::Remote {
                cloud: *cloud,
                bucket: bucket.clone(),
                key: key.rsplit_once('/').map(|(parent, _)| parent.to_string()).unwrap_or_default(),
            }),
        }
    }
}

impl std::str::FromStr for StorageUrl {
    type Err = StorageError;

    fn from_str(text: &str) -> Result<StorageUrl> {
        StorageUrl::parse(text)
    }
}

impl fmt::Display for StorageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageUrl::Local(path) => write!(f, "{}", path.display()),
            StorageUrl::Remote { cloud, bucket, key } if key.is_empty() => write!(f, "{}://{bucket}", cloud.scheme()),
            StorageUrl::Remote { cloud, bucket, key } => write!(f, "{}://{bucket}/{key}", cloud.scheme()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_schemes_and_plain_paths() {
        let url = StorageUrl::parse("s3://b/data/").unwrap();
        assert_eq!(url, StorageUrl::Remote { cloud: Cloud::S3, bucket: "b".into(), key: "data".into() });
        assert_eq!(url.join("train-0.tfrecord").to_string(), "s3://b/data/train-0.tfrecord");
        assert_eq!(StorageUrl::parse("gs://b").unwrap().join("x").to_string(), "gs://b/x");
        assert_eq!(StorageUrl::parse("file:///tmp/x").unwrap(), StorageUrl::Local("/tmp/x".into()));
        assert_eq!(StorageUrl::parse("rel/x").unwrap(), StorageUrl::Local("rel/x".into()));
        assert_eq!(url.parent().unwrap().to_string(), "s3://b");
        assert_eq!(url.file_name().as_deref(), Some("data"));
    }

    #[test]
    fn refuses_what_it_cannot_address() {
        for bad in ["https://x/y", "s3:///key", "file://relative", "", "gs://b/a/../c"] {
            let err = StorageUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
