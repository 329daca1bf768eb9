//! Shards in a bucket (moto, started here; skipped with a printed reason
//! where it is not installed) read like the same shards on disk: through
//! their index sidecars, without them (scanned once), and in either read
//! mode; a corrupt record is named with its object and offset.

use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::dataset::{find_shard_urls, find_shards, find_split, ShardedDataset};
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::tfrecord::{CorruptPolicy, RecordIndex};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use lazytrain_storage::emulators::{Emulator, EmulatorKind};
use lazytrain_storage::{upload_folder, write, StorageUrl};

fn url(text: &str) -> StorageUrl {
    StorageUrl::parse(text).unwrap()
}

fn every_record(data: &ShardedDataset) -> Vec<Vec<i64>> {
    (0..data.len()).map(|k| data.feature(k, "input_ids").unwrap()).collect()
}

#[test]
fn bucket_shards_read_like_local_ones() {
    let Some(moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-shards");
    moto.register("lt-shards");
    let dir = std::env::temp_dir().join(format!("lazytrain-remote-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let docs = demo_corpus(2, 4, 600).sentences;
    let tok = train_tokenizer(&docs, SubwordModel::WordPiece, 200, TokenizerStyle::Bert).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 3,
        validation_fraction: 0.1,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    prepare(&tok, &docs, &dir, &options).unwrap();
    upload_folder(&dir, &url("s3://lt-shards/data"), &["manifest.json"]).unwrap();
    let local = ShardedDataset::open(&find_shards(&dir, "train").unwrap(), CorruptPolicy::Fail).unwrap();
    let expected = every_record(&local);

    // Through the manifest (read once for the shards and their record
    // count) and the sidecars.
    let split = find_split(&url("s3://lt-shards/data"), "train").unwrap();
    assert_eq!(split.listed_records, Some(expected.len() as u64));
    assert_eq!(
        find_split(&lazytrain_storage::StorageUrl::Local(dir.clone()), "train").unwrap().listed_records,
        split.listed_records
    );
    let shards = split.urls;
    assert_eq!(shards.len(), 3);
    let remote = ShardedDataset::open_urls(&shards, CorruptPolicy::Fail).unwrap();
    remote.prefetch(&[0, 5, 9]);
    assert_eq!(every_record(&remote), expected);
    // A pattern, and shards without sidecars (scanned once).
    for (i, shard) in shards.iter().enumerate() {
        let bytes = lazytrain_storage::read(shard).unwrap();
        write(&url(&format!("s3://lt-shards/bare/train-{i:05}-of-00003.tfrecord")), bytes).unwrap();
    }
    let bare = find_split(&url("s3://lt-shards/bare/train-*.tfrecord"), "train").unwrap();
    assert_eq!((bare.urls.len(), bare.listed_records), (3, None), "a pattern has no manifest");
    let bare = bare.urls;
    assert_eq!(every_record(&ShardedDataset::open_urls(&bare, CorruptPolicy::Fail).unwrap()), expected);

    // A flipped byte in a record's data: named with its object and offset.
    let spans = RecordIndex::scan(&dir.join("train-00001-of-00003.tfrecord"), CorruptPolicy::Fail).unwrap().spans;
    let mut bytes = std::fs::read(dir.join("train-00001-of-00003.tfrecord")).unwrap();
    bytes[spans[1].offset as usize + 14] ^= 0x20;
    write(&url("s3://lt-shards/data/train-00001-of-00003.tfrecord"), bytes).unwrap();
    let corrupt = ShardedDataset::open_urls(&shards, CorruptPolicy::Fail).unwrap();
    let first_of_shard_1 = (0..corrupt.len()).find(|&k| corrupt.feature(k, "input_ids").is_err()).unwrap();
    let msg = corrupt.feature(first_of_shard_1, "input_ids").unwrap_err().to_string();
    assert!(
        msg.contains("s3://lt-shards/data/train-00001-of-00003.tfrecord")
            && msg.contains(&format!("at byte {}", spans[1].offset))
            && msg.contains("checksum"),
        "{msg}"
    );
    let msg = find_shard_urls(&url("s3://lt-shards/missing"), "train").unwrap_err().to_string();
    assert!(msg.contains("s3://lt-shards/missing") && msg.contains("prepare"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
