//! The in-process collective: replicas are threads of one process and
//! reduce each other's buffers in shared memory.

use crate::barrier::{Abort, Barrier};
use lazytrain_core::collective::Collective;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DType, DeviceMemory, HostData};
use std::sync::{Mutex, MutexGuard};

/// A replica's buffer, published for the others during one all-reduce.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Published {
    address: usize,
    len: usize,
    dtype: DType,
    /// The step the all-reduce belongs to.
    tag: u64,
}

/// Threads of one process reducing in shared memory.
///
/// An all-reduce of `len` elements over `n` replicas: every replica
/// publishes its buffer and meets the others at a barrier; replica `r` then
/// sums slice `r` of every buffer into its own buffer (the reduce-scatter),
/// meets them again, copies the other slices from their owners (the
/// all-gather) and meets them a last time so no buffer is released while
/// another replica still reads it. Each element is summed once, in rank
/// order, so every replica ends with bit-identical values.
pub struct InProcessCollective {
    world_size: usize,
    published: Mutex<Vec<Option<Published>>>,
    /// Each replica's graph hash during an agreement.
    hashes: Mutex<Vec<u64>>,
    /// The address of replica 0's data during a broadcast.
    broadcast_source: Mutex<Option<usize>>,
    /// The barrier inside collectives (run by the replicas' devices).
    barrier: Barrier,
    /// The barrier of `rendezvous` (run by the replicas' own threads): a
    /// separate one, so a host meeting can never complete a generation of a
    /// collective that an asynchronous device is running at the same time.
    meeting: Barrier,
}

impl InProcessCollective {
    /// A group of `world_size` replicas (at least one).
    pub fn new(world_size: usize) -> InProcessCollective {
        let world_size = world_size.max(1);
        InProcessCollective {
            world_size,
            published: Mutex::new(vec![None; world_size]),
            hashes: Mutex::new(vec![0; world_size]),
            broadcast_source: Mutex::new(None),
            barrier: Barrier::new(world_size),
            meeting: Barrier::new(world_size),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<Published>>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn describe(abort: Abort) -> String {
    format!("replica {} stopped the group: {}", abort.rank, abort.message)
}

/// The slice of `len` elements replica `rank` of `n` reduces.
fn slice_of(rank: usize, len: usize, n: usize) -> std::ops::Range<usize> {
    rank * len / n..(rank + 1) * len / n
}

/// Elements the collective can reduce.
trait Reducible: Copy + std::ops::Add<Output = Self> + std::ops::Div<Output = Self> {
    fn from_count(n: usize) -> Self;
}

impl Reducible for f32 {
    fn from_count(n: usize) -> f32 {
        n as f32
    }
}

impl Reducible for f64 {
    fn from_count(n: usize) -> f64 {
        n as f64
    }
}

/// Reduce slice `rank` of every published buffer into replica `rank`'s.
///
/// # Safety
/// Every `published` entry points at a live buffer of `len` elements of `T`
/// that no one else writes in slice `rank` until the next barrier; replica
/// `rank` alone writes its own buffer's slice `rank`.
unsafe fn reduce_slice<T: Reducible>(published: &[Published], rank: usize, op: AllReduceOp) {
    let n = published.len();
    let range = slice_of(rank, published[rank].len, n);
    let own = published[rank].address as *mut T;
    for i in range {
        let mut sum = *(published[0].address as *const T).add(i);
        for p in &published[1..] {
            sum = sum + *(p.address as *const T).add(i);
        }
        *own.add(i) = match op {
            AllReduceOp::Sum => sum,
            AllReduceOp::Mean => sum / T::from_count(n),
        };
    }
}

/// Copy every other replica's reduced slice into replica `rank`'s buffer.
///
/// # Safety
/// As [`reduce_slice`]; after the reduce-scatter's barrier slice `j` of
/// buffer `j` is final and only read.
unsafe fn gather_slices<T: Copy>(published: &[Published], rank: usize) {
    let n = published.len();
    let own = published[rank].address as *mut T;
    for (j, p) in published.iter().enumerate().filter(|(j, _)| *j != rank) {
        let range = slice_of(j, p.len, n);
        std::ptr::copy_nonoverlapping((p.address as *const T).add(range.start), own.add(range.start), range.len());
    }
}

impl Collective for InProcessCollective {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn broadcast(&self, rank: usize, data: &mut DeviceMemory) -> Result<(), String> {
        if self.world_size == 1 {
            return Ok(());
        }
        let Some(host) = data.host_mut() else {
            return Err(
                "the in-process collective broadcasts host memory; this buffer is in a backend's device memory".into(),
            );
        };
        if rank == 0 {
            *self.broadcast_source.lock().unwrap_or_else(|p| p.into_inner()) = Some(host as *const HostData as usize);
        }
        self.barrier.wait().map_err(describe)?;
        let source = *self.broadcast_source.lock().unwrap_or_else(|p| p.into_inner());
        let result = match source {
            // Replica 0 keeps its own data (and compares with itself).
            Some(_) if rank == 0 => Ok(()),
            Some(address) => {
                // SAFETY: replica 0 keeps its data alive and unchanged until
                // the barrier below, which every replica reaches.
                let source = unsafe { &*(address as *const HostData) };
                if (source.dtype(), source.len()) == (host.dtype(), host.len()) {
                    *host = source.clone();
                    Ok(())
                } else {
                    Err(format!(
                        "replicas disagree on a broadcast: {} {} elements here, {} {} on replica 0",
                        host.len(),
                        host.dtype(),
                        source.len(),
                        source.dtype()
                    ))
                }
            }
            None => Err("replica 0 published nothing to broadcast".into()),
        };
        self.barrier.wait_all();
        if rank == 0 {
            self.broadcast_source.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        result
    }

    fn agree_on_graph(&self, rank: usize, hash: u64) -> Result<(), String> {
        if self.world_size == 1 {
            return Ok(());
        }
        self.hashes.lock().unwrap_or_else(|p| p.into_inner())[rank] = hash;
        self.barrier.wait().map_err(describe)?;
        let hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Nobody writes the next agreement's hash before all have read.
        self.barrier.wait_all();
        match lazytrain_core::collective::graph_disagreement(&hashes) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    fn barrier(&self, _rank: usize) -> Result<(), String> {
        self.meeting.wait().map_err(describe)
    }

    fn abort(&self, rank: usize, message: &str) {
        self.barrier.abort(rank, message.to_string());
        self.meeting.abort(rank, message.to_string());
    }

    fn finished(&self, rank: usize) {
        self.abort(
            rank,
            &format!(
                "replica {rank} finished while another replica still waits for it in a collective; \
                 every replica must run the same number of steps"
            ),
        );
    }

    fn abort_reason(&self) -> Option<(usize, String)> {
        self.barrier.aborted().map(|a| (a.rank, a.message.clone()))
    }

    fn all_reduce(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp) -> Result<(), String> {
        self.all_reduce_tagged(rank, data, op, 0)
    }

    fn all_reduce_tagged(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp, tag: u64) -> Result<(), String> {
        if self.world_size == 1 {
            return Ok(());
        }
        let Some(data) = data.host_mut() else {
            let message = "the in-process collective reduces host memory; this buffer is in a backend's device memory"
                .to_string();
            self.abort(rank, &message);
            return Err(message);
        };
        let mine = match data {
            HostData::F32(v) => Published { address: v.as_mut_ptr() as usize, len: v.len(), dtype: DType::F32, tag },
            HostData::F64(v) => Published { address: v.as_mut_ptr() as usize, len: v.len(), dtype: DType::F64, tag },
            other => {
                let message = format!("all_reduce supports f32 and f64 values, not {}", other.dtype());
                self.abort(rank, &message);
                return Err(message);
            }
        };
        self.lock()[rank] = Some(mine);
        self.barrier.wait().map_err(describe)?;
        let published: Vec<Published> = self.lock().iter().map(|p| p.expect("every replica published")).collect();
        // Every replica sees the same list, so they agree on failing too.
        if let Some(other) = published.iter().find(|p| p.tag != mine.tag) {
            let message = format!(
                "replicas disagree on the step of an all_reduce: step {} here, step {} on another replica (one \
                 skipped or repeated a step); every replica must run the same steps",
                mine.tag, other.tag
            );
            self.barrier.wait_all();
            return Err(message);
        }
        if let Some(other) = published.iter().find(|p| p.len != mine.len || p.dtype != mine.dtype) {
            let message = format!(
                "replicas disagree on an all_reduce: {} {} elements here, {} {} elsewhere; every replica must run the same step",
                mine.len, mine.dtype, other.len, other.dtype
            );
            self.barrier.wait_all();
            return Err(message);
        }
        // SAFETY: each replica keeps its buffer alive and unmoved until the
        // last barrier below; between barriers the slices each replica writes
        // are disjoint from the slices the others read.
        unsafe {
            match mine.dtype {
                DType::F64 => reduce_slice::<f64>(&published, rank, op),
                _ => reduce_slice::<f32>(&published, rank, op),
            }
        }
        self.barrier.wait_all();
        unsafe {
            match mine.dtype {
                DType::F64 => gather_slices::<f64>(&published, rank),
                _ => gather_slices::<f32>(&published, rank),
            }
        }
        // No later collective may read this buffer's address.
        self.lock()[rank] = None;
        self.barrier.wait_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce_on_threads(values: Vec<Vec<f32>>, op: AllReduceOp) -> Vec<Result<Vec<f32>, String>> {
        let group = InProcessCollective::new(values.len());
        std::thread::scope(|s| {
            let handles: Vec<_> = values
                .into_iter()
                .enumerate()
                .map(|(rank, v)| {
                    let group = &group;
                    s.spawn(move || {
                        let mut data = DeviceMemory::Host(HostData::F32(v));
                        group.all_reduce(rank, &mut data, op)?;
                        let reduced = data.host().expect("reduced in place").to_f64_vec();
                        Ok(reduced.into_iter().map(|x| x as f32).collect())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn sum_and_mean_over_three_replicas_with_uneven_slices() {
        let values: Vec<Vec<f32>> = (0..3).map(|r| (0..7).map(|i| (10 * r + i) as f32 * 0.5).collect()).collect();
        let sum: Vec<f32> = (0..7).map(|i| values[0][i] + values[1][i] + values[2][i]).collect();
        for result in reduce_on_threads(values.clone(), AllReduceOp::Sum) {
            assert_eq!(result.unwrap(), sum);
        }
        let mean: Vec<f32> = sum.iter().map(|s| s / 3.0).collect();
        for result in reduce_on_threads(values, AllReduceOp::Mean) {
            assert_eq!(result.unwrap(), mean);
        }
    }

    #[test]
    fn fewer_elements_than_replicas_and_empty_buffers() {
        for len in [0, 1, 2] {
            let values: Vec<Vec<f32>> = (0..4).map(|r| vec![r as f32 + 1.0; len]).collect();
            for result in reduce_on_threads(values, AllReduceOp::Sum) {
                assert_eq!(result.unwrap(), vec![10.0; len]);
            }
        }
    }

    #[test]
    fn replicas_that_disagree_on_the_length_all_fail() {
        let results = reduce_on_threads(vec![vec![1.0; 4], vec![1.0; 5]], AllReduceOp::Sum);
        for result in results {
            assert!(result.unwrap_err().contains("replicas disagree"));
        }
    }
}
