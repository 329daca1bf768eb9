//! Bucket URLs on the command line: `--files` and `--tokenizer` read from
//! `gs://`/`s3://` (fetched to local files first), and `--output` folders
//! written locally then published to the bucket, the manifest last.

use lazytrain::{Error, Result};
use lazytrain_core::ScratchDir;
use lazytrain_storage::{fetch_folder, glob, upload_folder, StorageUrl};
use std::path::PathBuf;

/// A fresh local folder for `purpose` under the system's temporary
/// directory (downloaded inputs, outputs before their upload), removed with
/// its files when dropped.
pub fn staging(purpose: &str) -> Result<ScratchDir> {
    ScratchDir::new(purpose).map_err(|e| Error::Input(format!("a temporary folder for the {purpose}: {e}")))
}

/// The inputs `--files` names, in order: plain paths and bucket objects as
/// given, local patterns (`texts/*.txt`, quoted so that no shell expands
/// them) and bucket patterns (`gs://b/texts/*.txt`, matched as
/// `tf.io.gfile.glob` does) as they match.
pub fn matched_inputs(specs: &[StorageUrl]) -> Result<Vec<StorageUrl>> {
    let mut inputs = Vec::new();
    for spec in specs {
        let pattern = spec.to_string().contains(['*', '?']);
        let matched = if pattern { glob(spec)? } else { vec![spec.clone()] };
        if matched.is_empty() {
            return Err(Error::Input(format!("--files {spec} matches no files")));
        }
        inputs.extend(matched);
    }
    Ok(inputs)
}

/// `input` as a local file: itself, or a bucket object downloaded into
/// `staging` as the `n`th input, keeping its name (the format comes from
/// the extension).
pub fn local_input(input: &StorageUrl, n: usize, staging: &ScratchDir) -> Result<PathBuf> {
    if let Some(path) = input.local_path() {
        return Ok(path.to_path_buf());
    }
    let local = staging.path().join(format!("{n}-{}", input.file_name().unwrap_or_default()));
    lazytrain_storage::download_file(input, &local)?;
    Ok(local)
}

/// Local files for `--files` ([`matched_inputs`]), every bucket object
/// downloaded into `staging` ([`local_input`]).
pub fn input_files(specs: &[StorageUrl], staging: &ScratchDir) -> Result<Vec<PathBuf>> {
    matched_inputs(specs)?.iter().enumerate().map(|(n, input)| local_input(input, n, staging)).collect()
}

/// A tokenizer folder (or file) given as a path or a bucket URL.
pub fn tokenizer_path(spec: &StorageUrl) -> Result<PathBuf> {
    Ok(fetch_folder(spec)?)
}

/// Where a command writes its output folder: the folder itself, or for a
/// bucket URL a staging folder published by [`OutputFolder::publish`].
pub struct OutputFolder {
    target: StorageUrl,
    staging: Option<ScratchDir>,
}

impl OutputFolder {
    /// Prepare to write `target`.
    pub fn new(target: &StorageUrl) -> Result<OutputFolder> {
        let staging = target.is_remote().then(|| staging("output")).transpose()?;
        Ok(OutputFolder { target: target.clone(), staging })
    }

    /// The local folder to write into.
    pub fn path(&self) -> PathBuf {
        match (&self.staging, &self.target) {
            (Some(staging), _) => staging.path().to_path_buf(),
            (None, target) => target.local_path().expect("a local target").to_path_buf(),
        }
    }

    /// Upload a staged folder to its bucket (`last` after every other file,
    /// so readers never see it half-written); nothing for a local target.
    pub fn publish(self, last: &[&str]) -> Result<()> {
        if let Some(staging) = &self.staging {
            upload_folder(staging.path(), &self.target, last)?;
        }
        Ok(())
    }
}
