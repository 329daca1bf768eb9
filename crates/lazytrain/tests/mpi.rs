//! Multi-process training under `mpirun` (built with `--features mpi`;
//! `.ci/run` installs OpenMPI and runs these): processes train like
//! threads, a rank that traced another graph, died or hangs ends the job
//! fast, and only the master writes.

#![cfg(feature = "mpi")]

mod common;

use lazytrain_core::{Device, ScratchDir};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A tokenizer and masked-LM shards under a fresh folder.
fn data(name: &str) -> ScratchDir {
    let dir = common::tmp("mpi", name);
    let docs = demo_corpus(1, 6, 1500).sentences;
    let tok = train_tokenizer(&docs, SubwordModel::WordPiece, 200, TokenizerStyle::Bert).unwrap();
    tok.save(&dir.join("tokenizer"), 512).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 2,
        validation_fraction: 0.05,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    prepare(&tok, &docs, &dir.join("data"), &options).unwrap();
    dir
}

/// Shared-memory and TCP transports, as the README's launch line.
const SHARED_MEMORY: [&str; 6] = ["--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none"];
/// TCP over loopback only: the multi-host path.
const TCP_ONLY: [&str; 6] = ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"];

/// `mpirun -n n` of the lazytrain binary, with `env` set in every rank.
fn mpirun(n: usize, transport: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", &n.to_string()]).args(transport);
    for (name, value) in env {
        cmd.args(["-x", &format!("{name}={value}")]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_lazytrain"));
    cmd
}

/// The `train` arguments of the tests' runs into `out`.
fn train_args(dir: &Path, out: &Path, steps: usize) -> Vec<String> {
    let mut args: Vec<String> = ["train", "--model", "bert-tiny", "--tokenizer"].map(String::from).to_vec();
    args.push(dir.join("tokenizer").display().to_string());
    args.extend(["--train-data".into(), dir.join("data").display().to_string()]);
    args.extend(["--output-dir".into(), out.display().to_string()]);
    for (flag, value) in [
        ("--max-steps", steps.to_string()),
        ("--per-device-train-batch-size", "2".into()),
        ("--learning-rate", "1e-3".into()),
        ("--seed", "3".into()),
        ("--logging-steps", "1".into()),
        ("--report-to", "jsonl".into()),
        ("--eval-strategy", "no".into()),
        ("--save-steps", "2".into()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    args
}

fn succeed(output: Output) {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The logged per-step losses of a run.
fn losses(out: &Path) -> Vec<f64> {
    std::fs::read_to_string(out.join("logs/log.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64())
        .collect()
}

/// The saved weights of a run, by name.
fn weights(out: &Path) -> Vec<(String, Vec<f32>)> {
    let state = lazytrain_nn::state::load_safetensors(&out.join("model.safetensors"), &Device::cpu()).unwrap();
    let mut named: Vec<(String, Vec<f32>)> =
        state.entries().iter().map(|(name, t)| (name.clone(), t.to_vec::<f32>().unwrap())).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// Losses and weights of two runs agree within `tolerance` (relative).
fn assert_same_training(a: &Path, b: &Path, tolerance: f64) {
    let (la, lb) = (losses(a), losses(b));
    assert_eq!(la.len(), lb.len());
    assert!(!la.is_empty());
    for (x, y) in la.iter().zip(&lb) {
        assert!((x - y).abs() <= tolerance * y.abs(), "losses {la:?} vs {lb:?}");
    }
    let (wa, wb) = (weights(a), weights(b));
    assert_eq!(wa.len(), wb.len());
    for ((name, x), (_, y)) in wa.iter().zip(&wb) {
        for (p, q) in x.iter().zip(y) {
            assert!((p - q).abs() <= (tolerance * q.abs() as f64).max(1e-6) as f32, "{name}: {p} vs {q}");
        }
    }
}

#[test]
fn two_processes_train_like_two_threads_over_tcp() {
    let dir = data("tcp");
    let (mpi, threads) = (dir.join("mpi"), dir.join("threads"));
    succeed(mpirun(2, &TCP_ONLY, &[]).args(train_args(&dir, &mpi, 6)).output().unwrap());
    let mut threaded = Command::new(env!("CARGO_BIN_EXE_lazytrain"));
    succeed(threaded.args(train_args(&dir, &threads, 6)).args(["--num-replicas", "2"]).output().unwrap());
    assert_same_training(&mpi, &threads, 1e-5);
    // The master alone logged and saved: one line per step, not two.
    assert_eq!(losses(&mpi).len(), 6);
    assert!(mpi.join("checkpoint-6/model.safetensors").is_file());
}

#[test]
fn two_processes_of_two_threads_train_like_four_threads() {
    let dir = data("hybrid");
    let (mpi, threads) = (dir.join("mpi"), dir.join("threads"));
    succeed(
        mpirun(2, &SHARED_MEMORY, &[]).args(train_args(&dir, &mpi, 4)).args(["--num-replicas", "2"]).output().unwrap(),
    );
    let mut threaded = Command::new(env!("CARGO_BIN_EXE_lazytrain"));
    succeed(threaded.args(train_args(&dir, &threads, 4)).args(["--num-replicas", "4"]).output().unwrap());
    assert_same_training(&mpi, &threads, 1e-5);
}

/// A folder per host (here one per rank, each rank given its own
/// `--output-dir`): only the master has checkpoints, so it loads the best
/// one and hands its weights to every rank, and the final evaluation, each
/// rank scoring its share, scores the best model, as two threads sharing
/// one folder do.
#[test]
fn with_a_folder_per_rank_every_rank_evaluates_the_best_model() {
    let dir = data("best");
    let best = |out: &Path| {
        let mut args = train_args(&dir, out, 6);
        let strategy = args.iter().position(|a| a == "--eval-strategy").unwrap() + 1;
        args[strategy] = "steps".into();
        args.extend(["--eval-data".into(), dir.join("data").display().to_string()]);
        // The highest eval loss is the best: an early checkpoint, not the last.
        for (flag, value) in [
            ("--eval-steps", "2"),
            ("--do-eval", "true"),
            ("--load-best-model-at-end", "true"),
            ("--greater-is-better", "true"),
        ] {
            args.extend([flag.to_string(), value.to_string()]);
        }
        args
    };
    let (rank0, rank1, threads) = (dir.join("rank0"), dir.join("rank1"), dir.join("threads"));
    succeed(
        mpirun(1, &SHARED_MEMORY, &[])
            .args(best(&rank0))
            .args([":", "-n", "1", env!("CARGO_BIN_EXE_lazytrain")])
            .args(best(&rank1))
            .output()
            .unwrap(),
    );
    let mut threaded = Command::new(env!("CARGO_BIN_EXE_lazytrain"));
    succeed(threaded.args(best(&threads)).args(["--num-replicas", "2"]).output().unwrap());
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rank0.join("trainer_state.json")).unwrap()).unwrap();
    let chosen = state["best_model_checkpoint"].as_str().unwrap().to_string();
    assert!(!chosen.ends_with("checkpoint-6"), "the best is not the final model: {chosen}");
    assert!(!rank1.join(Path::new(&chosen).file_name().unwrap()).exists(), "rank 1's folder holds no checkpoint");
    let eval_loss = |out: &Path| {
        let text = std::fs::read_to_string(out.join("eval_results.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["eval_loss"].as_f64().unwrap()
    };
    let (mpi, threaded) = (eval_loss(&rank0), eval_loss(&threads));
    assert!(
        (mpi - threaded).abs() <= 1e-5 * threaded.abs(),
        "eval loss {mpi} with a folder per rank, {threaded} in one"
    );
    // Resuming there: rank 1 finds no checkpoint in its folder. Refused at
    // once, naming the steps and the fix, not at the first all-reduce.
    let resume = |out: &Path| {
        let mut args = best(out);
        let steps = args.iter().position(|a| a == "--max-steps").unwrap() + 1;
        args[steps] = "8".into();
        args.extend(["--resume-from-checkpoint", "true"].map(String::from));
        args
    };
    let output = mpirun(1, &SHARED_MEMORY, &[])
        .args(resume(&rank0))
        .args([":", "-n", "1", env!("CARGO_BIN_EXE_lazytrain")])
        .args(resume(&rank1))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("replica 1 has resumed at step 0 but replica 0 has 6"), "{stderr}");
    assert!(stderr.contains("copy it into each host's --output-dir"), "{stderr}");
}

#[test]
fn a_rank_that_traced_another_graph_fails_fast_on_every_rank() {
    let dir = data("mismatch");
    let out = dir.join("out");
    // The same model and weights, another batch size: another step graph.
    let mut other = train_args(&dir, &out, 4);
    let batch = other.iter().position(|a| a == "--per-device-train-batch-size").unwrap() + 1;
    other[batch] = "4".into();
    let started = Instant::now();
    let output = mpirun(1, &SHARED_MEMORY, &[])
        .args(train_args(&dir, &out, 4))
        .args([":", "-n", "1", env!("CARGO_BIN_EXE_lazytrain")])
        .args(other)
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("traced different step graphs"), "{stderr}");
    assert!(stderr.contains("replica 0 runs graph") && stderr.contains("replica 1 runs graph"), "{stderr}");
}

#[test]
fn a_killed_rank_ends_the_job_and_its_checkpoint_resumes() {
    let dir = data("kill");
    let out = dir.join("out");
    let mut job = mpirun(2, &SHARED_MEMORY, &[])
        .args(train_args(&dir, &out, 100_000))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The job's stderr, collected as it comes, for the failure messages.
    let mut pipe = job.stderr.take().expect("stderr is piped");
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let collected = std::sync::Arc::clone(&stderr);
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut chunk) {
            collected.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    let said = || String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
    let waited = Instant::now();
    while !out.join("checkpoint-4/trainer_state.json").is_file() {
        if let Some(status) = job.try_wait().unwrap() {
            panic!("the job ended ({status}) before its fourth step's checkpoint; stderr:\n{}", said());
        }
        if waited.elapsed() > Duration::from_secs(60) {
            let _ = job.kill();
            panic!("no checkpoint after a minute; stderr so far:\n{}", said());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ranks = Command::new("pgrep").args(["-P", &job.id().to_string()]).output().unwrap();
    let victim = String::from_utf8_lossy(&ranks.stdout).lines().last().expect("mpirun's ranks").trim().to_string();
    assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
    let killed = Instant::now();
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break status;
        }
        assert!(killed.elapsed() < Duration::from_secs(15), "mpirun still runs 15 s after a rank died");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let latest = lazytrain::trainer::checkpoint::latest_checkpoint(&out).expect("a complete checkpoint");
    let step: usize = latest.file_name().unwrap().to_str().unwrap()["checkpoint-".len()..].parse().unwrap();
    let resumed = mpirun(2, &SHARED_MEMORY, &[])
        .args(train_args(&dir, &out, step + 2))
        .args(["--resume-from-checkpoint", "true"])
        .output()
        .unwrap();
    succeed(resumed);
    assert!(out.join(format!("checkpoint-{}", step + 2)).is_dir());
}

#[test]
fn a_stuck_rank_ends_the_job_after_the_collective_timeout() {
    let dir = data("stall");
    let out = dir.join("out");
    let started = Instant::now();
    let output = mpirun(2, &SHARED_MEMORY, &[("LAZYTRAIN_FAULT_INJECT", "stall-replica-1")])
        .args(train_args(&dir, &out, 8))
        .args(["--collective-timeout", "2"])
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Usually the gradient all-reduce of step 2; under a loaded machine an
    // earlier collective may already wait longer than 2 s for rank 1.
    assert!(stderr.contains("has not completed after 2 s"), "{stderr}");
}

/// The master's last uploads may take longer than the collective timeout
/// (a large model, a slow link): the other ranks wait for them without
/// one, and the job ends well, with its final evaluation.
#[test]
fn the_master_s_last_uploads_may_outlast_the_collective_timeout() {
    let dir = data("slow-push");
    let (out, pushed) = (dir.join("out"), dir.join("pushed"));
    let output = mpirun(2, &SHARED_MEMORY, &[("LAZYTRAIN_FAULT_INJECT", "slow-final-push")])
        .args(train_args(&dir, &out, 4))
        .args(["--collective-timeout", "2", "--push-to"])
        .arg(&pushed)
        .arg("--eval-data")
        .arg(dir.join("data"))
        .args(["--do-eval", "true"])
        .output()
        .unwrap();
    succeed(output);
    assert!(out.join("eval_results.json").is_file());
    assert!(pushed.join("model.safetensors").is_file() && pushed.join("checkpoint-4/model.safetensors").is_file());
}
