//! Collators turn records into host batches: the [`Collator`] trait the
//! loader drives, the masked-LM collator and the causal-LM one (Hugging
//! Face's `DataCollatorForLanguageModeling` with `mlm=True` and `mlm=False`).

use crate::dataset::ShardedDataset;
use crate::{DataError, Result};
use lazytrain_core::random::uniform_f32;

/// What the labels of a batch label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelLayout {
    /// One label per token: `[batch, seq]` (masked LM).
    PerToken,
    /// One label per sequence: `[batch]` (sequence classification).
    PerSequence,
}

/// A collated batch on the host: `[batch, seq]` row-major inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct HostBatch {
    /// Input token ids (after masking, for the MLM collator).
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// Segment ids (`None`: all zeros, as the model assumes without them).
    pub token_type_ids: Option<Vec<i64>>,
    /// Labels in `label_layout`; -100 where nothing is predicted.
    pub labels: Vec<i64>,
    /// Whether `labels` is per token or per sequence.
    pub label_layout: LabelLayout,
    /// Rows.
    pub batch: usize,
    /// Columns (the padded length).
    pub seq: usize,
    /// The labelled positions gathered for a head that runs only there
    /// (masked LM with `gather_labelled`), else `None`.
    pub selected: Option<SelectedLabels>,
}

/// The labelled positions of a per-token batch, padded to a fixed capacity
/// so the batch shape (and the compiled step) never changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectedLabels {
    /// Flat indices (`row * seq + column`) of the labelled tokens, in
    /// order, then 0 up to the capacity.
    pub positions: Vec<i64>,
    /// Their labels, then -100 up to the capacity.
    pub labels: Vec<i64>,
    /// Labelled tokens left unmasked because the batch had more than the
    /// capacity (their inputs restored, their labels -100).
    pub unmasked: usize,
}

/// How many labelled positions a `tokens`-token batch reserves when each
/// token is chosen with probability `p`: the binomial mean plus 8 standard
/// deviations (a batch over it is rarer than 1 in 10^15), rounded up to a
/// multiple of 8, at most `tokens`.
pub fn label_capacity(tokens: usize, p: f64) -> usize {
    let (n, p) = (tokens as f64, p.clamp(0.0, 1.0));
    let bound = n * p + 8.0 * (n * p * (1.0 - p)).sqrt();
    ((bound.ceil() as usize).div_ceil(8) * 8).clamp(8.min(tokens), tokens)
}

/// Gather the labelled positions of per-token `labels` (-100: none) into
/// `capacity` slots. Past the capacity, labelled tokens are unmasked: their
/// input becomes `originals`' token again and their label -100, so the
/// batch trains on fewer positions instead of changing shape.
pub fn select_labelled(
    input_ids: &mut [i64],
    labels: &mut [i64],
    originals: &[i64],
    capacity: usize,
) -> SelectedLabels {
    let mut positions = Vec::with_capacity(capacity);
    let mut picked = Vec::with_capacity(capacity);
    let mut unmasked = 0;
    for (at, label) in labels.iter_mut().enumerate() {
        if *label == -100 {
            continue;
        }
        if positions.len() < capacity {
            positions.push(at as i64);
            picked.push(*label);
        } else {
            input_ids[at] = originals[at];
            *label = -100;
            unmasked += 1;
        }
    }
    positions.resize(capacity, 0);
    picked.resize(capacity, -100);
    SelectedLabels { positions, labels: picked, unmasked }
}

impl HostBatch {
    /// The labels' shape: `[batch, seq]` or `[batch]`.
    pub fn label_shape(&self) -> Vec<usize> {
        match self.label_layout {
            LabelLayout::PerToken => vec![self.batch, self.seq],
            LabelLayout::PerSequence => vec![self.batch],
        }
    }

    /// Labelled positions (labels other than -100).
    pub fn label_count(&self) -> usize {
        self.labels.iter().filter(|&&l| l != -100).count()
    }

    /// Append rows of padding that predict nothing until there are `rows`
    /// rows, so a short last batch keeps the shape of the others.
    pub fn pad_to_rows(&mut self, rows: usize, pad_id: i64) {
        let missing = rows.saturating_sub(self.batch);
        let cells = missing * self.seq;
        self.input_ids.extend(std::iter::repeat_n(pad_id, cells));
        self.attention_mask.extend(std::iter::repeat_n(0, cells));
        if let Some(types) = &mut self.token_type_ids {
            types.extend(std::iter::repeat_n(0, cells));
        }
        let labels = match self.label_layout {
            LabelLayout::PerToken => cells,
            LabelLayout::PerSequence => missing,
        };
        self.labels.extend(std::iter::repeat_n(-100, labels));
        self.batch = self.batch.max(rows);
        // Padding rows are never labelled: the gathered positions stay valid.
    }
}

/// Builds a host batch from records of a dataset; the loader calls it on
/// its worker thread.
pub trait Collator: Send + 'static {
    /// Collate `records` (global record indices) drawn in `epoch`.
    fn collate_records(&self, dataset: &ShardedDataset, records: &[usize], epoch: u64) -> Result<HostBatch>;
}

/// Chooses `mlm_probability` of the non-special tokens; of those 80 % become
/// the mask token, 10 % a random token and 10 % stay unchanged. Randomness
/// comes from `(seed, epoch, sample index)`, so a sample collates the same
/// way however it was reached (directly or after a resume).
#[derive(Clone, Debug)]
pub struct MlmCollator {
    /// The mask token id.
    pub mask_id: u32,
    /// The padding id.
    pub pad_id: u32,
    /// Ids never chosen (specials and padding).
    pub special_ids: Vec<u32>,
    /// Vocabulary size (random replacements are drawn from non-special ids).
    pub vocab_size: usize,
    /// Fraction of tokens to predict.
    pub mlm_probability: f64,
    /// Pad sequences up to a multiple of this (static shapes).
    pub pad_to_multiple_of: usize,
    /// The collator's seed.
    pub seed: u64,
    /// Also gather the labelled positions ([`HostBatch::selected`], with
    /// [`label_capacity`] slots) for a head that runs only there.
    pub gather_labelled: bool,
}

impl MlmCollator {
    /// A collator for `tokenizer`: its special tokens are never chosen, its
    /// mask token replaces 80 %, and sequences pad to a multiple of 8. A
    /// tokenizer without a mask token (GPT-2's) is refused.
    pub fn for_tokenizer(tokenizer: &crate::TextTokenizer, mlm_probability: f64, seed: u64) -> Result<MlmCollator> {
        let s = tokenizer.special();
        let Some(mask_id) = s.mask else {
            return Err(DataError::Invalid(
                "the tokenizer has no mask token (a GPT-2 tokenizer); masked-LM training needs a BERT or RoBERTa \
                 style tokenizer, or train a causal LM with --task causal-lm"
                    .into(),
            ));
        };
        Ok(MlmCollator {
            mask_id,
            pad_id: s.pad,
            special_ids: s.ids(),
            vocab_size: tokenizer.vocab_size(),
            mlm_probability,
            pad_to_multiple_of: 8,
            seed,
            gather_labelled: false,
        })
    }

    /// Collate `samples` (`(global sample index, token ids)`) drawn in `epoch`.
    pub fn collate(&self, samples: &[(usize, Vec<i64>)], epoch: u64) -> Result<HostBatch> {
        if samples.is_empty() {
            return Err(DataError::Invalid("cannot collate an empty batch".into()));
        }
        if !(0.0..=1.0).contains(&self.mlm_probability) || self.vocab_size <= self.special_ids.len() {
            return Err(DataError::Invalid(format!(
                "mlm_probability must be in [0, 1] and the vocabulary larger than the special tokens (got {}, {})",
                self.mlm_probability, self.vocab_size
            )));
        }
        let longest = samples.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
        let multiple = self.pad_to_multiple_of.max(1);
        let seq = longest.div_ceil(multiple) * multiple;
        let mut batch = HostBatch {
            input_ids: Vec::with_capacity(samples.len() * seq),
            attention_mask: Vec::with_capacity(samples.len() * seq),
            token_type_ids: None,
            labels: Vec::with_capacity(samples.len() * seq),
            label_layout: LabelLayout::PerToken,
            batch: samples.len(),
            seq,
            selected: None,
        };
        let mut originals = Vec::with_capacity(if self.gather_labelled { samples.len() * seq } else { 0 });
        let regular: Vec<u32> = (0..self.vocab_size as u32).filter(|t| !self.special_ids.contains(t)).collect();
        let mut u = vec![0f32; 3 * seq];
        for (index, ids) in samples {
            uniform_f32(self.seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15), *index as u64, &mut u);
            for pos in 0..seq {
                if self.gather_labelled {
                    originals.push(ids.get(pos).copied().unwrap_or(self.pad_id as i64));
                }
                let Some(&token) = ids.get(pos) else {
                    batch.input_ids.push(self.pad_id as i64);
                    batch.attention_mask.push(0);
                    batch.labels.push(-100);
                    continue;
                };
                batch.attention_mask.push(i64::from(token != self.pad_id as i64));
                let special = token < 0 || self.special_ids.contains(&(token as u32));
                if special || (u[3 * pos] as f64) >= self.mlm_probability {
                    batch.input_ids.push(token);
                    batch.labels.push(-100);
                    continue;
                }
                batch.labels.push(token);
                let action = u[3 * pos + 1];
                batch.input_ids.push(if action < 0.8 {
                    self.mask_id as i64
                } else if action < 0.9 {
                    let r = ((u[3 * pos + 2] as f64) * regular.len() as f64) as usize;
                    regular[r.min(regular.len() - 1)] as i64
                } else {
                    token
                });
            }
        }
        if self.gather_labelled {
            let capacity = label_capacity(batch.batch * seq, self.mlm_probability);
            batch.selected = Some(select_labelled(&mut batch.input_ids, &mut batch.labels, &originals, capacity));
        }
        Ok(batch)
    }
}

impl Collator for MlmCollator {
    fn collate_records(&self, dataset: &ShardedDataset, records: &[usize], epoch: u64) -> Result<HostBatch> {
        let rows =
            records.iter().map(|&r| dataset.feature(r, "input_ids").map(|ids| (r, ids))).collect::<Result<Vec<_>>>()?;
        self.collate(&rows, epoch)
    }
}

/// Causal-LM batches: the inputs are the labels (the model shifts them);
/// rows pad with `pad_id` to a multiple of `pad_to_multiple_of`, and padding
/// is masked out of attention and labelled -100. Every token of a record is
/// real, even one equal to `pad_id` (GPT-2 pads with its `<|endoftext|>`,
/// which also separates documents).
#[derive(Clone, Debug)]
pub struct CausalLmCollator {
    /// Padding id.
    pub pad_id: u32,
    /// Pad each batch's length up to a multiple of this.
    pub pad_to_multiple_of: usize,
}

impl CausalLmCollator {
    /// Collate token-id rows.
    pub fn collate(&self, rows: &[Vec<i64>]) -> Result<HostBatch> {
        if rows.is_empty() {
            return Err(DataError::Invalid("cannot collate an empty batch".into()));
        }
        let multiple = self.pad_to_multiple_of.max(1);
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0).div_ceil(multiple) * multiple;
        let mut batch = HostBatch {
            input_ids: Vec::with_capacity(rows.len() * seq),
            attention_mask: Vec::with_capacity(rows.len() * seq),
            token_type_ids: None,
            labels: Vec::with_capacity(rows.len() * seq),
            label_layout: LabelLayout::PerToken,
            batch: rows.len(),
            seq,
            selected: None,
        };
        for ids in rows {
            let padding = seq - ids.len();
            batch.input_ids.extend(ids.iter().copied().chain(std::iter::repeat_n(self.pad_id as i64, padding)));
            batch.attention_mask.extend(std::iter::repeat_n(1, ids.len()).chain(std::iter::repeat_n(0, padding)));
            batch.labels.extend(ids.iter().copied().chain(std::iter::repeat_n(-100, padding)));
        }
        Ok(batch)
    }
}

impl Collator for CausalLmCollator {
    fn collate_records(&self, dataset: &ShardedDataset, records: &[usize], _epoch: u64) -> Result<HostBatch> {
        let rows = records.iter().map(|&r| dataset.feature(r, "input_ids")).collect::<Result<Vec<_>>>()?;
        self.collate(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collator() -> MlmCollator {
        MlmCollator {
            mask_id: 4,
            pad_id: 0,
            special_ids: vec![0, 1, 2, 3, 4],
            vocab_size: 1000,
            mlm_probability: 0.15,
            pad_to_multiple_of: 8,
            seed: 42,
            gather_labelled: false,
        }
    }

    #[test]
    fn label_capacity_is_the_mean_plus_eight_sigma() {
        // 32 x 128 tokens at 15 %: 614.4 + 8 * 22.85 = 797.2 -> 800.
        assert_eq!(label_capacity(4096, 0.15), 800);
        assert_eq!(label_capacity(16 * 128, 0.15), 440); // 307.2 + 8 * 16.16 = 436.5
        assert_eq!(label_capacity(4096, 1.0), 4096);
        assert_eq!(label_capacity(4096, 0.0), 8);
        assert_eq!(label_capacity(4, 0.5), 4, "never more slots than tokens");
    }

    #[test]
    fn gathered_labels_are_the_dense_ones_in_order() {
        let mut c = collator();
        c.gather_labelled = true;
        let samples: Vec<(usize, Vec<i64>)> =
            (0..4).map(|i| (i, (0..64).map(|p| 5 + p + i as i64).collect())).collect();
        let batch = c.collate(&samples, 3).unwrap();
        let selected = batch.selected.as_ref().unwrap();
        assert_eq!(selected.positions.len(), label_capacity(4 * 64, 0.15));
        let dense: Vec<(i64, i64)> =
            batch.labels.iter().enumerate().filter(|(_, &l)| l != -100).map(|(at, &l)| (at as i64, l)).collect();
        let count = dense.len();
        assert!(count > 0 && count <= selected.positions.len());
        let gathered: Vec<(i64, i64)> =
            selected.positions.iter().copied().zip(selected.labels.iter().copied()).collect();
        assert_eq!(&gathered[..count], &dense[..]);
        assert!(gathered[count..].iter().all(|&(at, l)| at == 0 && l == -100));
        assert_eq!(selected.unmasked, 0);
        c.gather_labelled = false;
        let plain = c.collate(&samples, 3).unwrap();
        assert_eq!((plain.input_ids, plain.labels), (batch.input_ids.clone(), batch.labels.clone()), "same masking");
    }

    #[test]
    fn a_batch_over_capacity_unmasks_the_excess() {
        let c = collator();
        let samples: Vec<(usize, Vec<i64>)> = (0..2).map(|i| (i, (0..64).map(|p| 5 + p).collect())).collect();
        let mut batch = c.collate(&samples, 0).unwrap();
        let originals: Vec<i64> = samples.iter().flat_map(|(_, ids)| ids.clone()).collect();
        let labelled: Vec<usize> = (0..batch.labels.len()).filter(|&at| batch.labels[at] != -100).collect();
        assert!(labelled.len() > 4);
        let before = batch.clone();
        let selected = select_labelled(&mut batch.input_ids, &mut batch.labels, &originals, 4);
        assert_eq!(selected.unmasked, labelled.len() - 4);
        assert_eq!(selected.positions, labelled[..4].iter().map(|&at| at as i64).collect::<Vec<_>>());
        for &at in &labelled[4..] {
            assert_eq!((batch.input_ids[at], batch.labels[at]), (originals[at], -100), "position {at} unmasked");
        }
        for &at in &labelled[..4] {
            assert_eq!((batch.input_ids[at], batch.labels[at]), (before.input_ids[at], before.labels[at]));
        }
        assert_eq!(batch.label_count(), 4);
    }

    #[test]
    fn masking_statistics_over_100k_tokens() {
        let c = collator();
        let (mut chosen, mut masked, mut random, mut kept, mut total, mut special_chosen) = (0, 0, 0, 0, 0, 0);
        for batch in 0..100 {
            let samples: Vec<(usize, Vec<i64>)> = (0..8)
                .map(|i| {
                    let index = batch * 8 + i;
                    let mut ids: Vec<i64> = (0..125).map(|p| 5 + ((index * 131 + p * 17) % 995) as i64).collect();
                    ids[0] = 2;
                    ids[124] = 3;
                    (index, ids)
                })
                .collect();
            let b = c.collate(&samples, 0).unwrap();
            assert_eq!(b.seq, 128, "padded to a multiple of 8");
            for (i, (&input, &label)) in b.input_ids.iter().zip(&b.labels).enumerate() {
                let original = samples[i / 128].1.get(i % 128).copied();
                if let Some(orig) = original {
                    if (orig as u32) < 5 {
                        special_chosen += usize::from(label != -100);
                        continue;
                    }
                    total += 1;
                }
                if label == -100 {
                    continue;
                }
                chosen += 1;
                match input {
                    4 => masked += 1,
                    x if x == label => kept += 1,
                    _ => random += 1,
                }
            }
        }
        assert!(total >= 98_000);
        assert_eq!(special_chosen, 0, "special tokens are never chosen");
        let frac = chosen as f64 / total as f64;
        assert!((frac - 0.15).abs() < 0.005, "masked fraction {frac}");
        let (m, r, k) = (masked as f64 / chosen as f64, random as f64 / chosen as f64, kept as f64 / chosen as f64);
        assert!((m - 0.8).abs() < 0.01 && (r - 0.1).abs() < 0.01 && (k - 0.1).abs() < 0.011, "{m} {r} {k}");
    }

    #[test]
    fn causal_batches_label_every_real_token_and_no_padding() {
        let c = CausalLmCollator { pad_id: 0, pad_to_multiple_of: 4 };
        let b = c.collate(&[vec![5, 0, 7], vec![9, 8, 7, 6, 5]]).unwrap();
        assert_eq!((b.batch, b.seq), (2, 8));
        assert_eq!(b.input_ids, [5, 0, 7, 0, 0, 0, 0, 0, 9, 8, 7, 6, 5, 0, 0, 0]);
        assert_eq!(b.attention_mask, [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0], "a real pad-id token is kept");
        assert_eq!(b.labels, [5, 0, 7, -100, -100, -100, -100, -100, 9, 8, 7, 6, 5, -100, -100, -100]);
        assert!(c.collate(&[]).is_err());
    }

    #[test]
    fn same_seed_epoch_and_index_same_batch() {
        let c = collator();
        let s = vec![(17usize, (5..100).collect::<Vec<i64>>())];
        assert_eq!(c.collate(&s, 3).unwrap(), c.collate(&s, 3).unwrap());
        assert_ne!(c.collate(&s, 3).unwrap(), c.collate(&s, 4).unwrap());
        let b = c.collate(&s, 3).unwrap();
        assert_eq!(&b.attention_mask[95..], &[0; 1], "padding is masked out");
        assert_eq!(b.labels[95], -100);
    }
}
