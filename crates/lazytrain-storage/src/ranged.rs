//! `RangedObject`: random access to a bucket object through ranged GETs of
//! large aligned blocks, kept in a process-wide cache under a memory
//! budget and fetched ahead of the reader on the I/O runtime.

use crate::ops::{head, read_range_async};
use crate::stores::runtime;
use crate::url::StorageUrl;
use crate::{Result, StorageError};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Bytes per ranged GET.
pub const BLOCK_SIZE: u64 = 8 << 20;
/// Blocks fetched ahead of the one being read.
const READ_AHEAD: u64 = 2;

enum BlockState {
    Pending,
    Ready(Bytes),
    Failed(StorageError),
}

struct Block {
    state: Mutex<BlockState>,
    ready: Condvar,
    last_used: AtomicU64,
}

/// The process-wide block cache: at most `budget` bytes of ready blocks
/// (the least recently used go first).
struct BlockCache {
    blocks: Mutex<HashMap<(u64, u64), Arc<Block>>>,
    clock: AtomicU64,
    budget: u64,
}

fn cache() -> &'static BlockCache {
    static CACHE: OnceLock<BlockCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        let mb = std::env::var("LAZYTRAIN_STORAGE_CACHE_MB").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(512);
        BlockCache { blocks: Mutex::default(), clock: AtomicU64::new(0), budget: mb.max(2 * BLOCK_SIZE >> 20) << 20 }
    })
}

impl BlockCache {
    /// The block, fetching it (on the runtime) when absent.
    fn get(&self, object: &RangedObject, index: u64) -> Arc<Block> {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        if let Some(block) = blocks.get(&(object.id, index)) {
            block.last_used.store(tick, Ordering::Relaxed);
            return block.clone();
        }
        self.evict(&mut blocks, 1);
        let block = Arc::new(Block {
            state: Mutex::new(BlockState::Pending),
            ready: Condvar::new(),
            last_used: AtomicU64::new(tick),
        });
        blocks.insert((object.id, index), block.clone());
        drop(blocks);
        let (url, start) = (object.url.clone(), index * BLOCK_SIZE);
        let end = u64::min(start + BLOCK_SIZE, object.size);
        let fetching = block.clone();
        runtime().spawn(async move {
            let state = match read_range_async(&url, start..end).await {
                Ok(bytes) => BlockState::Ready(bytes),
                Err(error) => BlockState::Failed(error),
            };
            *fetching.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
            fetching.ready.notify_all();
            // Blocks in flight cannot be evicted, so the cache may have gone
            // over its budget while this one was fetched: trim it now (a
            // reader waiting for a block holds it, evicted or not).
            let cache = cache();
            cache.evict(&mut cache.blocks.lock().unwrap_or_else(|p| p.into_inner()), 0);
        });
        block
    }

    /// Drop least recently used ready blocks until `room` more fit.
    fn evict(&self, blocks: &mut HashMap<(u64, u64), Arc<Block>>, room: u64) {
        while (blocks.len() as u64 + room) * BLOCK_SIZE > self.budget {
            let oldest = blocks
                .iter()
                .filter(|(_, b)| matches!(*b.state.lock().unwrap_or_else(|p| p.into_inner()), BlockState::Ready(_)))
                .min_by_key(|(_, b)| b.last_used.load(Ordering::Relaxed))
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => blocks.remove(&key),
                None => return,
            };
        }
    }

    fn forget(&self, object: &RangedObject, index: u64) {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).remove(&(object.id, index));
    }
}

/// A bucket object read at arbitrary offsets (see the module docs).
pub struct RangedObject {
    url: StorageUrl,
    size: u64,
    id: u64,
}

impl RangedObject {
    /// Open `url` (one HEAD for its size).
    pub fn open(url: &StorageUrl) -> Result<RangedObject> {
        let info = head(url)?;
        Ok(RangedObject::with_size(url, info.size))
    }

    /// Open `url` whose size is already known.
    pub fn with_size(url: &StorageUrl, size: u64) -> RangedObject {
        static IDS: AtomicU64 = AtomicU64::new(0);
        RangedObject { url: url.clone(), size, id: IDS.fetch_add(1, Ordering::Relaxed) }
    }

    /// The object's URL.
    pub fn url(&self) -> &StorageUrl {
        &self.url
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Fill `buf` from byte `offset`, waiting for the blocks it spans and
    /// starting the fetch of the next ones.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= self.size).ok_or_else(|| {
            StorageError::Other {
                url: self.url.to_string(),
                detail: format!("read of {} bytes at byte {offset} is past the end ({} bytes)", buf.len(), self.size),
            }
        })?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        self.prefetch(last + 1, READ_AHEAD);
        let mut written = 0usize;
        for index in first..=last {
            let block = cache().get(self, index);
            let mut state = block.state.lock().unwrap_or_else(|p| p.into_inner());
            while matches!(*state, BlockState::Pending) {
                state = block.ready.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            let bytes = match &*state {
                BlockState::Ready(bytes) => bytes.clone(),
                BlockState::Failed(error) => {
                    let error = copy_error(error);
                    drop(state);
                    // A later read tries again instead of meeting the same failure.
                    cache().forget(self, index);
                    return Err(error);
                }
                BlockState::Pending => unreachable!("waited until the block left Pending"),
            };
            drop(state);
            let block_start = index * BLOCK_SIZE;
            let from = (offset + written as u64 - block_start) as usize;
            let take = usize::min(bytes.len() - from, buf.len() - written);
            buf[written..written + take].copy_from_slice(&bytes[from..from + take]);
            written += take;
        }
        Ok(())
    }

    /// Start fetching `count` blocks from block `first` (those in the object).
    pub fn prefetch(&self, first: u64, count: u64) {
        let blocks = self.size.div_ceil(BLOCK_SIZE);
        for index in first..u64::min(first + count, blocks) {
            cache().get(self, index);
        }
    }

    /// Start fetching the blocks holding bytes `offset..offset + len`.
    pub fn prefetch_range(&self, offset: u64, len: u64) {
        if len > 0 && offset < self.size {
            let last = (offset + len - 1).min(self.size - 1) / BLOCK_SIZE;
            self.prefetch(offset / BLOCK_SIZE, last - offset / BLOCK_SIZE + 1);
        }
    }
}

fn copy_error(error: &StorageError) -> StorageError {
    match error {
        StorageError::Unavailable { url, at, attempts, detail } => {
            StorageError::Unavailable { url: url.clone(), at: at.clone(), attempts: *attempts, detail: detail.clone() }
        }
        StorageError::NotFound { url, hint } => StorageError::NotFound { url: url.clone(), hint: hint.clone() },
        StorageError::Denied { url, detail } => StorageError::Denied { url: url.clone(), detail: detail.clone() },
        other => StorageError::Other { url: String::new(), detail: other.to_string() },
    }
}
