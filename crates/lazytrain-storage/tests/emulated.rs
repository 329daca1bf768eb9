//! The storage layer against real-protocol emulators (moto for S3,
//! gcp-storage-emulator for GCS), started here; skipped with a printed
//! reason where they are not installed.

use lazytrain_storage::emulators::{Emulator, EmulatorKind};
use lazytrain_storage::{
    exists, fetch_folder, glob, head, list, read, storage_metrics, write, RangedObject, ReadMode, StorageError,
    StorageUrl, BLOCK_SIZE,
};

/// The storage counters are process-wide: the tests that compare them run
/// one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn url(text: &str) -> StorageUrl {
    StorageUrl::parse(text).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed as u64) as u8).collect()
}

/// Three blocks and a bit: reads inside one block, across a boundary, at the end.
fn big() -> Vec<u8> {
    pattern(3 * BLOCK_SIZE as usize + 12345, 7)
}

fn round_trips(scheme: &str, bucket: &str) {
    let small = pattern(1000, 1);
    write(&url(&format!("{scheme}://{bucket}/texts/a.txt")), small.clone()).unwrap();
    write(&url(&format!("{scheme}://{bucket}/texts/b.txt")), b"bee".to_vec()).unwrap();
    write(&url(&format!("{scheme}://{bucket}/texts/sub/c.txt")), b"sea".to_vec()).unwrap();
    assert_eq!(read(&url(&format!("{scheme}://{bucket}/texts/a.txt"))).unwrap(), small);
    let names: Vec<String> =
        list(&url(&format!("{scheme}://{bucket}/texts"))).unwrap().iter().map(|o| o.url.to_string()).collect();
    assert_eq!(
        names,
        [
            format!("{scheme}://{bucket}/texts/a.txt"),
            format!("{scheme}://{bucket}/texts/b.txt"),
            format!("{scheme}://{bucket}/texts/sub/c.txt")
        ]
    );
    let matched: Vec<String> =
        glob(&url(&format!("{scheme}://{bucket}/texts/*.txt"))).unwrap().iter().map(ToString::to_string).collect();
    assert_eq!(matched, [format!("{scheme}://{bucket}/texts/a.txt"), format!("{scheme}://{bucket}/texts/b.txt")]);
    let missing = url(&format!("{scheme}://{bucket}/texts/none.txt"));
    assert!(!exists(&missing).unwrap());
    let err = read(&missing).unwrap_err();
    assert!(matches!(err, StorageError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("texts/none.txt"), "{err}");
}

/// Reads of `{scheme}://{bucket}/big.bin`, which holds `big()`.
fn ranged_reads(scheme: &str, bucket: &str) {
    let data = big();
    let size = data.len();
    let object = url(&format!("{scheme}://{bucket}/big.bin"));
    assert_eq!(head(&object).unwrap().size, size as u64);
    let ranged = RangedObject::open(&object).unwrap();
    let before = storage_metrics();
    for (offset, len) in [(5usize, 100usize), (BLOCK_SIZE as usize - 10, 20), (size - 7, 7), (0, size)] {
        let mut buf = vec![0u8; len];
        ranged.read_at(offset as u64, &mut buf).unwrap();
        assert!(buf == data[offset..offset + len], "bytes {offset}..{}", offset + len);
    }
    let after = storage_metrics();
    // Four blocks in all, each fetched once however often it is read.
    assert_eq!(after.bytes_read - before.bytes_read, size as u64);
    // Exact reads: one GET per read (or per prefetch, taken by the read of that range).
    let exact = RangedObject::open(&object).unwrap().with_mode(ReadMode::Exact);
    let before = storage_metrics();
    exact.prefetch_range(BLOCK_SIZE - 10, 20);
    for (offset, len) in [(BLOCK_SIZE as usize - 10, 20usize), (size - 7, 7)] {
        let mut buf = vec![0u8; len];
        exact.read_at(offset as u64, &mut buf).unwrap();
        assert!(buf == data[offset..offset + len], "exact bytes {offset}..{}", offset + len);
    }
    // Two GETs of exactly 20 and 7 bytes: the read of the prefetched range took the prefetch's.
    let after = storage_metrics();
    assert_eq!((after.requests - before.requests, after.bytes_read - before.bytes_read), (2, 27));
    let mut past = [0u8; 8];
    assert!(ranged.read_at(size as u64 - 4, &mut past).unwrap_err().to_string().contains("past the end"));
}

#[test]
fn s3_through_moto() {
    let _serial = serial();
    let Some(moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-storage");
    moto.register("lt-storage");
    round_trips("s3", "lt-storage");
    // Folders and single objects fetched into the cache: direct children only.
    let cache = lazytrain_core::ScratchDir::new("storage-cache").unwrap();
    std::env::set_var("LAZYTRAIN_CACHE", &*cache);
    let folder = fetch_folder(&url("s3://lt-storage/texts")).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, [".lazytrain-source", "a.txt", "b.txt"]);
    let file = fetch_folder(&url("s3://lt-storage/texts/b.txt")).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"bee");
    let missing = fetch_folder(&url("s3://lt-storage/nothing")).unwrap_err().to_string();
    assert!(missing.contains("s3://lt-storage/nothing") && missing.contains("folder"), "{missing}");
    // Above MULTIPART_THRESHOLD: a multipart upload.
    write(&url("s3://lt-storage/big.bin"), big()).unwrap();
    ranged_reads("s3", "lt-storage");
}

#[test]
fn gcs_through_its_emulator() {
    let _serial = serial();
    let Some(gcs) = Emulator::start(EmulatorKind::Gcs) else { return };
    gcs.create_bucket("ltgcs");
    gcs.register("ltgcs");
    // Seeded through the JSON API, read back through object_store's XML API.
    gcs.seed("ltgcs", "seeded/one.txt", b"one");
    assert_eq!(read(&url("gs://ltgcs/seeded/one.txt")).unwrap(), b"one");
    round_trips("gs", "ltgcs");
    // Multipart uploads (XML `POST ?uploads`) are beyond the emulator: the
    // big object goes in through the JSON API (S3 covers multipart).
    gcs.seed("ltgcs", "big.bin", &big());
    ranged_reads("gs", "ltgcs");
}

#[test]
fn a_stopped_store_is_retried_then_named() {
    let _serial = serial();
    let Some(mut moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-gone");
    moto.register("lt-gone");
    let object = url("s3://lt-gone/shard.bin");
    write(&object, pattern(4096, 3)).unwrap();
    let ranged = RangedObject::open(&object).unwrap();
    moto.stop();
    std::env::set_var("LAZYTRAIN_STORAGE_ATTEMPTS", "3");
    let before = storage_metrics().retries;
    let mut buf = [0u8; 16];
    let err = ranged.read_at(100, &mut buf).unwrap_err();
    assert!(matches!(err, StorageError::Unavailable { attempts: 3, .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("s3://lt-gone/shard.bin at byte 0"), "{text}");
    assert!(storage_metrics().retries >= before + 2);
}

/// An object overwritten with a shorter one after it was opened: the store
/// clamps each range to the new size, so a read whose range reaches past
/// the new end (every read of a block-mode object whose first block was the
/// whole old object; an exact read across or past the end) is an error
/// naming the object, never a panic or short data. (An exact read inside
/// the new extent gets the new bytes: only the length tells them apart.)
#[test]
fn an_object_cut_short_after_opening_is_an_error() {
    let _serial = serial();
    let Some(moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-cut");
    moto.register("lt-cut");
    let object = url("s3://lt-cut/shard.bin");
    write(&object, pattern(4096, 5)).unwrap();
    let blocks = RangedObject::open(&object).unwrap();
    let exact = RangedObject::open(&object).unwrap().with_mode(ReadMode::Exact);
    write(&object, pattern(3000, 6)).unwrap();
    // Inside the new extent, across its end, and wholly past it.
    for (offset, len) in [(100u64, 200usize), (2900, 200), (3500, 100)] {
        let mut buf = vec![0u8; len];
        let err = blocks.read_at(offset, &mut buf).unwrap_err().to_string();
        assert!(err.contains("s3://lt-cut/shard.bin") && err.contains("changed since it was opened"), "{err}");
    }
    let mut across = vec![0u8; 200];
    let err = exact.read_at(2900, &mut across).unwrap_err().to_string();
    assert!(err.contains("s3://lt-cut/shard.bin") && err.contains("got 100"), "{err}");
    let mut past = vec![0u8; 100];
    assert!(exact.read_at(3500, &mut past).unwrap_err().to_string().contains("s3://lt-cut/shard.bin"));
}
