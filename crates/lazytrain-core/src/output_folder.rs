//! The check every command that writes into a folder makes first: the
//! folder may exist or not, but a file in its place is refused before any
//! work is done (training, preparing or exporting would fail only at its
//! first write, or worse, after hours).

use std::fmt;
use std::path::{Path, PathBuf};

/// An output path that names a file where a folder is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInPlaceOfFolder {
    /// The setting that named the path (`--output`, `output_dir`).
    pub setting: &'static str,
    /// The path.
    pub path: PathBuf,
    /// What the folder is for, as the message ends: "name a folder for …".
    pub holds: &'static str,
}

impl fmt::Display for FileInPlaceOfFolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} is a file; name a folder for {}", self.setting, self.path.display(), self.holds)
    }
}

impl std::error::Error for FileInPlaceOfFolder {}

/// Refuse `path` (named by `setting`) when it exists and is not a folder;
/// `holds` says what the folder is for.
pub fn check_output_folder(setting: &'static str, path: &Path, holds: &'static str) -> Result<(), FileInPlaceOfFolder> {
    match path.exists() && !path.is_dir() {
        true => Err(FileInPlaceOfFolder { setting, path: path.to_path_buf(), holds }),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScratchDir;

    #[test]
    fn a_file_is_refused_and_a_folder_or_a_new_path_passes() {
        let dir = ScratchDir::new("output-folder").unwrap();
        let file = dir.join("afile");
        std::fs::write(&file, b"x").unwrap();
        let err = check_output_folder("--output", &file, "the shards").unwrap_err();
        assert_eq!(err.to_string(), format!("--output {} is a file; name a folder for the shards", file.display()));
        assert_eq!(check_output_folder("--output", &dir, "the shards"), Ok(()));
        assert_eq!(check_output_folder("--output", &dir.join("new"), "the shards"), Ok(()));
    }
}
