//! What the Trainer trains: masked-LM or causal-LM blocks, or labelled
//! sequences, how each is batched, and the metrics each is evaluated with.

use lazytrain_data::classification::ClassificationCollator;
use lazytrain_data::collator::{CausalLmCollator, Collator, HostBatch, MlmCollator};
use lazytrain_data::dataset::ShardedDataset;
use lazytrain_data::TextTokenizer;
use serde_json::{json, Map, Value};

/// The data a Trainer trains on.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskData {
    /// Masked-LM blocks of `block_size` tokens (from `prepare`).
    MaskedLm {
        /// Tokens per block.
        block_size: usize,
    },
    /// Causal-LM blocks of `block_size` tokens (from `prepare`): every
    /// token predicts the next.
    CausalLm {
        /// Tokens per block.
        block_size: usize,
    },
    /// Labelled sequences of at most `max_length` tokens (from `prepare-classification`).
    SequenceClassification {
        /// The longest sequence.
        max_length: usize,
        /// Label names in id order.
        labels: Vec<String>,
    },
}

impl TaskData {
    /// The keys of the metrics an evaluation logs ([`EvalMetrics::log_entry`]).
    pub fn metric_keys(&self) -> &'static [&'static str] {
        match self {
            TaskData::MaskedLm { .. } | TaskData::CausalLm { .. } => &["eval_loss", "eval_accuracy", "eval_perplexity"],
            TaskData::SequenceClassification { .. } => &["eval_loss", "eval_accuracy", "eval_f1"],
        }
    }

    /// The collator for this data: MLM masking seeded by `seed`, the blocks
    /// as their own labels, or labelled rows padded to their buckets.
    /// `gather_labelled`: masked-LM batches also carry their labelled
    /// positions, for a head computed only there. Blocks pad to a multiple
    /// of 8 tokens when the model's `positions` are one, so that no block
    /// (of the training data or of eval data of another block size) is
    /// padded past them: a model of 100 positions takes its blocks unpadded.
    pub fn collator(
        &self,
        tokenizer: &TextTokenizer,
        mlm_probability: f64,
        seed: u64,
        gather_labelled: bool,
        positions: usize,
    ) -> lazytrain_data::Result<TaskCollator> {
        let multiple = match positions.is_multiple_of(8) {
            true => 8,
            false => 1,
        };
        Ok(match self {
            TaskData::MaskedLm { .. } => {
                let mut collator = MlmCollator::for_tokenizer(tokenizer, mlm_probability, seed)?;
                collator.gather_labelled = gather_labelled;
                collator.pad_to_multiple_of = multiple;
                TaskCollator::MaskedLm(collator)
            }
            TaskData::CausalLm { .. } => TaskCollator::CausalLm(CausalLmCollator {
                pad_id: tokenizer.special().pad,
                pad_to_multiple_of: multiple,
            }),
            TaskData::SequenceClassification { max_length, .. } => {
                TaskCollator::SequenceClassification(ClassificationCollator {
                    pad_id: tokenizer.special().pad,
                    max_length: *max_length,
                })
            }
        })
    }
}

/// The collator of a [`TaskData`].
#[derive(Clone, Debug)]
pub enum TaskCollator {
    /// Masks tokens to predict.
    MaskedLm(MlmCollator),
    /// Predicts every next token.
    CausalLm(CausalLmCollator),
    /// One label per sequence.
    SequenceClassification(ClassificationCollator),
}

impl Collator for TaskCollator {
    fn collate_records(
        &self,
        dataset: &ShardedDataset,
        records: &[usize],
        epoch: u64,
    ) -> lazytrain_data::Result<HostBatch> {
        match self {
            TaskCollator::MaskedLm(c) => c.collate_records(dataset, records, epoch),
            TaskCollator::CausalLm(c) => c.collate_records(dataset, records, epoch),
            TaskCollator::SequenceClassification(c) => c.collate_records(dataset, records, epoch),
        }
    }
}

/// Evaluation results.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalMetrics {
    /// Mean cross-entropy per prediction (masked or next token, or sequence).
    pub loss: f64,
    /// Predictions whose top class is the label.
    pub accuracy: f64,
    /// `exp(loss)`, for a masked or causal LM.
    pub perplexity: Option<f64>,
    /// Macro-averaged F1 over the labels, for a classifier.
    pub macro_f1: Option<f64>,
    /// Predictions evaluated (masked or next tokens, or sequences).
    pub count: u64,
    /// What was predicted: `masked tokens`, `next tokens` or `sequences`.
    pub unit: &'static str,
}

impl EvalMetrics {
    /// The metrics as Hugging Face logs them: `eval_loss`, `eval_accuracy`,
    /// and `eval_perplexity` or `eval_f1`.
    pub fn log_entry(&self) -> Map<String, Value> {
        let mut entry = Map::new();
        entry.insert("eval_loss".into(), json!(self.loss));
        entry.insert("eval_accuracy".into(), json!(self.accuracy));
        if let Some(p) = self.perplexity {
            entry.insert("eval_perplexity".into(), json!(p));
        }
        if let Some(f1) = self.macro_f1 {
            entry.insert("eval_f1".into(), json!(f1));
        }
        entry
    }
}

impl std::fmt::Display for EvalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "loss {:.4}", self.loss)?;
        match (self.perplexity, self.macro_f1) {
            (Some(p), _) => {
                write!(f, ", perplexity {p:.2}, accuracy {:.3} over {} {}", self.accuracy, self.count, self.unit)
            }
            (None, Some(f1)) => {
                write!(f, ", accuracy {:.3}, macro-F1 {f1:.3} over {} {}", self.accuracy, self.count, self.unit)
            }
            (None, None) => write!(f, ", accuracy {:.3} over {} {}", self.accuracy, self.count, self.unit),
        }
    }
}

/// Counts of a classifier's predictions against its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfusionMatrix {
    /// `counts[label][prediction]`.
    counts: Vec<Vec<u64>>,
}

impl ConfusionMatrix {
    /// An empty matrix over `classes` labels.
    pub fn new(classes: usize) -> ConfusionMatrix {
        ConfusionMatrix { counts: vec![vec![0; classes]; classes] }
    }

    /// Count one prediction.
    pub fn add(&mut self, label: usize, prediction: usize) {
        if label < self.counts.len() && prediction < self.counts.len() {
            self.counts[label][prediction] += 1;
        }
    }

    /// The counts, row by row (label-major), as floats.
    pub fn to_flat(&self) -> Vec<f64> {
        self.counts.iter().flatten().map(|&c| c as f64).collect()
    }

    /// A matrix over `classes` labels from [`ConfusionMatrix::to_flat`]'s layout.
    pub fn from_flat(classes: usize, flat: &[f64]) -> ConfusionMatrix {
        let mut m = ConfusionMatrix::new(classes);
        for (i, &c) in flat.iter().take(classes * classes).enumerate() {
            m.counts[i / classes][i % classes] = c.round().max(0.0) as u64;
        }
        m
    }

    /// The number of classes.
    pub fn classes(&self) -> usize {
        self.counts.len()
    }

    /// Predictions counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }

    /// Fraction of predictions equal to their label.
    pub fn accuracy(&self) -> f64 {
        let right: u64 = (0..self.counts.len()).map(|c| self.counts[c][c]).sum();
        right as f64 / self.total().max(1) as f64
    }

    /// F1 averaged over the classes that occur as a label or a prediction
    /// (scikit-learn's `f1_score(average="macro")`).
    pub fn macro_f1(&self) -> f64 {
        let n = self.counts.len();
        let mut scores = Vec::new();
        for c in 0..n {
            let tp = self.counts[c][c];
            let false_neg: u64 = (0..n).filter(|&p| p != c).map(|p| self.counts[c][p]).sum();
            let false_pos: u64 = (0..n).filter(|&l| l != c).map(|l| self.counts[l][c]).sum();
            let denominator = 2 * tp + false_pos + false_neg;
            if denominator > 0 {
                scores.push(2.0 * tp as f64 / denominator as f64);
            }
        }
        scores.iter().sum::<f64>() / scores.len().max(1) as f64
    }
}

/// The index of the largest value of each row of `logits` (`[rows, classes]`).
pub fn argmax_rows(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes.max(1))
        .map(|row| row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macro_f1_matches_scikit_learn() {
        // f1_score([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], average="macro") = (0.5 + 0.8 + 0) / 3.
        let mut m = ConfusionMatrix::new(4);
        for (label, prediction) in [(0, 0), (0, 1), (1, 1), (1, 1), (2, 0)] {
            m.add(label, prediction);
        }
        assert!((m.macro_f1() - 1.3 / 3.0).abs() < 1e-12, "class 3 never occurs and is left out");
        assert!((m.accuracy() - 0.6).abs() < 1e-12);
        assert_eq!(argmax_rows(&[0.1, 0.7, 0.2, 3.0, -1.0, 3.0], 3), [1, 0], "ties go to the first");
    }
}
