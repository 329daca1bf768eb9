//! Batches of prepared labelled rows: padded to the longest bucket in the
//! batch, one label per sequence.

use crate::collator::{Collator, HostBatch, LabelLayout};
use crate::dataset::ShardedDataset;
use crate::{DataError, Result};

/// Collates `prepare-classification` records. Rows are stored padded to
/// their bucket, so a batch is as long as its longest bucket: every batch
/// shape is one of the buckets and compiles once.
#[derive(Clone, Debug)]
pub struct ClassificationCollator {
    /// The padding id.
    pub pad_id: u32,
    /// The longest row allowed (the manifest's `max_length`).
    pub max_length: usize,
}

const FEATURES: [&str; 4] = ["input_ids", "attention_mask", "token_type_ids", "label"];

impl Collator for ClassificationCollator {
    fn collate_records(&self, dataset: &ShardedDataset, records: &[usize], _epoch: u64) -> Result<HostBatch> {
        if records.is_empty() {
            return Err(DataError::Invalid("cannot collate an empty batch".into()));
        }
        let rows = records.iter().map(|&r| dataset.features(r, &FEATURES)).collect::<Result<Vec<_>>>()?;
        let seq = rows.iter().map(|f| f[0].len()).max().unwrap_or(0);
        if seq > self.max_length {
            return Err(DataError::Invalid(format!(
                "a record has {seq} tokens, more than the data's max_length {}; re-run prepare-classification",
                self.max_length
            )));
        }
        let mut batch = HostBatch {
            input_ids: Vec::with_capacity(rows.len() * seq),
            attention_mask: Vec::with_capacity(rows.len() * seq),
            token_type_ids: Some(Vec::with_capacity(rows.len() * seq)),
            labels: Vec::with_capacity(rows.len()),
            label_layout: LabelLayout::PerSequence,
            batch: rows.len(),
            seq,
            selected: None,
        };
        let types = batch.token_type_ids.as_mut().expect("just set");
        for (row, &record) in rows.iter().zip(records) {
            let [ids, mask, segment, label] = [&row[0], &row[1], &row[2], &row[3]];
            if mask.len() != ids.len() || segment.len() != ids.len() || label.len() != 1 {
                return Err(DataError::Invalid(format!(
                    "record {record} has {} ids, {} mask values, {} token types and {} labels; re-run prepare-classification",
                    ids.len(),
                    mask.len(),
                    segment.len(),
                    label.len()
                )));
            }
            let pad = seq - ids.len();
            batch.input_ids.extend(ids.iter().copied().chain(std::iter::repeat_n(self.pad_id as i64, pad)));
            batch.attention_mask.extend(mask.iter().copied().chain(std::iter::repeat_n(0, pad)));
            types.extend(segment.iter().copied().chain(std::iter::repeat_n(0, pad)));
            batch.labels.push(label[0]);
        }
        Ok(batch)
    }
}
