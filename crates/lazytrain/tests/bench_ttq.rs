//! `lazytrain bench-ttq` runs the time-to-quality protocol end to end on a
//! small corpus: annotations stripped, the NFKC + lowercase Unigram
//! tokenizer, RoBERTa's wrapped blocks, evaluations on the protocol's
//! schedule with the clock paused while they run, the anchor's JSON lines,
//! and the comparison with a PyTorch result file.

use lazytrain_data::corpus::demo_corpus;
use serde_json::Value;
use std::process::Command;

mod common;

#[test]
fn bench_ttq_follows_the_protocol() {
    let dir = common::tmp("ttq", "protocol");
    // Paragraphs with the corpus's annotations and blank lines between them.
    let lines: Vec<String> = demo_corpus(5, 6, 2400)
        .sentences
        .iter()
        .enumerate()
        .map(|(i, s)| match i % 7 {
            0 => format!("{} [Applause]\n", s.to_uppercase()),
            3 => "[Laughter]\n".to_string(),
            _ => format!("  {s}\n"),
        })
        .collect();
    let corpus: String = lines.join("\n");
    std::fs::write(dir.join("corpus.txt"), &corpus).unwrap();
    let train_bytes = corpus.len() * 4 / 5;
    let reference = dir.join("torch.jsonl");
    std::fs::write(
        &reference,
        "{\"kind\": \"eval\", \"step\": 0, \"eval_loss\": 9.0}\n{\"kind\": \"summary\", \"final_eval_loss\": 50.0, \"train_s\": 1000.0}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .current_dir(&dir)
        .args(["bench-ttq", "--corpus", "corpus.txt", "--train-bytes", &train_bytes.to_string()])
        .args(["--validation-bytes", "20000", "--max-steps", "12", "--warmup-steps", "2", "--eval-every", "6"])
        .args(["--vocab-size", "200", "--output-dir", "run", "--out", "result.jsonl", "--reference", "torch.jsonl"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    let records: Vec<Value> = std::fs::read_to_string(dir.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), records.len());
    let evals: Vec<&Value> = records.iter().filter(|r| r["kind"] == "eval").collect();
    let steps: Vec<u64> = evals.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 6, 12]);
    let (first, last) = (evals[0]["eval_loss"].as_f64().unwrap(), evals[2]["eval_loss"].as_f64().unwrap());
    assert!(last < first - 0.5, "the eval loss fell from {first} to {last} only");
    for pair in evals.windows(2) {
        let wall = |r: &Value| r["wall_s"].as_f64().unwrap();
        assert!(wall(pair[1]) > wall(pair[0]));
        // The training clock excludes the evaluation that just ran.
        assert!(pair[1]["wall_incl_eval_s"].as_f64().unwrap() > wall(pair[1]));
        assert!(pair[1]["train_loss"].as_f64().unwrap().is_finite());
    }

    let summary = records.last().unwrap();
    assert_eq!(summary["kind"], "summary");
    // Protocol step 1, counted independently: lines of the training prefix
    // (cut back to a line break) that keep text once annotations go.
    let prefix = &corpus[..=corpus[..train_bytes].rfind('\n').unwrap()];
    let kept = prefix.split('\n').filter(|l| !l.replace("[Applause]", "").replace("[Laughter]", "").trim().is_empty());
    assert_eq!(summary["train_docs"].as_u64().unwrap(), kept.count() as u64);
    assert_eq!(summary["train_bytes"].as_u64().unwrap(), prefix.len() as u64);
    assert_eq!(summary["final_eval_loss"], evals[2]["eval_loss"]);
    assert!(summary["train_s"].as_f64().unwrap() <= evals[2]["wall_s"].as_f64().unwrap() + 0.5);
    assert!(summary["eval_masked_tokens"].as_u64().unwrap() > 0);
    assert_eq!(summary["mlm_head"], "masked-positions");
    // Every loss is below the fake reference's 50, so it is reached at the first evaluation.
    assert!(stderr.contains("lazytrain reached") && stderr.contains("at step 0 after 0.0 s = 0.00x"), "{stderr}");

    // The tokenizer folds case; the blocks are wrapped as <s> piece </s>.
    let tokenizer = lazytrain_data::TextTokenizer::from_path(&dir.join("run/tokenizer")).unwrap();
    let ids = |t: &str| tokenizer.inner().encode(t, false).unwrap().get_ids().to_vec();
    assert_eq!(ids("THE CAPITAL"), ids("the capital"));
    let manifest = lazytrain_data::prepare::Manifest::read(&dir.join("run/data")).unwrap();
    assert_eq!(manifest.packing, lazytrain_data::prepare::Packing::Wrapped);
    let train = common::open(&dir.join("run"), "train");
    for k in 0..train.len() {
        let block = train.feature(k, "input_ids").unwrap();
        assert_eq!((block.len(), block[0], block[127]), (128, 0, 2));
    }
}

#[test]
fn a_missing_or_short_corpus_is_named_with_the_fix() {
    let dir = common::tmp("ttq", "bad-corpus");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
            .current_dir(&dir)
            .arg("bench-ttq")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = run(&["--corpus", "nowhere.txt", "--output-dir", "run"]);
    assert!(missing.contains("nowhere.txt") && missing.contains("--corpus"), "{missing}");
    std::fs::write(dir.join("short.txt"), "[Applause]\n\none line\n").unwrap();
    let short = run(&["--corpus", "short.txt", "--output-dir", "run"]);
    assert!(short.contains("short.txt") && short.contains("too short"), "{short}");
    // No steps, or evaluations every 0 steps: refused by name, not a run of
    // the default epochs with a time per step of x/0.
    for (flag, value) in [("--max-steps", "0"), ("--max-steps", "9223372036854775808"), ("--eval-every", "0")] {
        let err = run(&["--corpus", "short.txt", flag, value]);
        assert!(err.contains(&format!("invalid value '{value}' for '{flag}")), "{err}");
    }
}
