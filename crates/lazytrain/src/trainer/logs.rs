//! Where log entries go: `log_history`, a JSONL file, TensorBoard events.

use super::events::EventWriter;
use crate::{Error, Result};
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// The run's log destinations (from `report_to`).
pub struct LogSinks {
    jsonl: Option<std::fs::File>,
    tensorboard: Option<EventWriter>,
}

impl LogSinks {
    /// Open the destinations named in `report_to` under `output_dir`: the
    /// JSONL log is appended to when `continuing` (a resumed run), else
    /// started anew (an earlier run's lines would mix with this run's).
    pub fn open(output_dir: &Path, report_to: &[String], continuing: bool) -> Result<LogSinks> {
        let wants = |name: &str| report_to.iter().any(|r| r == name);
        let jsonl = if wants("jsonl") {
            let dir = output_dir.join("logs");
            std::fs::create_dir_all(&dir).map_err(|e| Error::Input(format!("{}: {e}", dir.display())))?;
            let path = dir.join("log.jsonl");
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(continuing)
                .write(true)
                .truncate(!continuing)
                .open(&path)
                .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
            Some(file)
        } else {
            None
        };
        let tensorboard =
            if wants("tensorboard") { Some(EventWriter::create(&output_dir.join("runs"))?) } else { None };
        Ok(LogSinks { jsonl, tensorboard })
    }

    /// Write one entry (`step` plus numeric fields become TensorBoard scalars).
    pub fn write(&mut self, entry: &Value) -> Result<()> {
        if let Some(f) = &mut self.jsonl {
            writeln!(f, "{entry}").map_err(|e| Error::Input(format!("writing the JSONL log: {e}")))?;
        }
        if let Some(tb) = &mut self.tensorboard {
            let step = entry.get("step").and_then(Value::as_i64).unwrap_or(0);
            if let Some(map) = entry.as_object() {
                for (key, value) in map {
                    if let (Some(v), false) = (value.as_f64(), matches!(key.as_str(), "step" | "epoch")) {
                        let tag = match key.strip_prefix("eval_") {
                            Some(name) => format!("eval/{name}"),
                            None => format!("train/{key}"),
                        };
                        tb.scalar(&tag, v as f32, step)?;
                    }
                }
            }
            tb.flush()?;
        }
        Ok(())
    }
}
