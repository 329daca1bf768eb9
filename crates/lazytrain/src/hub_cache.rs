//! Models by their Hub names, offline: `org/name` resolved in the local
//! Hugging Face cache that `transformers` users already have, laid out as
//! `huggingface_hub` lays it out (`models--org--name/refs/main` holding a
//! commit, `snapshots/<commit>/` holding the files). Nothing is downloaded.

use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (none without a home folder).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| var("HOME").map(|home| home.join(".cache/huggingface/hub")))
}

/// Whether `spec` reads as a Hub repository id (`name` or `org/name` of
/// letters, digits, `-`, `_` and `.`, not starting with `.`).
pub fn is_hub_id(spec: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty() && !p.starts_with('.') && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    match spec.split_once('/') {
        Some((org, name)) => part(org) && part(name),
        None => part(spec),
    }
}

/// The snapshot folder of `repo_id` at `revision` (a branch or tag under
/// `refs/`, or a commit hash; `main` when `None`) in the cache.
pub fn resolve(repo_id: &str, revision: Option<&str>) -> Result<PathBuf> {
    let revision = revision.unwrap_or("main");
    let Some(cache) = cache_dir() else {
        return Err(Error::Input(format!(
            "model {repo_id}: no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME, or HOME for ~/.cache/huggingface/hub)"
        )));
    };
    let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
    let reference = repo.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&reference) {
        Ok(text) => text.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    let snapshot = repo.join("snapshots").join(&commit);
    if snapshot.join("config.json").is_file() || snapshot.join("tokenizer.json").is_file() {
        return Ok(snapshot);
    }
    Err(Error::Input(format!(
        "model {repo_id} (revision {revision}) is not in the Hugging Face cache: tried {} and {}. lazytrain never \
         downloads; fill the cache where there is network access (`huggingface-cli download {repo_id}`, or \
         `from_pretrained(\"{repo_id}\")` once) and point HF_HUB_CACHE or HF_HOME at it",
        reference.display(),
        snapshot.display()
    )))
}

/// The folder `spec` names: a folder as it is, else a Hub id resolved in
/// the cache at `revision`.
pub fn model_folder(spec: &str, revision: Option<&str>) -> Result<PathBuf> {
    let url = lazytrain_storage::StorageUrl::parse(spec)?;
    if url.is_remote() {
        return Ok(lazytrain_storage::fetch_folder(&url)?);
    }
    let path = Path::new(spec);
    if path.is_file() {
        return Err(crate::Error::Input(format!(
            "--model {spec} is a file; give a model folder (config.json, model.safetensors and the tokenizer files)"
        )));
    }
    if path.is_dir() || !is_hub_id(spec) {
        return Ok(path.to_path_buf());
    }
    resolve(spec, revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_told_from_paths() {
        for id in ["bert-base-uncased", "org/name", "FacebookAI/roberta-base", "a.b_c-d/e.f"] {
            assert!(is_hub_id(id), "{id}");
        }
        for path in ["./model", "/abs/model", "a/b/c", "", "../x", "org/", "with space"] {
            assert!(!is_hub_id(path), "{path}");
        }
    }
}
