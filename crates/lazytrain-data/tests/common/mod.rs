//! Helpers the data integration tests share.

use std::path::Path;

/// Every file directly in `dir` with its bytes, sorted by name: two
/// listings are equal when the folder holds the same files, byte for byte.
pub fn folder_contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}
