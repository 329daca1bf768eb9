//! What a new user trips over, each named with its fix: raw text as data,
//! data prepared by another tokenizer, a model folder given another
//! tokenizer, a preset without a tokenizer, an unknown model, a negative
//! number as a flag value; and held-out files as the eval split.

use lazytrain_core::ScratchDir;
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use std::path::Path;
use std::process::Command;

mod common;

fn lazytrain(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lazytrain")).current_dir(dir).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A folder with `train.txt`, `val.txt`, two tokenizers (`tok`, `small`) and `data` prepared by `tok`.
fn workspace(name: &str) -> ScratchDir {
    let dir = common::tmp("trip", name);
    let docs = demo_corpus(2, 4, 1200).sentences;
    std::fs::write(dir.join("train.txt"), docs[..1000].join("\n")).unwrap();
    std::fs::write(dir.join("val.txt"), docs[1000..].join("\n")).unwrap();
    train_tokenizer(&docs, SubwordModel::Bpe, 300, TokenizerStyle::Roberta)
        .unwrap()
        .save(&dir.join("tok"), 512)
        .unwrap();
    train_tokenizer(&docs, SubwordModel::Bpe, 280, TokenizerStyle::Roberta)
        .unwrap()
        .save(&dir.join("small"), 512)
        .unwrap();
    let (ok, _, err) = lazytrain(
        &dir,
        &[
            "prepare",
            "--tokenizer",
            "tok",
            "--files",
            "train.txt",
            "--block-size",
            "16",
            "--num-shards",
            "1",
            "--output",
            "data",
        ],
    );
    assert!(ok, "{err}");
    dir
}

const TRAIN: [&str; 6] = ["train", "--max-steps", "1", "--per-device-train-batch-size", "2", "--report-to"];

fn train(dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let args: Vec<&str> = TRAIN.iter().copied().chain(["none"]).chain(extra.iter().copied()).collect();
    lazytrain(dir, &args)
}

#[test]
fn each_trip_wire_names_the_problem_and_the_fix() {
    let dir = workspace("wires");
    let refuse = |extra: &[&str], expect: &[&str]| {
        let (ok, _, err) = train(&dir, extra);
        assert!(!ok, "{extra:?} should fail");
        for e in expect {
            assert!(err.contains(e), "{extra:?}: expected {e:?} in: {err}");
        }
    };
    // Raw text instead of a prepared folder.
    refuse(
        &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "train.txt", "--output-dir", "o"],
        &["train.txt is not prepared data", "lazytrain prepare"],
    );
    refuse(
        &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "tok", "--output-dir", "o"],
        &["tok is not prepared data (a folder without manifest.json)"],
    );
    // Data prepared by another tokenizer than the one training reads it with.
    refuse(
        &["--model", "roberta-tiny", "--tokenizer", "small", "--train-data", "data", "--output-dir", "o"],
        &["data was prepared with another tokenizer", "tokens) than small", "--tokenizer small"],
    );
    // A preset needs a tokenizer; an unknown name is neither preset nor folder.
    refuse(&["--model", "roberta-tiny", "--train-data", "data"], &["a preset (roberta-tiny) needs --tokenizer DIR"]);
    refuse(
        &["--model", "roberta-tinny", "--tokenizer", "tok", "--train-data", "data"],
        &[
            "--model roberta-tinny is neither a preset (bert-tiny",
            "nor a model folder",
            "not in the Hugging Face cache",
        ],
    );
    // A negative value reaches the validation message.
    refuse(
        &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--learning-rate", "-1"],
        &["learning_rate must be positive"],
    );
    // A file where the run's folder should be.
    std::fs::write(dir.join("afile"), "x").unwrap();
    refuse(
        &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "afile"],
        &["output_dir afile is a file; name a folder"],
    );
    // A model folder with its own tokenizer refuses another one.
    let (ok, _, err) =
        train(&dir, &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "m"]);
    assert!(ok, "{err}");
    refuse(
        &["--model", "m", "--tokenizer", "small", "--train-data", "data", "--output-dir", "o"],
        &["the model in m comes with its own tokenizer", "leave out --tokenizer"],
    );
    let (ok, _, err) = train(&dir, &["--model", "m", "--train-data", "data", "--output-dir", "o2"]);
    assert!(ok, "the model's own tokenizer prepared the data: {err}");
    // Eval blocks longer than the model's 512 positions are refused before
    // the first step, not at the first evaluation.
    let (ok, _, err) = lazytrain(
        &dir,
        &["prepare", "--tokenizer", "tok", "--files", "val.txt", "--block-size", "600", "--output", "long"],
    );
    assert!(ok, "{err}");
    refuse(
        &[
            "--model",
            "roberta-tiny",
            "--tokenizer",
            "tok",
            "--train-data",
            "data",
            "--eval-data",
            "long",
            "--output-dir",
            "lr",
        ],
        &["the eval data long has sequences of 600 tokens", "at most 512 positions", "--block-size 512 or less"],
    );
    assert!(!dir.join("lr").exists(), "refused before training");
}

/// `prepare --validation-files val.txt` makes exactly val.txt's blocks the
/// eval split; a folder prepared from val.txt alone (no validation shards)
/// is evaluated on its training shards, with a notice.
#[test]
fn held_out_files_are_the_eval_split() {
    let dir = workspace("held-out");
    let prepare = |args: &[&str]| {
        let base = ["prepare", "--tokenizer", "tok", "--block-size", "16", "--num-shards", "1"];
        let (ok, out, err) = lazytrain(&dir, &base.iter().chain(args).copied().collect::<Vec<_>>());
        assert!(ok, "{err}");
        out
    };
    prepare(&["--files", "train.txt", "--validation-files", "val.txt", "--output", "split"]);
    prepare(&["--files", "val.txt", "--validation-fraction", "0", "--output", "val-only"]);
    let tok = lazytrain_data::TextTokenizer::from_path(&dir.join("tok")).unwrap();
    let val_tokens: usize =
        std::fs::read_to_string(dir.join("val.txt")).unwrap().lines().map(|l| tok.encode(l, true).unwrap().len()).sum();
    let blocks = val_tokens / 16;
    let manifest = lazytrain_data::prepare::Manifest::read(&dir.join("split")).unwrap();
    assert_eq!(manifest.validation.iter().map(|s| s.records).sum::<u64>() as usize, blocks);
    let model = ["--task", "causal-lm", "--model", "gpt2-tiny", "--tokenizer", "tok"];
    for (eval, out) in [("split", "e1"), ("val-only", "e2")] {
        let mut args = vec!["--train-data", "split", "--eval-data", eval, "--do-eval", "true", "--output-dir", out];
        args.extend(model);
        let (ok, _, err) = train(&dir, &args);
        assert!(ok, "{err}");
        assert_eq!(
            err.contains("has no validation shards; evaluating on its training shards"),
            eval == "val-only",
            "{err}"
        );
        let results: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(out).join("eval_results.json")).unwrap()).unwrap();
        // A causal LM predicts 15 next tokens in each block of 16: exactly val.txt's blocks.
        assert_eq!(results["eval_predictions"], 15 * blocks as u64, "{eval}");
    }
    // A quoted local pattern is matched as a bucket pattern is: the same documents as the file.
    let base = ["prepare", "--tokenizer", "tok", "--block-size", "16", "--num-shards", "1", "--output"];
    let (ok, _, err) = lazytrain(&dir, &[&base[..], &["pattern", "--files", "tr*.txt"]].concat());
    assert!(ok, "{err}");
    let documents = |out: &str| lazytrain_data::prepare::Manifest::read(&dir.join(out)).unwrap().documents;
    assert_eq!(documents("pattern"), documents("data"));
    let (ok, _, err) = lazytrain(&dir, &[&base[..], &["none", "--files", "nothing-*.txt"]].concat());
    assert!(!ok && err.contains("--files nothing-*.txt matches no files"), "{err}");
    // A vocabulary of another size than asked is said to be, and why.
    let (ok, _, err) = lazytrain(
        &dir,
        &[
            "train-tokenizer",
            "--files",
            "train.txt",
            "--model",
            "bpe",
            "--style",
            "gpt2",
            "--vocab-size",
            "100",
            "--output",
            "g",
        ],
    );
    assert!(ok && err.contains("has 257 tokens, more than --vocab-size 100"), "{err}");
    // Held-out text that is also training text is said to be.
    let (ok, _, err) =
        lazytrain(&dir, &[&base[..], &["leak", "--files", "train.txt", "--validation-files", "train.txt"]].concat());
    assert!(ok && err.contains("train.txt is both a training and a validation file"), "{err}");
}

/// Without a terminal the run still shows progress (a line per logging
/// interval); a resumed run's summary says how many steps ran now; a tie
/// for the best checkpoint is named.
#[test]
fn progress_resume_summary_and_ties_are_reported() {
    let dir = workspace("report");
    let base = ["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "run"];
    let mut first = base.to_vec();
    first.extend(["--logging-steps", "1", "--save-steps", "1"]);
    let args: Vec<&str> = ["train", "--max-steps", "2", "--per-device-train-batch-size", "2", "--report-to", "none"]
        .into_iter()
        .chain(first.iter().copied())
        .collect();
    let (ok, out, err) = lazytrain(&dir, &args);
    assert!(ok, "{err}");
    assert!(err.contains("step 1/2: loss") && err.contains("step 2/2: loss"), "{err}");
    assert!(out.contains("trained 2 steps in"), "{out}");
    let mut resume = base.to_vec();
    resume.extend(["--resume-from-checkpoint", "true", "--save-steps", "1"]);
    let args: Vec<&str> = ["train", "--max-steps", "4", "--per-device-train-batch-size", "2", "--report-to", "none"]
        .into_iter()
        .chain(resume.iter().copied())
        .collect();
    let (ok, out, err) = lazytrain(&dir, &args);
    assert!(ok, "{err}");
    assert!(out.contains("trained 2 steps (resumed at step 2, now at step 4)"), "{out}");
    // The longer run changes the schedule: said once, naming what changed.
    assert!(err.contains("the learning-rate schedule differs") && err.contains("(total steps 2 -> 4)"), "{err}");
    assert!(err.contains("this run's applies from step 2"), "{err}");
    // Resumed where training already ends: said so, not a mean loss of nothing.
    let ended: Vec<&str> = args.iter().map(|a| if *a == "4" { "3" } else { a }).collect();
    let (ok, out, err) = lazytrain(&dir, &ended);
    assert!(ok, "{err}");
    assert!(out.contains("trained 0 steps: the run resumed at step 4, where its training already ends"), "{out}");
    // A saved data position past this data's epoch (more data then, or a
    // damaged file) goes on with the next epoch, said once.
    let state = dir.join("run/checkpoint-4/trainer_state.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    json["data_sample"] = serde_json::json!(99_999_999_999u64);
    std::fs::write(&state, json.to_string()).unwrap();
    let longer: Vec<&str> = args.iter().map(|a| if *a == "4" { "5" } else { a }).collect();
    let (ok, out, err) = lazytrain(&dir, &longer);
    assert!(ok, "{err}");
    assert!(err.contains("(sample 99999999999 of epoch") && err.contains("training goes on with epoch"), "{err}");
    assert!(out.contains("now at step 5"), "{out}");

    // A learning rate too small to move f32 weights: every evaluation ties.
    let (ok, _, err) = lazytrain(
        &dir,
        &[
            "train",
            "--per-device-train-batch-size",
            "2",
            "--report-to",
            "none",
            "--model",
            "roberta-tiny",
            "--tokenizer",
            "tok",
            "--train-data",
            "data",
            "--eval-data",
            "data",
            "--output-dir",
            "ties",
            "--learning-rate",
            "1e-30",
            "--eval-strategy",
            "steps",
            "--eval-steps",
            "1",
            "--save-steps",
            "1",
            "--load-best-model-at-end",
            "true",
            "--max-steps",
            "2",
            "--mlm-probability",
            "0.5",
        ],
    );
    assert!(ok, "{err}");
    assert!(err.contains("eval_loss") && err.contains("ties the best so far"), "{err}");
}

/// `prepare-classification` says when it adds a bucket, and warns about a
/// validation split too small to compare checkpoints.
#[test]
fn classification_preparation_explains_itself() {
    let dir = common::tmp("trip", "classification");
    let rows: String = (0..40)
        .map(|i| {
            let label = ["good", "bad"][i % 2];
            format!("{}\n", serde_json::json!({"text": format!("review number {i} was fine"), "label": label}))
        })
        .collect();
    std::fs::write(dir.join("rows.jsonl"), rows).unwrap();
    let texts: Vec<String> = (0..40).map(|i| format!("review number {i} was fine")).collect();
    train_tokenizer(&texts, SubwordModel::WordPiece, 100, TokenizerStyle::Bert)
        .unwrap()
        .save(&dir.join("tok"), 64)
        .unwrap();
    let (ok, _, err) = lazytrain(
        &dir,
        &[
            "prepare-classification",
            "--tokenizer",
            "tok",
            "--files",
            "rows.jsonl",
            "--max-length",
            "32",
            "--buckets",
            "8",
            "--validation-fraction",
            "0.2",
            "--output",
            "data",
        ],
    );
    assert!(ok, "{err}");
    assert!(err.contains("added a bucket of --max-length 32 tokens"), "{err}");
    assert!(err.contains("the validation split has only") && err.contains("rows"), "{err}");
}

/// `train --dry-run` compiles the first step and prints its memory plan
/// without training or writing a model.
#[test]
fn a_dry_run_prints_the_plan_and_trains_nothing() {
    let dir = workspace("dry-run");
    let (ok, out, err) = train(
        &dir,
        &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "plan", "--dry-run"],
    );
    assert!(ok, "{err}");
    for part in ["dry run: the training step (batch 2)", "parameters", "optimizer state", "activations and gradients"] {
        assert!(out.contains(part), "{part}: {out}");
    }
    assert!(out.contains("largest buffers") && out.contains("the largest batch that fits is about"), "{out}");
    assert!(!dir.join("plan/model.safetensors").exists() && !dir.join("plan/checkpoint-1").exists(), "nothing trained");
    // A dry run of a command that would start over removes nothing.
    let base = ["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "kept"];
    let base = [&base[..], &["--save-steps", "1"]].concat();
    let (ok, _, err) = train(&dir, &base);
    assert!(ok, "{err}");
    let (ok, _, err) = train(&dir, &[&base[..], &["--overwrite-output-dir", "true", "--dry-run"]].concat());
    assert!(ok, "{err}");
    assert!(err.contains("would remove 1 checkpoint(s)") && err.contains("nothing removed"), "{err}");
    assert!(dir.join("kept/checkpoint-1/trainer_state.json").is_file(), "the earlier run's checkpoint stays");
}

/// A shard cut short at a record's end reads without a checksum error; the
/// manifest's count tells, for `train` and `bench-loader` alike, which also
/// checks the tokenizer and takes `--skip-corrupt` as its hint says.
#[test]
fn shards_short_of_their_manifest_and_another_tokenizer_are_refused() {
    let dir = workspace("short-shards");
    let bench = |data: &str, tokenizer: &str, extra: &[&str]| {
        let args = ["bench-loader", "--data", data, "--tokenizer", tokenizer, "--batch-size", "2", "--batches", "3"];
        lazytrain(&dir, &args.iter().copied().chain(extra.iter().copied()).collect::<Vec<_>>())
    };
    let (ok, _, err) = bench("data", "tok", &["--skip-corrupt"]);
    assert!(ok, "{err}");
    let (ok, _, err) = bench("data", "small", &[]);
    assert!(!ok && err.contains("data was prepared with another tokenizer"), "{err}");
    // Keep the first record of the shard: a whole record, a valid checksum.
    let shard = dir.join("data/train-00000-of-00001.tfrecord");
    let bytes = std::fs::read(&shard).unwrap();
    let first = 16 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    std::fs::write(&shard, &bytes[..first]).unwrap();
    let (ok, _, err) = bench("data", "tok", &[]);
    assert!(!ok && err.contains("records but the shards hold 1: a shard is missing or cut short"), "{err}");
    let (ok, _, err) =
        train(&dir, &["--model", "roberta-tiny", "--tokenizer", "tok", "--train-data", "data", "--output-dir", "o"]);
    assert!(!ok && err.contains("but the shards hold 1"), "{err}");
    std::fs::write(&shard, b"").unwrap();
    let (ok, _, err) = bench("data", "tok", &[]);
    assert!(!ok && err.contains("data holds no train records (are its shards empty?)"), "{err}");
}
