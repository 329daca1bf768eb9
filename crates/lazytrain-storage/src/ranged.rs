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
        BlockCache { blocks: Mutex::default(), clock: AtomicU64::new(0), budget: mb.max((2 * BLOCK_SIZE) >> 20) << 20 }
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
        let start = index * BLOCK_SIZE;
        let block = fetch(object.url.clone(), start, u64::min(start + BLOCK_SIZE, object.size));
        block.last_used.store(tick, Ordering::Relaxed);
        blocks.insert((object.id, index), block.clone());
        block
    }

    /// Trim the cache after a fetch completed: blocks in flight cannot be
    /// evicted, so it may have gone over its budget meanwhile (a reader
    /// waiting for an evicted block still holds it).
    fn trim(&self) {
        self.evict(&mut self.blocks.lock().unwrap_or_else(|p| p.into_inner()), 0);
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

/// How a [`RangedObject`] fetches what is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Aligned 8 MiB blocks through the shared cache: for data that fits
    /// the cache (every block is fetched once).
    Blocks,
    /// Exactly the bytes asked for, one ranged GET per read (or per
    /// prefetch): for data much larger than the cache, read in random
    /// order, where a block would be fetched for one record and evicted.
    Exact,
}

/// The block cache's budget in bytes (`LAZYTRAIN_STORAGE_CACHE_MB`, default 512).
pub fn block_cache_budget() -> u64 {
    cache().budget
}

/// A bucket object read at arbitrary offsets (see the module docs).
pub struct RangedObject {
    url: StorageUrl,
    size: u64,
    id: u64,
    mode: ReadMode,
    /// [`ReadMode::Exact`]: ranges fetched ahead, taken by the read of exactly that range.
    ahead: Mutex<HashMap<(u64, u64), Arc<Block>>>,
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
        RangedObject {
            url: url.clone(),
            size,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            mode: ReadMode::Blocks,
            ahead: Mutex::default(),
        }
    }

    /// This object read in `mode`.
    pub fn with_mode(mut self, mode: ReadMode) -> RangedObject {
        self.mode = mode;
        self
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
        if self.mode == ReadMode::Exact {
            let fetched = self.ahead.lock().unwrap_or_else(|p| p.into_inner()).remove(&(offset, buf.len() as u64));
            let block = fetched.unwrap_or_else(|| fetch(self.url.clone(), offset, end));
            let bytes = wait(&block)?;
            buf.copy_from_slice(&bytes);
            return Ok(());
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        self.prefetch(last + 1, READ_AHEAD);
        let mut written = 0usize;
        for index in first..=last {
            let block = cache().get(self, index);
            let bytes = match wait(&block) {
                Ok(bytes) => bytes,
                Err(error) => {
                    // A later read tries again instead of meeting the same failure.
                    cache().forget(self, index);
                    return Err(error);
                }
            };
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

    /// Start fetching bytes `offset..offset + len` (the blocks holding
    /// them, or in [`ReadMode::Exact`] that range, for a read of it).
    pub fn prefetch_range(&self, offset: u64, len: u64) {
        if self.mode == ReadMode::Exact {
            if len > 0 && offset.checked_add(len).is_some_and(|end| end <= self.size) {
                let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
                ahead.entry((offset, len)).or_insert_with(|| fetch(self.url.clone(), offset, offset + len));
            }
            return;
        }
        if len > 0 && offset < self.size {
            let last = (offset + len - 1).min(self.size - 1) / BLOCK_SIZE;
            self.prefetch(offset / BLOCK_SIZE, last - offset / BLOCK_SIZE + 1);
        }
    }
}

/// Start fetching `start..end` of `url` on the I/O runtime.
fn fetch(url: StorageUrl, start: u64, end: u64) -> Arc<Block> {
    let block =
        Arc::new(Block { state: Mutex::new(BlockState::Pending), ready: Condvar::new(), last_used: AtomicU64::new(0) });
    let fetching = block.clone();
    runtime().spawn(async move {
        let state = match read_range_async(&url, start..end).await {
            Ok(bytes) if bytes.len() as u64 == end - start => BlockState::Ready(bytes),
            // A store clamps a range to the object's current size: an
            // object cut short since it was opened answers with fewer bytes.
            Ok(bytes) => BlockState::Failed(StorageError::Other {
                url: url.to_string(),
                detail: format!(
                    "asked for bytes {start}..{end}, got {}: the object changed since it was opened \
                     (overwritten while this run reads it?); start the run again once it is final",
                    bytes.len()
                ),
            }),
            Err(error) => BlockState::Failed(error),
        };
        *fetching.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        fetching.ready.notify_all();
        cache().trim();
    });
    block
}

/// The bytes of `block` once fetched, or the fetch's error.
fn wait(block: &Block) -> Result<Bytes> {
    let mut state = block.state.lock().unwrap_or_else(|p| p.into_inner());
    while matches!(*state, BlockState::Pending) {
        state = block.ready.wait(state).unwrap_or_else(|p| p.into_inner());
    }
    match &*state {
        BlockState::Ready(bytes) => Ok(bytes.clone()),
        BlockState::Failed(error) => Err(error.clone()),
        BlockState::Pending => unreachable!("waited until the block left Pending"),
    }
}
