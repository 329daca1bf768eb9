//! `DeviceLoader`: reads, collates and uploads batch n+1 on a background
//! thread while step n runs, and marks the step boundary between batches the
//! way PyTorch/XLA's `MpDeviceLoader` does.

use crate::collator::{Collator, HostBatch};
use crate::dataset::{EpochSampler, ShardedDataset};
use crate::{DataError, Result};
use lazytrain_core::{Device, Tensor};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Batches whose records are fetched ahead from bucket shards.
const LOOKAHEAD_BATCHES: usize = 2;

/// A batch on the device.
pub struct DeviceBatch {
    /// `[batch, seq]` i64 inputs.
    pub input_ids: Tensor,
    /// `[batch, seq]` i64, 1 for tokens.
    pub attention_mask: Tensor,
    /// `[batch, seq]` i64 segment ids, when the data has them.
    pub token_type_ids: Option<Tensor>,
    /// i64 labels, `[batch, seq]` (masked LM) or `[batch]` (classification);
    /// -100 where nothing is predicted.
    pub labels: Tensor,
    /// The epoch it belongs to.
    pub epoch: u64,
    /// This replica's sample index (within the epoch) of its first row.
    pub first_sample: usize,
    /// Labelled positions (tokens or sequences) in the batch.
    pub label_count: usize,
    /// `[capacity]` i64 flat indices of the labelled tokens and `[capacity]`
    /// their labels (-100 in unused slots), when the collator gathers them
    /// for a head that runs only there.
    pub selected: Option<(Tensor, Tensor)>,
    /// Labelled tokens unmasked because the batch had more than the capacity.
    pub unmasked_over_capacity: usize,
}

/// Where a loader starts and how long it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderPlan {
    /// Rows per batch.
    pub batch_size: usize,
    /// Batches prepared ahead (at least 1).
    pub prefetch: usize,
    /// The epoch to start in.
    pub start_epoch: u64,
    /// The sample (of this replica, in that epoch) to start at.
    pub start_sample: usize,
    /// Stop after this many batches (`None`: run until `epochs` are done).
    pub max_batches: Option<u64>,
    /// Epochs to run in total (counting from 0).
    pub epochs: u64,
}

/// Iterates device batches; each `next()` after the first marks the step
/// boundary (`Device::mark_step`) before handing over the prefetched batch.
pub struct DeviceLoader {
    rx: Receiver<Result<DeviceBatch>>,
    device: Device,
    yielded: bool,
    worker: Option<JoinHandle<()>>,
}

/// Copy a host batch to `device`.
pub fn upload(host: HostBatch, device: &Device, epoch: u64, first_sample: usize) -> Result<DeviceBatch> {
    let shape = [host.batch, host.seq];
    let label_count = host.label_count();
    let label_shape = host.label_shape();
    let token_type_ids = match host.token_type_ids {
        Some(types) => Some(Tensor::from_vec(types, shape, device)?),
        None => None,
    };
    let unmasked_over_capacity = host.selected.as_ref().map_or(0, |s| s.unmasked);
    let selected = match host.selected {
        Some(s) => {
            let capacity = s.positions.len();
            Some((Tensor::from_vec(s.positions, [capacity], device)?, Tensor::from_vec(s.labels, [capacity], device)?))
        }
        None => None,
    };
    Ok(DeviceBatch {
        input_ids: Tensor::from_vec(host.input_ids, shape, device)?,
        attention_mask: Tensor::from_vec(host.attention_mask, shape, device)?,
        token_type_ids,
        labels: Tensor::from_vec(host.labels, label_shape, device)?,
        epoch,
        first_sample,
        label_count,
        selected,
        unmasked_over_capacity,
    })
}

impl DeviceLoader {
    /// Start the background worker.
    pub fn new(
        dataset: Arc<ShardedDataset>,
        mut sampler: EpochSampler,
        collator: impl Collator,
        plan: LoaderPlan,
        device: &Device,
    ) -> Result<DeviceLoader> {
        let per_epoch = sampler.samples_per_epoch() / plan.batch_size.max(1);
        if plan.batch_size == 0 || per_epoch == 0 {
            return Err(DataError::Invalid(format!(
                "batch size {} with {} samples per replica leaves no full batch",
                plan.batch_size,
                sampler.samples_per_epoch()
            )));
        }
        let (tx, rx) = sync_channel(plan.prefetch.max(1));
        let dev = device.clone();
        let worker = std::thread::Builder::new()
            .name("lazytrain-loader".into())
            .spawn(move || {
                let mut produced = 0u64;
                let (mut epoch, mut sample) = (plan.start_epoch, plan.start_sample);
                while epoch < plan.epochs && plan.max_batches.is_none_or(|m| produced < m) {
                    // The start may come from a saved state: compare without overflowing.
                    if sample > (per_epoch - 1) * plan.batch_size {
                        epoch += 1;
                        sample = 0;
                        continue;
                    }
                    let records: Vec<usize> =
                        (sample..sample + plan.batch_size).map(|k| sampler.record(epoch, k)).collect();
                    if dataset.is_remote() {
                        // Bucket shards: start fetching the next batches' records now.
                        let ahead = (sample + plan.batch_size)
                            ..usize::min(
                                sample + plan.batch_size * (1 + LOOKAHEAD_BATCHES),
                                sampler.samples_per_epoch(),
                            );
                        let upcoming: Vec<usize> = ahead.map(|k| sampler.record(epoch, k)).collect();
                        dataset.prefetch(&upcoming);
                    }
                    let batch = collator
                        .collate_records(&dataset, &records, epoch)
                        .and_then(|host| upload(host, &dev, epoch, sample));
                    let failed = batch.is_err();
                    if tx.send(batch).is_err() || failed {
                        return;
                    }
                    produced += 1;
                    sample += plan.batch_size;
                }
            })
            .map_err(|e| DataError::Invalid(format!("cannot start the loader thread: {e}")))?;
        Ok(DeviceLoader { rx, device: device.clone(), yielded: false, worker: Some(worker) })
    }
}

impl Iterator for DeviceLoader {
    type Item = Result<DeviceBatch>;

    fn next(&mut self) -> Option<Result<DeviceBatch>> {
        if self.yielded {
            if let Err(e) = self.device.mark_step() {
                return Some(Err(e.into()));
            }
        }
        match self.rx.recv() {
            Ok(batch) => {
                self.yielded = true;
                Some(batch)
            }
            Err(_) => {
                // The worker hung up: the data ran out, or it panicked, which
                // must not pass for the end of the data.
                let panic = self.worker.take()?.join().err()?;
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Some(Err(DataError::Invalid(format!("the loader thread panicked while preparing a batch: {what}"))))
            }
        }
    }
}
