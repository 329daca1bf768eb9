//! Sequence-classification fine-tuning: the Trainer task, evaluation with
//! macro-F1, `load_best_model_at_end`, the exported folder, the
//! text-classification pipeline and the CLI.

use lazytrain::pipelines::TextClassification;
use lazytrain::trainer::{IntervalStrategy, Trainer, TrainingArguments};
use lazytrain_core::{Device, ScratchDir};
use lazytrain_data::classification::ClassificationManifest;
use lazytrain_data::TextTokenizer;
use lazytrain_models::ForSequenceClassification;
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{named_parameters, Context};
use std::process::Command;

mod common;

use common::{open, review_data, tiny_classifier_config};

fn tmp(name: &str) -> ScratchDir {
    common::tmp("classify", name)
}

/// A tokenizer folder, generated reviews as JSON Lines and their prepared shards.
fn data(name: &str) -> (ScratchDir, TextTokenizer, ClassificationManifest) {
    let dir = tmp(name);
    let (tok, manifest) = review_data(&dir, 1200, &[16]);
    tok.save(&dir.join("tokenizer"), 512).unwrap();
    (dir, tok, manifest)
}

fn classifier(tok: &TextTokenizer, labels: &[String], device: &Device) -> ForSequenceClassification {
    let config = tiny_classifier_config(tok, labels);
    ForSequenceClassification::new(&mut Initializer::new(3, device), &config, labels.len()).unwrap()
}

#[test]
fn fine_tuning_keeps_the_best_checkpoint_and_exports_a_classifier() {
    let (dir, tok, manifest) = data("fine-tune");
    assert_eq!(manifest.buckets, [16, 32]);
    let device = Device::cpu();
    let args = TrainingArguments {
        output_dir: dir.join("out").display().to_string(),
        max_steps: 120,
        per_device_train_batch_size: 16,
        per_device_eval_batch_size: 32,
        learning_rate: 3e-3,
        logging_steps: 10,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(30),
        save_steps: 30,
        save_total_limit: Some(1),
        load_best_model_at_end: true,
        metric_for_best_model: "f1".into(),
        report_to: vec!["jsonl".into()],
        ..TrainingArguments::default()
    };
    let model = classifier(&tok, &manifest.labels, &device);
    let (train, eval) = (open(&dir, "train"), Some(open(&dir, "validation")));
    let mut trainer = Trainer::for_classification(args, model, tok.clone(), train, eval, &manifest, &device).unwrap();
    let out = trainer.train().unwrap();
    assert_eq!(out.losses.len(), 120);
    let first: f32 = out.losses[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = out.losses[110..].iter().sum::<f32>() / 10.0;
    assert!(last < first * 0.8, "the classifier learns: {first} -> {last}");

    let evals: Vec<_> = trainer.state.log_history.iter().filter(|e| e.get("eval_f1").is_some()).collect();
    assert_eq!(evals.len(), 4);
    let f1s: Vec<f64> = evals.iter().map(|e| e["eval_f1"].as_f64().unwrap()).collect();
    let best_at = (0..4).fold(0, |b, i| if f1s[i] > f1s[b] { i } else { b });
    let best_dir = dir.join("out").join(format!("checkpoint-{}", 30 * (best_at + 1)));
    assert_eq!(trainer.state.best_metric, Some(f1s[best_at]));
    assert_eq!(trainer.state.best_model_checkpoint.as_deref(), Some(best_dir.display().to_string().as_str()));
    assert!(best_dir.join("model.safetensors").is_file(), "rotation keeps the best checkpoint");

    // The model left in the trainer (and exported) is the best checkpoint's.
    let saved = lazytrain_nn::state::load_safetensors(&best_dir.join("model.safetensors"), &device).unwrap();
    for (name, param) in named_parameters(&trainer.model) {
        let value = saved.entries().iter().find(|(n, _)| *n == name).map(|(_, t)| t.to_vec::<f32>().unwrap());
        assert_eq!(value, Some(param.to_vec::<f32>().unwrap()), "{name}");
    }
    let metrics = trainer.evaluate().unwrap();
    assert!((metrics.macro_f1.unwrap() - f1s[best_at]).abs() < 1e-9, "the best model evaluates as it did");
    assert_eq!(metrics.count, open(&dir, "validation").len() as u64);
    assert!(metrics.perplexity.is_none());

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/config.json")).unwrap()).unwrap();
    assert_eq!(config["id2label"], serde_json::json!({"0": "negative", "1": "positive"}));
    assert_eq!(config["label2id"], serde_json::json!({"negative": 0, "positive": 1}));
    assert_eq!(config["architectures"], serde_json::json!(["BertForSequenceClassification"]));

    let pipe = TextClassification::from_dir(&dir.join("out"), &device).unwrap();
    let texts = ["the hotel in rome was lovely .", "our trip was awful ."];
    let predicted = pipe.predict(&texts, 2).unwrap();
    let ids = tok.encode(texts[0], true).unwrap().into_iter().map(i64::from).collect::<Vec<_>>();
    let n = ids.len();
    let input = lazytrain_core::Tensor::from_vec(ids, [1, n], &device).unwrap();
    let logits = trainer.model.forward(&input, None, None, &Context::eval()).unwrap().softmax(-1).unwrap();
    let probabilities = logits.to_vec::<f32>().unwrap();
    let top = &predicted[0][0];
    let top_id = if top.label == "negative" { 0 } else { 1 };
    assert!((top.score - probabilities[top_id]).abs() < 1e-6 && top.score >= 0.5, "{top:?} vs {probabilities:?}");
    assert!((predicted[0].iter().map(|l| l.score).sum::<f32>() - 1.0).abs() < 1e-5);
}

#[test]
fn classification_data_and_models_must_agree() {
    let (dir, tok, manifest) = data("agree");
    let device = Device::cpu();
    let three: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let args = TrainingArguments { output_dir: dir.join("out").display().to_string(), ..TrainingArguments::default() };
    let err = Trainer::for_classification(
        args.clone(),
        classifier(&tok, &three, &device),
        tok.clone(),
        open(&dir, "train"),
        None,
        &manifest,
        &device,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("3 outputs but the data has 2 labels (negative, positive)"), "{err}");
    // Text pairs whose second text a BERT tokenizer gives token type 1, for a
    // model of one token type (RoBERTa's): refused before the first step.
    let mut pairs = manifest.clone();
    pairs.columns.text_pair = Some("second".into());
    let mut one_type = tiny_classifier_config(&tok, &manifest.labels);
    one_type.type_vocab_size = 1;
    let model = ForSequenceClassification::new(&mut Initializer::new(3, &device), &one_type, 2).unwrap();
    let err = Trainer::for_classification(args.clone(), model, tok.clone(), open(&dir, "train"), None, &pairs, &device)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("token type 1, but the model has type_vocab_size 1"), "{err}");
    let best = TrainingArguments { load_best_model_at_end: true, ..args.clone() };
    let err = best.validate(true).unwrap_err().to_string();
    assert!(err.contains("load_best_model_at_end needs eval_strategy and save_strategy to match"), "{err}");
    let steps = TrainingArguments {
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(4),
        save_steps: 6,
        ..best.clone()
    };
    let err = steps.validate(true).unwrap_err().to_string();
    assert!(err.contains("save_steps (6) to be a multiple of eval_steps (4)"), "{err}");
    let unknown = TrainingArguments {
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(2),
        max_steps: 2,
        per_device_train_batch_size: 8,
        metric_for_best_model: "recall".into(),
        ..args
    };
    // Refused when the trainer is built, not at the first evaluation.
    let err = Trainer::for_classification(
        unknown,
        classifier(&tok, &manifest.labels, &device),
        tok,
        open(&dir, "train"),
        Some(open(&dir, "validation")),
        &manifest,
        &device,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains(
            "metric_for_best_model `recall` is not among this task's eval metrics (eval_loss, eval_accuracy, eval_f1)"
        ),
        "{err}"
    );
}

fn lazytrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lazytrain"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn the_cli_prepares_fine_tunes_and_classifies() {
    let (dir, _, _) = data("cli");
    let csv = dir.join("extra.csv");
    std::fs::write(
        &csv,
        "sentence,stars\nthe hotel was lovely,pos\nbad row\nthe food was awful,neg\nthe park was great,pos\n",
    )
    .unwrap();
    let prepared = run_ok(
        lazytrain()
            .args(["prepare-classification", "--tokenizer"])
            .arg(dir.join("tokenizer"))
            .arg("--files")
            .arg(&csv)
            .args(["--text-column", "sentence", "--label-column", "stars", "--max-length", "24", "--buckets", "8,16"])
            .args(["--skip-bad-rows", "--validation-fraction", "0", "--num-shards", "1", "--output"])
            .arg(dir.join("extra")),
    );
    assert!(prepared.contains("3 rows") && prepared.contains("skipped 1 bad rows: MissingColumn"), "{prepared}");
    assert!(prepared.contains("buckets [8, 16, 24]"), "{prepared}");

    // Training on `data`, evaluating on `eval`, into `out`.
    let train_into = |eval: &str, out: &str, extra: &[&str]| {
        let mut cmd = lazytrain();
        cmd.args(["train", "--task", "sequence-classification", "--model", "bert-tiny", "--tokenizer"])
            .arg(dir.join("tokenizer"))
            .arg("--train-data")
            .arg(dir.join("data"))
            .arg("--eval-data")
            .arg(dir.join(eval))
            .arg("--output-dir")
            .arg(dir.join(out))
            .args(["--max-steps", "4", "--per-device-train-batch-size", "8", "--do-eval", "true"])
            .args(extra);
        cmd
    };
    let train = |extra: &[&str]| train_into("data", "model", extra);
    let err = train(&["--num-labels", "3"]).output().unwrap();
    assert!(!err.status.success());
    let msg = String::from_utf8_lossy(&err.stderr);
    assert!(msg.contains("--num-labels 3 but") && msg.contains("has 2 labels (negative, positive)"), "{msg}");
    // Eval data prepared on its own, with other labels: refused, not scored
    // against the wrong classes.
    let other = train_into("extra", "mixed", &[]).output().unwrap();
    let msg = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success() && msg.contains("has the labels (neg, pos)"), "{msg}");
    assert!(msg.contains("has (negative, positive)") && msg.contains("--validation-files"), "{msg}");
    let trained = run_ok(&mut train(&["--num-labels", "2"]));
    assert!(trained.contains("trained 4 steps") && trained.contains("macro-F1"), "{trained}");

    let json = run_ok(
        lazytrain()
            .args(["text-classification", "--json", "--top-k", "2", "--model"])
            .arg(dir.join("model"))
            .arg("our trip was lovely ."),
    );
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let labels = value.as_array().unwrap();
    assert_eq!(labels.len(), 2, "{value}");
    let total: f64 = labels.iter().map(|l| l["score"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-5 && labels[0]["score"].as_f64() >= labels[1]["score"].as_f64(), "{value}");
    let mut names: Vec<&str> = labels.iter().map(|l| l["label"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["negative", "positive"]);

    let mlm = lazytrain()
        .args(["train", "--model", "bert-tiny", "--tokenizer"])
        .arg(dir.join("tokenizer"))
        .arg("--train-data")
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&mlm.stderr);
    assert!(msg.contains("--task sequence-classification"), "MLM training on labelled data says what to do: {msg}");
}
