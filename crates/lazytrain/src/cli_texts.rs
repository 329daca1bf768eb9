//! What the pipeline commands share: the model (a folder or a cached Hub
//! id) and the texts — positional, or streamed from a file or stdin one per
//! line (or as JSON Lines) in batches of a fixed size — and the report.

use clap::Args;
use lazytrain::{hub_cache, Error, Result};
use lazytrain_core::Device;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

/// The model and the texts of a pipeline command.
#[derive(Args)]
pub struct TextInputs {
    /// A model folder, or a Hub id (org/name) in the local Hugging Face cache.
    #[arg(long)]
    pub model: String,
    /// The Hub revision (branch, tag or commit) of a cached --model.
    #[arg(long)]
    revision: Option<String>,
    /// Read the texts from FILE (`-`: standard input), one per line, or JSON Lines with --text-column;
    /// results come out one per input line, in order.
    #[arg(long)]
    input: Option<PathBuf>,
    /// With --input: the file is JSON Lines and this field holds each text.
    #[arg(long)]
    text_column: Option<String>,
    /// Texts per batch with --input (the last batch is padded, and lengths to 16-token buckets, so
    /// each bucket compiles once).
    #[arg(long, default_value_t = 32, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    pub batch_size: usize,
    /// Print JSON shaped like Hugging Face's pipeline output (with --input: one JSON value per line).
    #[arg(long)]
    pub json: bool,
    /// Report texts per second and graphs compiled on stderr.
    #[arg(long)]
    pub verbose: bool,
    /// Texts (put `--` before texts that begin with `-`).
    pub texts: Vec<String>,
}

impl TextInputs {
    /// The model folder `--model` names.
    pub fn model_dir(&self) -> Result<PathBuf> {
        hub_cache::model_folder(&self.model, self.revision.as_deref())
    }

    /// Whether texts come from `--input` (streamed in batches).
    pub fn streaming(&self) -> bool {
        self.input.is_some()
    }

    /// Call `run` on the texts: all positional texts at once, or each
    /// batch of `--batch-size` lines of `--input` as it is read. Returns
    /// the number of texts.
    pub fn for_each_batch(&self, mut run: impl FnMut(&[String]) -> Result<()>) -> Result<usize> {
        let Some(input) = &self.input else {
            if self.texts.is_empty() {
                return Err(Error::Input("give texts as arguments or with --input FILE (`-` for stdin)".into()));
            }
            run(&self.texts)?;
            return Ok(self.texts.len());
        };
        if !self.texts.is_empty() {
            return Err(Error::Input("give texts either as arguments or with --input, not both".into()));
        }
        let name = input.display().to_string();
        let reader: Box<dyn BufRead> = if name == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            if input.is_dir() {
                return Err(Error::Input(format!("--input {name} is a folder; give a text file, one text a line")));
            }
            let file = std::fs::File::open(input).map_err(|e| Error::Input(format!("{name}: {e}")))?;
            Box::new(std::io::BufReader::new(file))
        };
        let mut batch = Vec::with_capacity(self.batch_size);
        let mut count = 0;
        // A pipeline's error counts the batch's texts from 1: say which lines they are.
        let mut run_lines = |batch: &[String], first: usize| {
            run(batch).map_err(|e| match e {
                Error::Input(detail) if batch.len() == 1 => Error::Input(format!("{name}: line {first}: {detail}")),
                Error::Input(detail) => {
                    Error::Input(format!("{name}: the batch of lines {first} to {}: {detail}", first + batch.len() - 1))
                }
                other => other,
            })
        };
        for (index, line) in reader.lines().enumerate() {
            let line =
                line.map_err(|e| Error::Input(format!("{name}: line {}: {e} (is it UTF-8 text?)", index + 1)))?;
            batch.push(self.text_of(line, &name, index + 1)?);
            if batch.len() == self.batch_size {
                run_lines(&batch, count + 1)?;
                count += batch.len();
                batch.clear();
            }
        }
        if !batch.is_empty() {
            run_lines(&batch, count + 1)?;
            count += batch.len();
        }
        if count == 0 {
            return Err(Error::Input(format!("{name} has no lines to read")));
        }
        Ok(count)
    }

    /// The text of one input line: the line, or its `--text-column` field.
    fn text_of(&self, line: String, name: &str, number: usize) -> Result<String> {
        let Some(column) = &self.text_column else { return Ok(line) };
        let bad = |detail: String| Error::Input(format!("{name}: line {number}: {detail}"));
        let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        match value.get(column) {
            Some(serde_json::Value::String(text)) => Ok(text.clone()),
            Some(other) => Err(bad(format!("field `{column}` is not a string: {other}"))),
            None => Err(bad(format!("no field `{column}`; pass --text-column NAME"))),
        }
    }

    /// Print one JSON value per line, flushed (for `--input --json`).
    pub fn print_lines<T: serde::Serialize>(values: impl IntoIterator<Item = T>) -> Result<()> {
        let mut out = std::io::stdout().lock();
        for value in values {
            let line = serde_json::to_string(&value).map_err(|e| Error::Input(e.to_string()))?;
            writeln!(out, "{line}").and_then(|()| out.flush()).map_err(|e| Error::Input(format!("stdout: {e}")))?;
        }
        Ok(())
    }

    /// With `--verbose`, report `texts` handled since `start` and the graphs compiled.
    pub fn report(&self, texts: usize, start: Instant, compiles_before: u64, device: &Device) {
        if self.verbose {
            let seconds = start.elapsed().as_secs_f64();
            eprintln!(
                "{texts} texts in {seconds:.2} s ({:.1} texts/s), {} graphs compiled",
                texts as f64 / seconds.max(1e-9),
                device.metrics().compiles - compiles_before
            );
        }
    }
}
