//! Reading training text from files in any of the [`crate::formats`]:
//! plain text (one document per line), JSON Lines, CSV/TSV, Parquet and
//! `datasets` Arrow streams; `.gz` or `.zst` for the line formats.

use crate::formats::{read_into, DocumentSink, Documents, TextSource};
use crate::{DataError, Result};
use std::path::Path;

/// The documents of one file: every non-blank text (trimmed) of its text
/// column, or of its lines for plain text.
pub fn read_documents(path: &Path, source: &TextSource) -> Result<Documents> {
    let mut docs = Documents::default();
    read_into(path, source, &mut docs)?;
    Ok(docs)
}

/// The documents of several files, in order.
pub fn read_all_documents(paths: &[impl AsRef<Path>], source: &TextSource) -> Result<Documents> {
    let mut docs = Documents::default();
    read_all_into(paths, source, &mut docs)?;
    Ok(docs)
}

/// Give the documents of several files, in order, to `docs` as they are
/// read.
pub fn read_all_into(paths: &[impl AsRef<Path>], source: &TextSource, docs: &mut dyn DocumentSink) -> Result<()> {
    if paths.is_empty() {
        return Err(DataError::Invalid("no input files were given; pass --files F...".into()));
    }
    paths.iter().try_for_each(|p| read_into(p.as_ref(), source, docs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::InputFormat;
    use std::io::Write;

    fn dir() -> lazytrain_core::ScratchDir {
        lazytrain_core::ScratchDir::new("text").unwrap()
    }

    #[test]
    fn plain_and_gzip_files_and_errors() {
        let dir = dir();
        let source = TextSource::default();
        let plain = dir.join("a.txt");
        std::fs::write(&plain, "first doc\n\n  second doc  \n").unwrap();
        assert_eq!(read_documents(&plain, &source).unwrap().texts, vec!["first doc", "second doc"]);
        let gz = dir.join("b.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(b"zipped one\nzipped two\n").unwrap();
        enc.finish().unwrap();
        assert_eq!(read_all_documents(&[&plain, &gz], &source).unwrap().texts.len(), 4);
        let empty = dir.join("empty.txt");
        std::fs::write(&empty, "\n \n").unwrap();
        assert!(read_documents(&empty, &source).unwrap_err().to_string().contains("no text"));
        assert!(read_documents(&dir.join("nope.txt"), &source).unwrap_err().to_string().contains("cannot open"));
        let none: [&Path; 0] = [];
        assert!(read_all_documents(&none, &source).unwrap_err().to_string().contains("--files"));
    }

    #[test]
    fn json_lines_and_csv_columns() {
        let dir = dir();
        let jsonl = dir.join("rows.jsonl");
        std::fs::write(&jsonl, "{\"text\": \"one\", \"id\": 1}\n\n{\"text\": null}\n{\"text\": \" two \"}\n").unwrap();
        let docs = read_documents(&jsonl, &TextSource::default()).unwrap();
        assert_eq!((docs.texts, docs.null_rows), (vec!["one".to_string(), "two".into()], 1));
        let other = TextSource { text_column: "body".into(), ..TextSource::default() };
        let err = read_documents(&jsonl, &other).unwrap_err().to_string();
        assert!(err.contains("line 1: no field `body`; the row has id, text"), "{err}");
        let numbers = dir.join("numbers.jsonl");
        std::fs::write(&numbers, "{\"text\": 5}\n").unwrap();
        let err = read_documents(&numbers, &TextSource::default()).unwrap_err().to_string();
        assert!(err.contains("field `text` is a number, not a string"), "{err}");
        let csv = dir.join("rows.csv");
        std::fs::write(&csv, "id,text\n1,\"hello, world\"\n2,bye\n").unwrap();
        assert_eq!(read_documents(&csv, &TextSource::default()).unwrap().texts, vec!["hello, world", "bye"]);
        let err = read_documents(&csv, &other).unwrap_err().to_string();
        assert!(err.contains("no column `body`; the header has id, text"), "{err}");
        // --format overrides the extension.
        let as_text = TextSource { format: Some(InputFormat::Text), ..TextSource::default() };
        assert_eq!(read_documents(&csv, &as_text).unwrap().texts.len(), 3);
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, b"{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n").unwrap();
        let err = read_documents(&bad, &TextSource::default()).unwrap_err().to_string();
        assert!(err.contains("line 2: invalid UTF-8"), "{err}");
    }
}
