//! Where `prepare` and `prepare-classification` write until they are done:
//! a hidden folder inside the output folder. Its shards and files are moved
//! into place only when the preparation is complete, the manifest last, so
//! an error or a kill on the way leaves the folder's earlier preparation as
//! it was.

use crate::formats::io_error;
use crate::prepare::{remove_shards, ShardInfo};
use crate::Result;
use std::path::{Path, PathBuf};

/// The folder's name inside the output folder.
const PARTIAL_FOLDER: &str = ".prepare-partial";

/// A preparation's folder inside its output folder, removed with whatever
/// is left in it when dropped (after an error, or after its files were
/// moved out); the output folder too, and the folders above it, as far as
/// the preparation created them and they are still empty.
pub(crate) struct PartialFolder {
    path: PathBuf,
    out_dir: PathBuf,
    /// The topmost folder of `out_dir`'s path that did not exist before.
    created_from: Option<PathBuf>,
}

impl PartialFolder {
    /// Create the folder in `out_dir` (created when missing), empty: a
    /// killed run's leftovers are removed first.
    pub(crate) fn create(out_dir: &Path) -> Result<PartialFolder> {
        let created_from = out_dir.ancestors().take_while(|folder| !folder.exists()).last().map(Path::to_path_buf);
        std::fs::create_dir_all(out_dir).map_err(|e| io_error(out_dir, e.to_string()))?;
        let path = out_dir.join(PARTIAL_FOLDER);
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(&path, e.to_string())),
            _ => {}
        }
        let partial = PartialFolder { path, out_dir: out_dir.to_path_buf(), created_from };
        std::fs::create_dir_all(&partial.path).map_err(|e| io_error(&partial.path, e.to_string()))?;
        Ok(partial)
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Replace an earlier preparation in the output folder: its manifest
    /// and shards are removed, then the finished `shards` (with their index
    /// sidecars) and `files` written here are moved into place, in that
    /// order (the manifest, listed last, last).
    pub(crate) fn publish<'s>(self, shards: impl Iterator<Item = &'s ShardInfo>, files: &[&str]) -> Result<()> {
        let manifest = self.out_dir.join("manifest.json");
        match std::fs::remove_file(&manifest) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(&manifest, e.to_string())),
            _ => {}
        }
        remove_shards(&self.out_dir)?;
        let shard_files = shards.flat_map(|shard| [shard.file.clone(), format!("{}.idx", shard.file)]);
        for name in shard_files.chain(files.iter().map(|f| f.to_string())) {
            let (from, to) = (self.path.join(&name), self.out_dir.join(&name));
            std::fs::rename(&from, &to).map_err(|e| io_error(&to, e.to_string()))?;
        }
        Ok(())
    }
}

impl Drop for PartialFolder {
    fn drop(&mut self) {
        // Nothing to report here: a folder left behind is removed by the
        // next preparation into the same output, and `remove_dir` leaves an
        // output folder that holds anything.
        let _ = std::fs::remove_dir_all(&self.path);
        let Some(created_from) = &self.created_from else { return };
        for folder in self.out_dir.ancestors() {
            if std::fs::remove_dir(folder).is_err() || folder == created_from {
                break;
            }
        }
    }
}
