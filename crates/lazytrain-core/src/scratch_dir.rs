//! Scratch folders: a fresh folder under the system's temporary directory
//! that is removed, with everything in it, when its guard goes out of scope.
//! Bucket downloads are staged in one; every test that writes files uses
//! one, so a test run leaves nothing behind in `/tmp`.

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty folder `lazytrain-{purpose}-{pid}-{n}` under
/// [`std::env::temp_dir`], removed with its contents when dropped. While
/// the dropping thread panics the folder is kept, so a failing test (or a
/// run that hit a bug) leaves its files to look at.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Create the folder. The process id and a per-process count make the
    /// name unique; a folder of that name left by an earlier process with
    /// the same id is cleared first.
    pub fn new(purpose: &str) -> std::io::Result<ScratchDir> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lazytrain-{purpose}-{}-{n}", std::process::id()));
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        Ok(ScratchDir(dir))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for ScratchDir {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_folder_is_fresh_distinct_and_removed_with_its_files() {
        let first = ScratchDir::new("scratch-test").unwrap();
        let second = ScratchDir::new("scratch-test").unwrap();
        assert_ne!(first.path(), second.path());
        assert!(first.is_dir() && std::fs::read_dir(&*first).unwrap().next().is_none());
        std::fs::create_dir_all(first.join("inner")).unwrap();
        std::fs::write(first.join("inner/file.bin"), b"bytes").unwrap();
        let path = first.to_path_buf();
        drop(first);
        assert!(!path.exists(), "{} outlived its guard", path.display());
        assert!(second.is_dir());
    }

    #[test]
    fn a_panicking_thread_keeps_its_scratch_folder() {
        let path = std::thread::spawn(|| {
            let dir = ScratchDir::new("scratch-panic").unwrap();
            let path = dir.to_path_buf();
            let kept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _dir = dir;
                panic!("a failing test");
            }));
            assert!(kept.is_err());
            path
        })
        .join()
        .unwrap();
        assert!(path.is_dir(), "kept for inspection");
        std::fs::remove_dir_all(&path).unwrap();
    }
}
