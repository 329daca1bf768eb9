//! Data and checkpoints in buckets, end to end through the CLI, against
//! real-protocol emulators started here (moto for S3, gcp-storage-emulator
//! for GCS; skipped with a printed reason where they are not installed):
//! prepare into a bucket, train from it, push checkpoints, resume on an
//! empty machine from the newest remote checkpoint, and load a pushed
//! model into a pipeline.

use lazytrain::trainer::push::{fetch_resume_checkpoint, remote_checkpoints};
use lazytrain::trainer::TrainingArguments;
use lazytrain_data::corpus::demo_corpus;
use lazytrain_storage::emulators::{Emulator, EmulatorKind};
use lazytrain_storage::{list, read, write, StorageUrl};
use std::path::Path;
use std::process::{Command, Output};

mod common;

fn url(text: &str) -> StorageUrl {
    StorageUrl::parse(text).unwrap()
}

fn lazytrain(dir: &Path, emulator: &Emulator, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lazytrain"));
    cmd.current_dir(dir).args(args).envs(emulator.env()).env("LAZYTRAIN_CACHE", dir.join("cache"));
    cmd.output().unwrap()
}

fn ok(out: Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    text
}

/// Flags of every training run here: a constant learning rate, so a run cut
/// at step 4 and resumed to 8 is the 8-step run.
const TRAIN: &[&str] = &[
    "train",
    "--model",
    "bert-tiny",
    "--tokenizer",
    "s3://lt-run/tok",
    "--save-steps",
    "2",
    "--save-total-limit",
    "2",
    "--logging-steps",
    "1",
    "--per-device-train-batch-size",
    "4",
    "--learning-rate",
    "1e-3",
    "--seed",
    "5",
    "--lr-scheduler-type",
    "constant",
    "--report-to",
    "none",
];

fn train(dir: &Path, emulator: &Emulator, extra: &[&str]) -> Output {
    let args: Vec<&str> = TRAIN.iter().chain(extra).copied().collect();
    lazytrain(dir, emulator, &args)
}

/// A run on the bucket data into `output_dir`, pushing to `push_to`.
fn bucket_run(dir: &Path, moto: &Emulator, output_dir: &str, steps: &str, push_to: &str, extra: &[&str]) -> String {
    let mut args = vec!["--train-data", "s3://lt-run/data", "--output-dir", output_dir, "--max-steps", steps];
    args.extend(["--push-to", push_to]);
    args.extend(extra);
    ok(train(dir, moto, &args))
}

/// The steps of the complete checkpoints under `push_to`.
fn remote_steps(push_to: &str) -> Vec<u64> {
    remote_checkpoints(&url(push_to)).unwrap().iter().map(|c| c.0).collect()
}

#[test]
fn prepare_train_push_and_resume_through_s3() {
    let Some(moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-run");
    moto.register("lt-run");
    let dir = common::tmp("buckets", "s3");
    let docs = demo_corpus(3, 4, 800).sentences;
    for (i, part) in docs.chunks(400).enumerate() {
        write(&url(&format!("s3://lt-run/texts/part-{i}.txt")), part.join("\n").into_bytes()).unwrap();
    }
    write(&url("s3://lt-run/texts/notes.md"), b"not matched by the glob".to_vec()).unwrap();

    ok(lazytrain(
        &dir,
        &moto,
        &[
            "train-tokenizer",
            "--files",
            "s3://lt-run/texts/*.txt",
            "--model",
            "wordpiece",
            "--vocab-size",
            "150",
            "--output",
            "s3://lt-run/tok",
        ],
    ));
    // A bad input in the bucket is named by its URL, not by the local copy
    // it was read from.
    write(&url("s3://lt-run/bad/garbled.txt"), b"fine\n\xff\xfe\n".to_vec()).unwrap();
    let args = ["prepare", "--tokenizer", "s3://lt-run/tok", "--files", "s3://lt-run/bad/garbled.txt", "--output", "x"];
    let bad = lazytrain(&dir, &moto, &args);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("s3://lt-run/bad/garbled.txt: line 2: invalid UTF-8"), "{err}");
    let prepare = |output: &str| {
        ok(lazytrain(
            &dir,
            &moto,
            &[
                "prepare",
                "--tokenizer",
                "s3://lt-run/tok",
                "--files",
                "s3://lt-run/texts/*.txt",
                "--block-size",
                "16",
                "--num-shards",
                "2",
                "--validation-fraction",
                "0",
                "--output",
                output,
            ],
        ))
    };
    prepare("s3://lt-run/data");
    prepare("local-data");
    // The bucket holds what the local folder holds, byte for byte (shards,
    // their index sidecars, the manifest).
    for entry in std::fs::read_dir(dir.join("local-data")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let remote = read(&url(&format!("s3://lt-run/data/{name}"))).unwrap();
        assert!(remote == std::fs::read(&path).unwrap(), "{name} differs");
    }

    // The uninterrupted reference: local data, no bucket.
    ok(train(&dir, &moto, &["--train-data", "local-data", "--output-dir", "full", "--max-steps", "8"]));
    let expected = std::fs::read(dir.join("full/model.safetensors")).unwrap();

    // A run on bucket data that pushes every save, cut at step 4 (the VM is
    // preempted: its disk is gone).
    bucket_run(&dir, &moto, "first-vm", "4", "s3://lt-run/run", &["--hub-strategy", "every_save"]);
    std::fs::remove_dir_all(dir.join("first-vm")).unwrap();
    assert_eq!(remote_steps("s3://lt-run/run"), [2, 4]);

    // Every process of a job on one machine resumes at once: each downloads
    // the checkpoint, the first to finish puts it in place, the others keep
    // it (it may already be read) and drop their own copy.
    let racing = TrainingArguments {
        output_dir: dir.join("racing-vm").display().to_string(),
        resume_from_checkpoint: Some("true".into()),
        push_to: Some("s3://lt-run/run".into()),
        ..TrainingArguments::default()
    };
    let resumed: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| fetch_resume_checkpoint(&racing))).collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    let local = dir.join("racing-vm/checkpoint-4");
    assert!(resumed.iter().all(|r| r.as_deref() == Some(local.to_str().unwrap())), "{resumed:?}");
    let remote_weights = read(&url("s3://lt-run/run/checkpoint-4/model.safetensors")).unwrap();
    assert!(std::fs::read(local.join("model.safetensors")).unwrap() == remote_weights);
    let names: Vec<_> = std::fs::read_dir(dir.join("racing-vm")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["checkpoint-4"], "no download folder left behind");

    // A fresh run pushing where an earlier run's checkpoints are: refused,
    // naming them (its rotation would delete them, a resume might take them).
    let out = train(
        &dir,
        &moto,
        &[
            "--train-data",
            "s3://lt-run/data",
            "--output-dir",
            "other-vm",
            "--max-steps",
            "2",
            "--push-to",
            "s3://lt-run/run",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("s3://lt-run/run already holds checkpoints of an earlier run"),
        "{err}"
    );
    assert!(err.contains("s3://lt-run/run/checkpoint-4") && err.contains("--overwrite-output-dir true"), "{err}");
    assert_eq!(remote_steps("s3://lt-run/run"), [2, 4], "nothing deleted");

    // A new machine: empty output dir, same command plus resume.
    let out = bucket_run(
        &dir,
        &moto,
        "second-vm",
        "8",
        "s3://lt-run/run",
        &["--hub-strategy", "every_save", "--resume-from-checkpoint", "true"],
    );
    assert!(out.contains("resuming from s3://lt-run/run/checkpoint-4"), "{out}");
    assert!(std::fs::read(dir.join("second-vm/model.safetensors")).unwrap() == expected, "resumed weights differ");
    // Rotation applied remotely; the final model at the top, bit-identical.
    assert_eq!(remote_steps("s3://lt-run/run"), [6, 8]);
    assert!(read(&url("s3://lt-run/run/model.safetensors")).unwrap() == expected);
    assert!(read(&url("s3://lt-run/run/checkpoint-8/optimizer.safetensors")).is_ok());
    let args = String::from_utf8(read(&url("s3://lt-run/run/checkpoint-8/training_args.json")).unwrap()).unwrap();
    assert!(!args.contains("test"), "no credentials in training_args.json: {args}");

    // A pipeline straight from the bucket: downloaded once, then cached.
    let fill = ["fill-mask", "--model", "s3://lt-run/run", "the capital of [MASK] is", "--json"];
    let first = ok(lazytrain(&dir, &moto, &fill));
    // The cache holds the tokenizer folder (from --tokenizer) and the model.
    let cached: Vec<_> = std::fs::read_dir(dir.join("cache/remote"))
        .unwrap()
        .map(|e| e.unwrap().path().join("model.safetensors"))
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(cached.len(), 1);
    let weights = &cached[0];
    let fetched_at = std::fs::metadata(weights).unwrap().modified().unwrap();
    assert_eq!(ok(lazytrain(&dir, &moto, &fill)), first);
    assert_eq!(std::fs::metadata(weights).unwrap().modified().unwrap(), fetched_at, "downloaded again");

    // A checkpoint folder whose trainer_state.json never arrived is not a
    // checkpoint: resume takes the newest complete one.
    for name in ["model.safetensors", "optimizer.safetensors"] {
        write(&url(&format!("s3://lt-run/run/checkpoint-10/{name}")), b"partial".to_vec()).unwrap();
    }
    assert_eq!(remote_steps("s3://lt-run/run"), [6, 8]);
    let out = bucket_run(
        &dir,
        &moto,
        "third-vm",
        "8",
        "s3://lt-run/run2",
        &["--resume-from-checkpoint", "s3://lt-run/run/checkpoint-8"],
    );
    assert!(out.contains("resuming from s3://lt-run/run/checkpoint-8"), "{out}");
    assert!(std::fs::read(dir.join("third-vm/model.safetensors")).unwrap() == expected);
    let names: Vec<String> = list(&url("s3://lt-run/run2")).unwrap().iter().map(|o| o.url.to_string()).collect();
    assert!(names.contains(&"s3://lt-run/run2/model.safetensors".to_string()), "{names:?}");

    // hub_strategy checkpoint: the model at the top, the newest checkpoint
    // as last-checkpoint/, which a new machine resumes from.
    bucket_run(&dir, &moto, "fourth-vm", "4", "s3://lt-run/run3", &["--hub-strategy", "checkpoint"]);
    let names: Vec<String> = list(&url("s3://lt-run/run3")).unwrap().iter().map(|o| o.url.to_string()).collect();
    assert!(names.contains(&"s3://lt-run/run3/last-checkpoint/trainer_state.json".to_string()), "{names:?}");
    assert!(names.contains(&"s3://lt-run/run3/model.safetensors".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("/checkpoint-")), "{names:?}");
    let out = bucket_run(
        &dir,
        &moto,
        "fifth-vm",
        "8",
        "s3://lt-run/run3",
        &["--hub-strategy", "checkpoint", "--resume-from-checkpoint", "true"],
    );
    assert!(out.contains("resuming from s3://lt-run/run3/last-checkpoint"), "{out}");
    assert!(std::fs::read(dir.join("fifth-vm/model.safetensors")).unwrap() == expected);

    // hub_strategy all_checkpoints: every checkpoint stays, save_total_limit or not.
    bucket_run(&dir, &moto, "sixth-vm", "6", "s3://lt-run/run4", &["--hub-strategy", "all_checkpoints"]);
    assert_eq!(remote_steps("s3://lt-run/run4"), [2, 4, 6]);
    // Starting over there deletes them, with the local folder's flag.
    let out = bucket_run(&dir, &moto, "seventh-vm", "2", "s3://lt-run/run4", &["--overwrite-output-dir", "true"]);
    assert!(out.contains("overwrite_output_dir: deleted s3://lt-run/run4/checkpoint-2"), "{out}");
    assert_eq!(remote_steps("s3://lt-run/run4"), [2], "this run's checkpoint only");
    let left: Vec<String> = list(&url("s3://lt-run/run4")).unwrap().iter().map(|o| o.url.to_string()).collect();
    assert!(!left.iter().any(|n| n.contains("/checkpoint-4/") || n.contains("/checkpoint-6/")), "{left:?}");

    // Bad URLs name themselves.
    let out =
        train(&dir, &moto, &["--train-data", "s3://lt-run/nothing-here", "--output-dir", "x", "--max-steps", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("s3://lt-run/nothing-here"), "{err}");
}

/// A WordPiece tokenizer in `dir/tok` and its shards in `dir/data`.
fn local_data(dir: &Path) {
    let docs = demo_corpus(3, 4, 800).sentences;
    let tok = lazytrain_data::train_tokenizer::train_tokenizer(
        &docs,
        lazytrain_data::train_tokenizer::SubwordModel::WordPiece,
        150,
        lazytrain_data::TokenizerStyle::Bert,
    )
    .unwrap();
    tok.save(&dir.join("tok"), 512).unwrap();
    let options = lazytrain_data::prepare::PrepareOptions {
        block_size: 16,
        num_shards: 2,
        validation_fraction: 0.0,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    lazytrain_data::prepare::prepare(&tok, &docs, &dir.join("data"), &options).unwrap();
}

/// The loss lines of a run's `log.jsonl`.
fn losses(dir: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join("logs/log.jsonl")).unwrap();
    log.lines().filter(|l| l.contains("\"loss\"")).map(str::to_string).collect()
}

#[test]
fn training_from_gcs_equals_training_from_disk() {
    let Some(gcs) = Emulator::start(EmulatorKind::Gcs) else { return };
    gcs.create_bucket("ltgcs");
    gcs.register("ltgcs");
    let dir = common::tmp("buckets", "gcs");
    local_data(&dir);
    lazytrain_storage::upload_folder(&dir.join("data"), &url("gs://ltgcs/data"), &["manifest.json"]).unwrap();
    let run = |data: &str, out: &str| {
        ok(lazytrain(
            &dir,
            &gcs,
            &[
                "train",
                "--model",
                "bert-tiny",
                "--tokenizer",
                "tok",
                "--train-data",
                data,
                "--output-dir",
                out,
                "--max-steps",
                "6",
                "--logging-steps",
                "1",
                "--per-device-train-batch-size",
                "4",
                "--seed",
                "3",
            ],
        ))
    };
    run("data", "from-disk");
    run("gs://ltgcs/data", "from-gcs");
    let disk = losses(&dir.join("from-disk"));
    let without_time = |lines: Vec<String>| -> Vec<serde_json::Value> {
        lines
            .iter()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().retain(|k, _| k == "loss" || k == "step" || k == "grad_norm");
                v
            })
            .collect()
    };
    assert_eq!(disk.len(), 6);
    assert_eq!(without_time(disk), without_time(losses(&dir.join("from-gcs"))));
    let weights = |run: &str| std::fs::read(dir.join(run).join("model.safetensors")).unwrap();
    assert!(weights("from-disk") == weights("from-gcs"));
}

#[test]
fn a_store_that_dies_mid_run_fails_the_push_not_the_training() {
    let Some(mut moto) = Emulator::start(EmulatorKind::Moto) else { return };
    moto.create_bucket("lt-dying");
    moto.register("lt-dying");
    let dir = common::tmp("buckets", "dying");
    local_data(&dir);
    let mut run = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .current_dir(&dir)
        .args(["train", "--model", "bert-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "out"])
        .args(["--max-steps", "60", "--save-steps", "2", "--per-device-train-batch-size", "4", "--report-to", "none"])
        .args(["--push-to", "s3://lt-dying/run"])
        // Two replicas: the other one, waiting for the master's uploads,
        // is released by the failure, not left waiting.
        .args(["--num-replicas", "2"])
        .envs(moto.env())
        .env("LAZYTRAIN_STORAGE_ATTEMPTS", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The store dies once the first checkpoint is up.
    let first = url("s3://lt-dying/run/checkpoint-2/trainer_state.json");
    while !lazytrain_storage::exists(&first).unwrap() {
        assert!(run.try_wait().unwrap().is_none(), "the run ended before its first upload");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    moto.stop();
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Training went on to the end and saved everything locally; the push
    // failures are reported, each naming its checkpoint and the URL.
    assert!(!out.status.success(), "{err}");
    assert!(dir.join("out/model.safetensors").is_file() && dir.join("out/checkpoint-60").is_dir(), "{err}");
    assert!(err.contains("training finished and everything is saved in out"), "{err}");
    assert!(err.contains("checkpoint-60 -> s3://lt-dying/run/checkpoint-60"), "{err}");
    assert!(err.contains("gave up after 2 attempts"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
