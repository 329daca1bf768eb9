//! Reading training text: plain or gzip files, one document per line.

use crate::{DataError, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The documents of a text file: every non-blank line is one document
/// (blank lines only separate them). Files ending in `.gz` are decompressed.
pub fn read_documents(path: &Path) -> Result<Vec<String>> {
    let io = |detail: String| DataError::Io { path: path.display().to_string(), detail };
    let file = std::fs::File::open(path).map_err(|e| io(format!("cannot open the input file: {e}")))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut docs = Vec::new();
    for (n, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(|e| io(format!("line {}: {e} (is it UTF-8 text?)", n + 1)))?;
        let trimmed = line.trim();
        if !trimmed.is_empty() {
            docs.push(trimmed.to_string());
        }
    }
    if docs.is_empty() {
        return Err(io("the input file has no text (every line is blank)".into()));
    }
    Ok(docs)
}

/// The documents of several files, in order.
pub fn read_all_documents(paths: &[impl AsRef<Path>]) -> Result<Vec<String>> {
    if paths.is_empty() {
        return Err(DataError::Invalid("no input files were given; pass --files F...".into()));
    }
    let mut docs = Vec::new();
    for p in paths {
        docs.extend(read_documents(p.as_ref())?);
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn plain_and_gzip_files_and_errors() {
        let dir = std::env::temp_dir().join(format!("lazytrain-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("a.txt");
        std::fs::write(&plain, "first doc\n\n  second doc  \n").unwrap();
        assert_eq!(read_documents(&plain).unwrap(), vec!["first doc", "second doc"]);
        let gz = dir.join("b.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(b"zipped one\nzipped two\n").unwrap();
        enc.finish().unwrap();
        assert_eq!(read_all_documents(&[&plain, &gz]).unwrap().len(), 4);
        let empty = dir.join("empty.txt");
        std::fs::write(&empty, "\n \n").unwrap();
        assert!(read_documents(&empty).unwrap_err().to_string().contains("no text"));
        assert!(read_documents(&dir.join("nope.txt")).unwrap_err().to_string().contains("cannot open"));
        let none: [&Path; 0] = [];
        assert!(read_all_documents(&none).unwrap_err().to_string().contains("--files"));
    }
}
