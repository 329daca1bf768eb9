//! `Trainer::evaluate`: every eval batch has the same shape (a short last
//! batch is padded with rows that predict nothing), so evaluation compiles
//! once per sequence length.

use super::task::{argmax_rows, ConfusionMatrix, EvalMetrics, TaskData};
use super::Trainer;
use crate::{Error, Result};
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DType, Device, Tensor};
use lazytrain_data::collator::Collator;
use lazytrain_data::loader::upload;
use lazytrain_models::TaskModel;
use lazytrain_nn::Context;

/// Running sums of an evaluation.
enum Tally {
    MaskedLm { loss: f64, correct: f64, count: f64 },
    Classification { loss: f64, confusion: ConfusionMatrix },
}

impl Tally {
    /// The tally with every replica's counts added (one all-reduce).
    fn summed_over_replicas(self, device: &Device) -> Result<Tally> {
        let flat = match &self {
            Tally::MaskedLm { loss, correct, count } => vec![*loss, *correct, *count],
            Tally::Classification { loss, confusion } => {
                let mut v = vec![*loss];
                v.extend(confusion.to_flat());
                v
            }
        };
        let n = flat.len();
        let summed = Tensor::from_vec(flat, [n], device)?.all_reduce(AllReduceOp::Sum)?.to_vec::<f64>()?;
        Ok(match self {
            Tally::MaskedLm { .. } => Tally::MaskedLm { loss: summed[0], correct: summed[1], count: summed[2] },
            Tally::Classification { confusion, .. } => Tally::Classification {
                loss: summed[0],
                confusion: ConfusionMatrix::from_flat(confusion.classes(), &summed[1..]),
            },
        })
    }

    /// The labelled tokens (masked LM) or examples (classifier) scored.
    fn scored(&self) -> u64 {
        match self {
            Tally::MaskedLm { count, .. } => *count as u64,
            Tally::Classification { confusion, .. } => confusion.total(),
        }
    }
}

impl<M: TaskModel> Trainer<M> {
    /// Evaluate on the eval data. A masked LM reports the mean loss per
    /// masked token, perplexity and masked-token accuracy; a classifier the
    /// mean loss per sequence, accuracy and macro-F1. Replicas evaluate
    /// every `world`-th batch each and add up their tallies.
    pub fn evaluate(&mut self) -> Result<EvalMetrics> {
        let Some(eval) = self.eval.clone() else {
            return Err(Error::Input("no eval data was given; pass --eval-data DIR".into()));
        };
        let collator = self.collator(self.args.seed ^ 0xe7a1, false)?;
        let ctx = Context::eval();
        let pad = self.tokenizer.special().pad as i64;
        let mut tally = match &self.task {
            TaskData::MaskedLm { .. } | TaskData::CausalLm { .. } => {
                Tally::MaskedLm { loss: 0.0, correct: 0.0, count: 0.0 }
            }
            TaskData::SequenceClassification { labels, .. } => {
                Tally::Classification { loss: 0.0, confusion: ConfusionMatrix::new(labels.len()) }
            }
        };
        let (rank, world) = self.replica_position();
        let records_used = self.args.max_eval_samples.map_or(eval.len(), |n| n.min(eval.len()));
        // No batch larger than the records evaluated: a short eval set is not
        // padded out to a large --per-device-eval-batch-size.
        let rows = self.args.per_device_eval_batch_size.min(records_used.max(1));
        for (_, first) in (0..records_used).step_by(rows).enumerate().filter(|(b, _)| b % world == rank) {
            let records: Vec<usize> = (first..(first + rows).min(records_used)).collect();
            let mut host = collator.collate_records(&eval, &records, 0)?;
            host.pad_to_rows(rows, pad);
            // The classifier scores predictions on the host against these.
            let labels = matches!(tally, Tally::Classification { .. }).then(|| host.labels.clone());
            let batch = upload(host, &self.device, 0, first)?;
            let types = batch.token_type_ids.as_ref();
            let autocast = self.autocast()?;
            let logits = self.model.forward(&batch.input_ids, Some(&batch.attention_mask), types, &ctx)?;
            drop(autocast);
            let targets = self.model.targets(&batch.labels)?;
            let loss = logits.cross_entropy_sum(&targets, -100)?;
            match &mut tally {
                Tally::MaskedLm { loss: loss_sum, correct, count } => {
                    let valid = targets.ne_scalar(-100.0)?;
                    let zero = Tensor::zeros([], DType::I64, &self.device)?;
                    let safe = Tensor::select(&valid, &targets, &zero)?;
                    let picked = logits.gather(-1, &safe.unsqueeze(-1)?)?.squeeze(-1)?;
                    let best = logits.max(&[-1], false)?;
                    let valid = valid.cast(DType::F32)?;
                    let hits = picked.ge(&best)?.cast(DType::F32)?.mul(&valid)?.sum_all()?;
                    let n = valid.sum_all()?;
                    self.device.mark_step()?;
                    *loss_sum += loss.item::<f32>()? as f64;
                    *correct += hits.item::<f32>()? as f64;
                    *count += n.item::<f32>()? as f64;
                }
                Tally::Classification { loss: loss_sum, confusion } => {
                    self.device.mark_step()?;
                    *loss_sum += loss.item::<f32>()? as f64;
                    let classes = logits.dims()[1];
                    let predictions = argmax_rows(&logits.to_vec::<f32>()?, classes);
                    for (&label, prediction) in labels.iter().flatten().zip(predictions) {
                        if label >= 0 {
                            confusion.add(label as usize, prediction);
                        }
                    }
                }
            }
        }
        if world > 1 {
            tally = tally.summed_over_replicas(&self.device)?;
        }
        if tally.scored() == 0 {
            return Err(Error::Input(format!(
                "the eval data ({} records) has nothing to score (no masked token or labelled example), so its \
                 metrics would be meaningless; give it more records (more text or a larger --validation-fraction)",
                records_used
            )));
        }
        Ok(match tally {
            Tally::MaskedLm { loss, correct, count } => {
                let loss = loss / count;
                EvalMetrics {
                    loss,
                    accuracy: correct / count,
                    perplexity: Some(loss.exp()),
                    macro_f1: None,
                    count: count as u64,
                    unit: match self.task {
                        TaskData::CausalLm { .. } => "next tokens",
                        TaskData::MaskedLm { .. } | TaskData::SequenceClassification { .. } => "masked tokens",
                    },
                }
            }
            Tally::Classification { loss, confusion } => EvalMetrics {
                loss: loss / confusion.total() as f64,
                accuracy: confusion.accuracy(),
                perplexity: None,
                macro_f1: Some(confusion.macro_f1()),
                count: confusion.total(),
                unit: "sequences",
            },
        })
    }
}
