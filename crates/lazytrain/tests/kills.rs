//! Random kills: a training run SIGKILLed at many moments — in tracing, in
//! steps, inside checkpoint writes and rotation — and restarted each time
//! with the same command (`--resume-from-checkpoint true`) ends with weights
//! bit-identical to an uninterrupted run's.

use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// The one command every attempt runs.
fn train(dir: &Path, out: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lazytrain"));
    cmd.current_dir(dir)
        .args(["train", "--model", "bert-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", out])
        .args(["--max-steps", "24", "--save-steps", "2", "--save-total-limit", "2", "--logging-steps", "1"])
        .args(["--per-device-train-batch-size", "4", "--learning-rate", "1e-3", "--seed", "5"])
        .args(["--resume-from-checkpoint", "true", "--report-to", "jsonl"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn a_run_killed_at_random_moments_ends_bit_identical() {
    let dir = common::tmp("kills", "run");
    let docs = demo_corpus(3, 4, 800).sentences;
    let tok = train_tokenizer(&docs, SubwordModel::WordPiece, 150, TokenizerStyle::Bert).unwrap();
    tok.save(&dir.join("tok"), 512).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 2,
        validation_fraction: 0.0,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    prepare(&tok, &docs, &dir.join("data"), &options).unwrap();

    let start = Instant::now();
    let full = train(&dir, "full").output().unwrap();
    assert!(full.status.success(), "{}", String::from_utf8_lossy(&full.stderr));
    let run_time = start.elapsed();
    let expected = std::fs::read(dir.join("full/model.safetensors")).unwrap();

    // Deterministic "random" moments over the first 80 % of a run, plus
    // deaths inside a checkpoint write and inside a rotation.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut kills = 0;
    let mut injected = Vec::new();
    for attempt in 0..60 {
        if kills >= 10 && injected.len() == 2 {
            break;
        }
        let mut cmd = train(&dir, "killed");
        let fault = match attempt {
            3 => Some("abort-during-save"),
            6 => Some("abort-during-rotation"),
            _ => None,
        };
        if let Some(fault) = fault {
            // The fault needs a save and a rotation still to come: a killed
            // run whose newest checkpoint is the last step's starts over.
            let newest = lazytrain::trainer::checkpoint::latest_checkpoint(&dir.join("killed"));
            if newest.is_some_and(|p| p.ends_with("checkpoint-24")) {
                std::fs::remove_dir_all(dir.join("killed")).unwrap();
            }
            cmd.env("LAZYTRAIN_FAULT_INJECT", fault);
            let out = cmd.output().unwrap();
            if !out.status.success() {
                injected.push(fault);
            }
            continue;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let delay = Duration::from_secs_f64(run_time.as_secs_f64() * 0.8 * (state % 1000) as f64 / 1000.0);
        let mut child = cmd.spawn().unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        let status = child.wait().unwrap();
        if status.success() {
            // It finished before the kill; start the next attempt over so
            // later kills still land in a run.
            std::fs::remove_dir_all(dir.join("killed")).unwrap();
        }
    }
    assert!(kills >= 10, "only {kills} attempts were killed while running");
    assert_eq!(injected, ["abort-during-save", "abort-during-rotation"], "both faults struck");
    let last = train(&dir, "killed").output().unwrap();
    assert!(last.status.success(), "{}", String::from_utf8_lossy(&last.stderr));
    let got = std::fs::read(dir.join("killed/model.safetensors")).unwrap();
    assert!(got == expected, "the final weights differ from the uninterrupted run's");
    let checkpoints = lazytrain::trainer::checkpoint::checkpoints(&dir.join("killed"));
    assert_eq!(checkpoints.len(), 2, "rotation keeps two: {checkpoints:?}");
}

/// A disk that fills up while a checkpoint is written: the run stops with
/// an error naming the intact previous checkpoint, the temporary folder is
/// gone, and the previous checkpoint resumes. Needs a small tmpfs (root);
/// skipped with a printed reason where it cannot be mounted.
#[test]
fn a_full_disk_keeps_the_previous_checkpoint() {
    let dir = common::tmp("kills", "disk");
    let docs = demo_corpus(3, 4, 800).sentences;
    let tok = train_tokenizer(&docs, SubwordModel::WordPiece, 150, TokenizerStyle::Bert).unwrap();
    tok.save(&dir.join("tok"), 512).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 1,
        validation_fraction: 0.0,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    prepare(&tok, &docs, &dir.join("data"), &options).unwrap();
    // One checkpoint of this model is about 6 MB: room for one and a half.
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=9m", "tmpfs"]).arg(&disk).output();
    if !mounted.as_ref().is_ok_and(|m| m.status.success()) {
        let why = mounted.map_or_else(|e| e.to_string(), |m| String::from_utf8_lossy(&m.stderr).trim().to_string());
        eprintln!("skipped: cannot mount a small tmpfs here ({why}); the full-disk path needs root");
        return;
    }
    let out = disk.join("run");
    let run = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .current_dir(&dir)
        .args(["train", "--model", "bert-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir"])
        .arg(&out)
        .args(["--max-steps", "6", "--save-steps", "2", "--per-device-train-batch-size", "4", "--report-to", "none"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    let entries: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let checkpoint = out.join("checkpoint-2");
    let complete =
        checkpoint.join("trainer_state.json").is_file() && checkpoint.join("optimizer.safetensors").is_file();
    // Resume the intact checkpoint from a disk with room.
    let copy = dir.join("copy");
    let copied = Command::new("cp").arg("-r").arg(&out).arg(&copy).status().unwrap().success();
    let _ = Command::new("umount").arg(&disk).status();
    assert!(!run.status.success(), "the run fails on a full disk");
    assert!(err.contains("saving checkpoint-4 failed") && err.contains("No space left"), "{err}");
    assert!(err.contains("checkpoint-2 is intact"), "{err}");
    assert!(!entries.iter().any(|e| e.contains(".tmp-")), "the temporary folder is removed: {entries:?}");
    assert!(complete && copied, "checkpoint-2 is complete");
    let resumed = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .current_dir(&dir)
        .args(["train", "--model", "bert-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir"])
        .arg(&copy)
        .args(["--max-steps", "6", "--save-steps", "2", "--per-device-train-batch-size", "4", "--report-to", "none"])
        .args(["--resume-from-checkpoint", "true"])
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
}
