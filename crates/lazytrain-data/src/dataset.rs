//! Reading prepared shards: random access to every record, per-epoch
//! seeded shuffles, disjoint per-replica shares, and O(1) seeking.

use crate::example::decode_int64_example;
use crate::tfrecord::{index_path, CorruptPolicy, LocalShard, RecordIndex, RemoteShard, ShardSource};
use crate::{DataError, Result};
use lazytrain_storage::{RangedObject, ReadMode, StorageError, StorageUrl};
use std::path::{Path, PathBuf};

/// The shard files matching `spec`: a directory (its `{split}-*.tfrecord`
/// files), a file name pattern with `*` in the last component, or a file.
pub fn find_shards(spec: &Path, split: &str) -> Result<Vec<PathBuf>> {
    let (dir, pattern) = if spec.is_dir() {
        (spec.to_path_buf(), format!("{split}-*.tfrecord"))
    } else if spec.to_string_lossy().contains('*') {
        let dir = spec.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        (dir, spec.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
    } else {
        return if spec.is_file() {
            Ok(vec![spec.to_path_buf()])
        } else {
            Err(DataError::Io { path: spec.display().to_string(), detail: "no such shard file or folder".into() })
        };
    };
    let (prefix, suffix) = pattern.split_once('*').unwrap_or((pattern.as_str(), ""));
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| DataError::Io { path: dir.display().to_string(), detail: e.to_string() })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with(prefix) && name.ends_with(suffix) && name.len() >= prefix.len() + suffix.len()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DataError::Io {
            path: dir.join(&pattern).display().to_string(),
            detail: "no shards match; run `lazytrain prepare` or check the path".into(),
        });
    }
    if spec.is_dir() {
        check_one_preparation(&dir, split, &files)?;
    }
    Ok(files)
}

/// A split's shards, and the records the folder's manifest lists for them
/// (`prepare` and `prepare-classification` both count them per shard).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitShards {
    /// The shard files or objects, in order.
    pub urls: Vec<StorageUrl>,
    /// The manifest's record count for the split; `None` for a single shard
    /// or a pattern, which have no manifest (nor an older one without counts).
    pub listed_records: Option<u64>,
}

/// The shards matching `spec` (see [`find_shard_urls`]) with the manifest's
/// record count, reading a bucket prefix's `manifest.json` once for both.
pub fn find_split(spec: &StorageUrl, split: &str) -> Result<SplitShards> {
    let text = spec.to_string();
    match spec {
        StorageUrl::Local(path) => {
            let urls = find_shards(path, split)?.into_iter().map(StorageUrl::Local).collect();
            let manifest = if path.is_dir() { read_manifest_value(spec)? } else { None };
            Ok(SplitShards { urls, listed_records: manifest.and_then(|m| listed_records(&m, split)) })
        }
        StorageUrl::Remote { .. } if text.contains(['*', '?']) => {
            let urls = lazytrain_storage::glob(spec)?;
            if urls.is_empty() {
                return Err(DataError::Io { path: text, detail: "no shards match; check the pattern".into() });
            }
            Ok(SplitShards { urls, listed_records: None })
        }
        StorageUrl::Remote { .. } => match read_manifest_value(spec)? {
            Some(manifest) => {
                let urls: Vec<StorageUrl> = manifest[split]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|shard| shard["file"].as_str().map(|file| spec.join(file)))
                    .collect();
                if urls.is_empty() {
                    return Err(DataError::Io {
                        path: text,
                        detail: format!(
                            "the manifest lists no {split} shards; run `lazytrain prepare` with this output"
                        ),
                    });
                }
                Ok(SplitShards { urls, listed_records: listed_records(&manifest, split) })
            }
            None if lazytrain_storage::exists(spec)? => {
                Ok(SplitShards { urls: vec![spec.clone()], listed_records: None })
            }
            None => Err(DataError::Io {
                path: text,
                detail: "neither a prepared folder (no manifest.json) nor a shard object; run `lazytrain prepare \
                         --output` with this URL or check it"
                    .into(),
            }),
        },
    }
}

/// The shards matching `spec`, a local path (see [`find_shards`]) or a
/// bucket URL: a prepared prefix (the shards its `manifest.json` lists, so
/// no listing is needed), a pattern with `*`/`?` (`gs://b/data/train-*`),
/// or one object.
pub fn find_shard_urls(spec: &StorageUrl, split: &str) -> Result<Vec<StorageUrl>> {
    Ok(find_split(spec, split)?.urls)
}

/// The parsed `manifest.json` of the folder or prefix `spec`; `None` when
/// it has none.
fn read_manifest_value(spec: &StorageUrl) -> Result<Option<serde_json::Value>> {
    let manifest = spec.join("manifest.json");
    let bytes = match lazytrain_storage::read(&manifest) {
        Ok(bytes) => bytes,
        Err(StorageError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| DataError::Io { path: manifest.to_string(), detail: format!("{e} (is the file damaged?)") })
}

/// The records `manifest` lists for `split`, summed over its shards.
fn listed_records(manifest: &serde_json::Value, split: &str) -> Option<u64> {
    let shards = manifest[split].as_array()?;
    Some(shards.iter().filter_map(|s| s["records"].as_u64()).sum())
}

/// A folder's `{split}-{i}-of-{n}` shards must be exactly one preparation's
/// `0..n` (a missing shard, or leftovers of a run with another shard count,
/// would silently train on the wrong data).
fn check_one_preparation(dir: &Path, split: &str, files: &[PathBuf]) -> Result<()> {
    let name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let positions: Option<Vec<(usize, usize)>> =
        files.iter().map(|p| crate::prepare::shard_position(&name(p), split)).collect();
    let Some(positions) = positions else { return Ok(()) };
    let n = positions[0].1;
    let complete = positions.len() == n && positions.iter().enumerate().all(|(k, &(i, of))| i == k && of == n);
    if complete {
        return Ok(());
    }
    let names: Vec<String> = files.iter().map(name).collect();
    Err(DataError::Io {
        path: dir.display().to_string(),
        detail: format!(
            "the {split} shards are not one complete set of {n} ({}); run `lazytrain prepare` again into this folder \
             (it replaces earlier shards) or into an empty one",
            names.join(", ")
        ),
    })
}

struct Shard {
    index: RecordIndex,
    source: Box<dyn ShardSource>,
}

/// Every record of a set of shards, addressable by a global index.
pub struct ShardedDataset {
    shards: Vec<Shard>,
    starts: Vec<usize>,
    len: usize,
    skipped: u64,
    unframed_bytes: u64,
    /// Some shards are bucket objects (reads are worth fetching ahead).
    remote: bool,
}

impl ShardedDataset {
    /// Index the local `files` (reading every record header).
    pub fn open(files: &[PathBuf], policy: CorruptPolicy) -> Result<ShardedDataset> {
        let urls: Vec<StorageUrl> = files.iter().cloned().map(StorageUrl::Local).collect();
        ShardedDataset::open_urls(&urls, policy)
    }

    /// Index local files or bucket objects. A local file's headers are all
    /// read now; a bucket object is indexed from its `.idx` sidecar (written
    /// by `prepare`) without reading the records — or, without a sidecar,
    /// scanned through the block cache — and its records' CRCs are checked
    /// as they are read.
    pub fn open_urls(urls: &[StorageUrl], policy: CorruptPolicy) -> Result<ShardedDataset> {
        let mut shards = Vec::with_capacity(urls.len());
        let mut starts = Vec::with_capacity(urls.len());
        let mut len = 0;
        let (mut skipped, mut unframed_bytes) = (0, 0);
        let mut objects = urls
            .iter()
            .map(|url| url.is_remote().then(|| RangedObject::open(url)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let remote_bytes = objects.iter().flatten().map(RangedObject::size).fold(0u64, u64::saturating_add);
        let mode = read_mode(remote_bytes);
        for (url, object) in urls.iter().zip(&mut objects) {
            let (index, source) = match (url, object.take()) {
                (StorageUrl::Local(path), _) => {
                    let source = LocalShard::open(path)?;
                    (RecordIndex::scan_source(&source, policy)?, Box::new(source) as Box<dyn ShardSource>)
                }
                (StorageUrl::Remote { .. }, object) => {
                    let source = RemoteShard(object.expect("opened above").with_mode(mode));
                    (remote_index(&source, url, policy)?, Box::new(source) as Box<dyn ShardSource>)
                }
            };
            starts.push(len);
            len += index.spans.len();
            skipped += index.skipped;
            unframed_bytes += index.unframed_bytes;
            shards.push(Shard { index, source });
        }
        let remote = urls.iter().any(StorageUrl::is_remote);
        Ok(ShardedDataset { shards, starts, len, skipped, unframed_bytes, remote })
    }

    /// Records in all shards.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records skipped as corrupt while indexing.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Bytes lost after corrupt record headers while indexing (the records
    /// in them cannot be framed; see [`RecordIndex::unframed_bytes`]).
    pub fn unframed_bytes(&self) -> u64 {
        self.unframed_bytes
    }

    /// The int64 feature `name` of record `k` (global index).
    pub fn feature(&self, k: usize, name: &str) -> Result<Vec<i64>> {
        Ok(self.features(k, &[name])?.pop().unwrap_or_default())
    }

    /// The int64 features `names` of record `k`, in that order (one read).
    pub fn features(&self, k: usize, names: &[&str]) -> Result<Vec<Vec<i64>>> {
        let (s, local) = self.locate(k);
        let bytes = s.index.read_from(s.source.as_ref(), local)?;
        let mut decoded = decode_int64_example(&bytes)?;
        names
            .iter()
            .map(|name| {
                let at = decoded.iter().position(|(n, _)| n == name).ok_or_else(|| {
                    DataError::Invalid(format!("record {k} of {} has no feature `{name}`", s.index.name))
                })?;
                Ok(std::mem::take(&mut decoded[at].1))
            })
            .collect()
    }

    /// True when some shards are bucket objects, whose records are worth
    /// [`prefetch`](Self::prefetch)ing.
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// Start fetching `records` (global indices) from bucket shards, ahead
    /// of reading them; nothing for local files.
    pub fn prefetch(&self, records: &[usize]) {
        for &k in records.iter().filter(|&&k| k < self.len) {
            let (s, local) = self.locate(k);
            s.index.prefetch(s.source.as_ref(), local);
        }
    }

    fn locate(&self, k: usize) -> (&Shard, usize) {
        let shard = self.starts.partition_point(|&s| s <= k).saturating_sub(1);
        (&self.shards[shard], k - self.starts[shard])
    }
}

/// Blocks while the bucket shards fit the block cache (each block is then
/// fetched once); beyond it, records are read in random order, so a block
/// would be fetched for one record and evicted: fetch exactly each record.
fn read_mode(remote_bytes: u64) -> ReadMode {
    let budget = lazytrain_storage::block_cache_budget();
    if remote_bytes <= budget {
        return ReadMode::Blocks;
    }
    eprintln!(
        "note: the bucket shards ({:.0} MB) exceed the block cache ({:.0} MB): each record is fetched with its own \
         ranged GET, ahead of the loader; raise LAZYTRAIN_STORAGE_CACHE_MB to cache them in 8 MiB blocks",
        remote_bytes as f64 / 1e6,
        budget as f64 / 1e6
    );
    ReadMode::Exact
}

/// The index of a bucket shard: from its sidecar when there is one, else
/// by scanning it (every block read once, then cached).
fn remote_index(source: &RemoteShard, url: &StorageUrl, policy: CorruptPolicy) -> Result<RecordIndex> {
    let StorageUrl::Remote { cloud, bucket, key } = url else { unreachable!("called for bucket URLs") };
    let sidecar = StorageUrl::Remote {
        cloud: *cloud,
        bucket: bucket.clone(),
        key: index_path(Path::new(key)).to_string_lossy().into_owned(),
    };
    match lazytrain_storage::read(&sidecar) {
        Ok(bytes) => RecordIndex::from_sidecar(source, &sidecar.to_string(), &String::from_utf8_lossy(&bytes)),
        Err(StorageError::NotFound { .. }) => {
            eprintln!("note: {url} has no index sidecar ({sidecar}); scanning it once");
            // Sequentially, in cached blocks, whatever mode the reads use.
            let scanner = RemoteShard(RangedObject::with_size(url, source.size()));
            RecordIndex::scan_source(&scanner, policy)
        }
        Err(e) => Err(e.into()),
    }
}

/// Which records one replica visits, epoch by epoch.
///
/// Epoch `e` visits a permutation of all records drawn from `(seed, e)`
/// (or the identity without shuffling). Replica `r` of `n` takes positions
/// `r, r + n, r + 2n, ...` of it, and every replica gets
/// `floor(len / n)` samples, so replicas take equally many batches and their
/// shares are disjoint. Seeking to sample `k` of epoch `e` is one lookup.
#[derive(Clone, Debug)]
pub struct EpochSampler {
    len: usize,
    seed: u64,
    shuffle: bool,
    replica: usize,
    num_replicas: usize,
    epoch: Option<(u64, Vec<u32>)>,
}

impl EpochSampler {
    /// A sampler over `len` records for replica `replica` of `num_replicas`.
    pub fn new(len: usize, seed: u64, shuffle: bool, replica: usize, num_replicas: usize) -> Result<EpochSampler> {
        if num_replicas == 0 || replica >= num_replicas {
            return Err(DataError::Invalid(format!("replica {replica} of {num_replicas} does not exist")));
        }
        if len < num_replicas {
            return Err(DataError::Invalid(format!("{len} records cannot feed {num_replicas} replicas")));
        }
        if u32::try_from(len).is_err() {
            return Err(DataError::Invalid(format!(
                "{len} records are more than one epoch's order holds ({}); train on fewer shards at a time",
                u32::MAX
            )));
        }
        Ok(EpochSampler { len, seed, shuffle, replica, num_replicas, epoch: None })
    }

    /// Samples this replica sees per epoch.
    pub fn samples_per_epoch(&self) -> usize {
        self.len / self.num_replicas
    }

    fn permutation(&mut self, epoch: u64) -> &[u32] {
        if self.epoch.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let mut order: Vec<u32> = (0..self.len as u32).collect();
            if self.shuffle {
                let mut u = vec![0f32; self.len];
                lazytrain_core::random::uniform_f32(self.seed, 0xe90c_0000u64.wrapping_add(epoch), &mut u);
                for i in (1..self.len).rev() {
                    let j = ((u[i] as f64) * (i + 1) as f64) as usize;
                    order.swap(i, j.min(i));
                }
            }
            self.epoch = Some((epoch, order));
        }
        &self.epoch.as_ref().expect("just set").1
    }

    /// The global record index of this replica's sample `k` in `epoch`.
    pub fn record(&mut self, epoch: u64, k: usize) -> usize {
        let (r, n) = (self.replica, self.num_replicas);
        self.permutation(epoch)[r + k * n] as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More records than an epoch's order of `u32`s holds: refused by name
    /// (they were truncated into out-of-range indices).
    #[test]
    fn more_records_than_an_order_holds_are_refused() {
        let msg = EpochSampler::new(1 << 33, 7, true, 0, 1).err().unwrap().to_string();
        assert!(msg.contains("8589934592 records are more than one epoch's order holds"), "{msg}");
        assert!(EpochSampler::new(u32::MAX as usize, 7, true, 0, 1).is_ok());
    }

    #[test]
    fn replicas_split_an_epoch_disjointly() {
        let n = 103;
        let mut seen = Vec::new();
        for r in 0..4 {
            let mut s = EpochSampler::new(n, 7, true, r, 4).unwrap();
            assert_eq!(s.samples_per_epoch(), 25);
            seen.extend((0..25).map(|k| s.record(2, k)));
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 100, "no overlap, 3 records dropped");
        let mut a = EpochSampler::new(n, 7, true, 0, 1).unwrap();
        let first: Vec<usize> = (0..n).map(|k| a.record(0, k)).collect();
        let second: Vec<usize> = (0..n).map(|k| a.record(1, k)).collect();
        assert_ne!(first, second, "each epoch is shuffled anew");
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
}
