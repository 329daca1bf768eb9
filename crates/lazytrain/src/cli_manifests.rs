//! The manifests of `lazytrain train`'s data folders, each read once (from
//! a bucket, every read is a GET) and checked against one another and
//! against the model before the first step.

use crate::cli_train::Task;
use lazytrain::{Error, Result};
use lazytrain_data::classification::ClassificationManifest;
use lazytrain_data::prepare::Manifest;
use lazytrain_models::ModelConfig;
use lazytrain_storage::StorageUrl;

/// A prepared data folder's manifest, of the kind its task reads.
pub enum PreparedManifest {
    /// `prepare` blocks (masked and causal language modelling).
    Blocks(Manifest),
    /// `prepare-classification` rows.
    Rows(ClassificationManifest),
}

impl PreparedManifest {
    /// The manifest of `dir`, as `task` reads it.
    pub fn read(dir: &StorageUrl, task: Task) -> Result<PreparedManifest> {
        Ok(match task {
            Task::MaskedLm | Task::CausalLm => PreparedManifest::Blocks(Manifest::read_url(dir)?),
            Task::SequenceClassification => PreparedManifest::Rows(ClassificationManifest::read_url(dir)?),
        })
    }

    /// The hash and vocabulary size of the tokenizer that prepared the data.
    pub fn tokenizer(&self) -> (&str, usize) {
        match self {
            PreparedManifest::Blocks(m) => (&m.tokenizer_hash, m.vocab_size),
            PreparedManifest::Rows(m) => (&m.tokenizer_hash, m.vocab_size),
        }
    }

    /// The data's longest sequence in tokens, and the `prepare` flag that
    /// sets it.
    fn longest(&self) -> (usize, &'static str) {
        match self {
            PreparedManifest::Blocks(m) => (m.block_size, "--block-size"),
            PreparedManifest::Rows(m) => (m.max_length, "--max-length"),
        }
    }
}

/// The eval data, checked against the training data and the model before
/// training, so that a run does not fail (or score against the wrong
/// classes) at its first evaluation, hours in.
pub struct EvalData {
    /// The eval data's folder.
    dir: StorageUrl,
    /// Its longest sequence in tokens.
    tokens: usize,
    /// The `prepare` flag that sets it.
    flag: &'static str,
}

impl EvalData {
    /// The eval data in `dir` (its manifest `eval`); for classification its
    /// labels must be the training data's (`train`, from `train_dir`), in
    /// the same order, or every metric would compare ids of different classes.
    pub fn of(
        dir: &StorageUrl,
        eval: &PreparedManifest,
        train_dir: &StorageUrl,
        train: &PreparedManifest,
    ) -> Result<EvalData> {
        if let (PreparedManifest::Rows(eval), PreparedManifest::Rows(train)) = (eval, train) {
            if eval.labels != train.labels {
                return Err(Error::Input(format!(
                    "the eval data {dir} has the labels ({}) but the training data {train_dir} has ({}): label ids \
                     would name different classes; prepare both in one prepare-classification run (--files for \
                     training, --validation-files for evaluation)",
                    eval.labels.join(", "),
                    train.labels.join(", ")
                )));
            }
        }
        let (tokens, flag) = eval.longest();
        Ok(EvalData { dir: dir.clone(), tokens, flag })
    }

    /// Refuse eval sequences longer than `config`'s positions.
    pub fn check(eval: Option<&EvalData>, config: &ModelConfig) -> Result<()> {
        match eval {
            Some(e) => {
                lazytrain::trainer::check_fits_positions(config, &format!("the eval data {}", e.dir), e.tokens, e.flag)
            }
            None => Ok(()),
        }
    }
}
