//! A key/value cache of fixed capacity for decoding, TPU-style: every
//! step has the same shapes (the write position is a graph input), so a
//! generation compiles one prefill graph per prompt length and one decode
//! graph, and the cache buffers are updated in place.

use crate::{ModelConfig, ModelError, Result};
use lazytrain_core::{DType, Device, Tensor};

/// One layer's cached keys and values, `[batch, heads, capacity, head_dim]`.
pub struct LayerCache {
    /// Cached keys.
    pub key: Tensor,
    /// Cached values.
    pub value: Tensor,
    /// Where this step writes: `None` for a prefill (the cache is empty and
    /// filled from position 0), else each row's position `[batch, 1, 1, 1]`.
    write_at: Option<Tensor>,
}

impl LayerCache {
    /// Write this step's `[batch, heads, seq, head_dim]` keys and values
    /// and return the whole cache to attend over (the handles are updated
    /// in place, so the next step reads what this one wrote).
    pub(crate) fn write(&self, key: &Tensor, value: &Tensor) -> Result<(Tensor, Tensor)> {
        let capacity = self.key.dims()[2];
        let update = |old: &Tensor, new: &Tensor| -> Result<Tensor> {
            let full = match &self.write_at {
                None => new.pad(&[0; 4], &[0, 0, capacity - new.dims()[2], 0], 0.0)?,
                Some(at) => {
                    let slots = Tensor::iota([1, 1, capacity, 1], 2, DType::I64, old.device())?;
                    Tensor::select(&slots.eq(at)?, new, old)?
                }
            };
            old.assign(&full)?;
            Ok(full)
        };
        Ok((update(&self.key, key)?, update(&self.value, value)?))
    }
}

/// The cache of every layer for a batch of sequences, with each row's
/// length so far.
pub struct KvCache {
    layers: Vec<LayerCache>,
    lengths: Vec<usize>,
    capacity: usize,
    device: Device,
}

impl KvCache {
    /// An empty cache for `batch` sequences of up to `capacity` tokens.
    pub fn new(config: &ModelConfig, batch: usize, capacity: usize, device: &Device) -> Result<KvCache> {
        if capacity == 0 || capacity > config.max_position_embeddings {
            return Err(ModelError::Config {
                path: "kv cache".into(),
                detail: format!(
                    "a capacity of {capacity} tokens does not fit the model's n_positions {}; generate fewer tokens",
                    config.max_position_embeddings
                ),
            });
        }
        let heads = config.num_attention_heads;
        let shape = [batch, heads, capacity, config.hidden_size / heads];
        let layers = (0..config.num_hidden_layers)
            .map(|_| {
                Ok(LayerCache {
                    key: Tensor::zeros(shape, DType::F32, device)?,
                    value: Tensor::zeros(shape, DType::F32, device)?,
                    write_at: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, lengths: vec![0; batch], capacity, device: device.clone() })
    }

    /// Tokens each row holds so far.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// The most tokens a row can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Prepare to run `seq` new tokens per row: a prefill of an empty cache,
    /// or one decoded token per row at each row's length.
    fn begin_step(&mut self, seq: usize) -> Result<()> {
        let empty = self.lengths.iter().all(|&l| l == 0);
        let end = self.lengths.iter().max().copied().unwrap_or(0) + if empty { seq } else { 1 };
        if (!empty && seq != 1) || end > self.capacity {
            return Err(ModelError::Config {
                path: "kv cache".into(),
                detail: format!(
                    "cannot add {seq} tokens to rows of {:?} tokens in a cache of {}: the cache takes one prefill, \
                     then one token per step",
                    self.lengths, self.capacity
                ),
            });
        }
        let write_at = match empty {
            true => None,
            false => Some(self.row_values(&self.lengths)?.reshape([self.lengths.len(), 1, 1, 1])?),
        };
        for layer in &mut self.layers {
            layer.write_at = write_at.clone();
        }
        Ok(())
    }

    /// Trace one step of `seq` tokens per row with `run` (given the step's
    /// positions `[batch, seq]` and attention bias), then count them as held.
    pub(crate) fn step<T>(
        &mut self,
        seq: usize,
        run: impl FnOnce(&KvCache, &Tensor, &Tensor) -> Result<T>,
    ) -> Result<T> {
        self.begin_step(seq)?;
        let batch = self.lengths.len();
        let out = run(self, &self.positions(batch, seq)?, &self.attention_bias(seq)?)?;
        for length in &mut self.lengths {
            *length += seq;
        }
        Ok(out)
    }

    /// After a step: row `r` now holds `lengths[r]` tokens (a prefill's
    /// real prompt lengths, whatever it was padded to).
    pub fn set_lengths(&mut self, lengths: &[usize]) -> Result<()> {
        if lengths.len() != self.lengths.len() || lengths.iter().any(|&l| l > self.capacity) {
            return Err(ModelError::Config {
                path: "kv cache".into(),
                detail: format!("lengths {lengths:?} do not fit {} rows of {}", self.lengths.len(), self.capacity),
            });
        }
        self.lengths = lengths.to_vec();
        Ok(())
    }

    /// Each row's value as an `[batch]` i64 graph input.
    fn row_values(&self, values: &[usize]) -> Result<Tensor> {
        let values: Vec<i64> = values.iter().map(|&v| v as i64).collect();
        Ok(Tensor::from_vec(values, [self.lengths.len()], &self.device)?)
    }

    /// Positions `[batch, seq]` of this step's tokens.
    fn positions(&self, batch: usize, seq: usize) -> Result<Tensor> {
        let steps = Tensor::iota([batch, seq], 1, DType::I64, &self.device)?;
        Ok(steps.add(&self.row_values(&self.lengths)?.reshape([batch, 1])?)?)
    }

    /// The attention bias `[batch, 1, seq, capacity]`: query `q` of row `r`
    /// sees the slots up to its own position `lengths[r] + q`.
    fn attention_bias(&self, seq: usize) -> Result<Tensor> {
        let batch = self.lengths.len();
        let queries = self.positions(batch, seq)?.reshape([batch, 1, seq, 1])?;
        let slots = Tensor::iota([1, 1, 1, self.capacity], 3, DType::I64, &self.device)?;
        crate::gpt2::attention_bias(&slots.le(&queries)?, None)
    }

    /// The layers' caches.
    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }
}
