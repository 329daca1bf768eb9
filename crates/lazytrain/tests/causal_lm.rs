//! GPT-2 causal-LM training with the Trainer: exact resume, evaluation in
//! next tokens with perplexity, bf16, data-parallel replicas, and the
//! saved folder driving text-generation; `lazytrain demo --task causal-lm`.

use lazytrain::pipelines::TextGeneration;
use lazytrain::trainer::{checkpoint::latest_checkpoint, Control};
use lazytrain::trainer::{run_replicas, IntervalStrategy, Trainer, TrainerCallback, TrainerState, TrainingArguments};
use lazytrain_core::{Device, ScratchDir};
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::{TextTokenizer, TokenizerStyle};
use lazytrain_models::{hub, Gpt2LMHeadModel, ModelConfig};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::named_parameters;
use std::path::Path;
use std::process::Command;

mod common;

use common::open;

fn tmp(name: &str) -> ScratchDir {
    common::tmp("causal", name)
}

/// A GPT-2 style tokenizer and prepared shards (blocks of 16) from the demo corpus.
fn data(name: &str) -> (ScratchDir, TextTokenizer) {
    let dir = tmp(name);
    let docs = demo_corpus(1, 6, 1500).sentences;
    let tok = train_tokenizer(&docs, SubwordModel::Bpe, 300, TokenizerStyle::Gpt2).unwrap();
    let options = PrepareOptions {
        block_size: 16,
        num_shards: 2,
        validation_fraction: 0.05,
        seed: 0,
        progress: false,
        ..Default::default()
    };
    prepare(&tok, &docs, &dir.join("data"), &options).unwrap();
    (dir, tok)
}

/// A 2-layer, 32-wide GPT-2 over the tokenizer, dropout `p` everywhere.
fn small_model(tok: &TextTokenizer, dropout: f64, device: &Device) -> Gpt2LMHeadModel {
    let mut config = ModelConfig::preset("gpt2-tiny", tok.vocab_size()).unwrap();
    config.hidden_size = 32;
    config.num_attention_heads = 2;
    config.intermediate_size = 64;
    config.hidden_dropout_prob = dropout;
    config.attention_probs_dropout_prob = dropout;
    config.gpt2.as_mut().unwrap().embd_pdrop = dropout;
    Gpt2LMHeadModel::new(&mut Initializer::new(7, device), &config).unwrap()
}

fn args(output: &Path) -> TrainingArguments {
    TrainingArguments {
        output_dir: output.display().to_string(),
        max_steps: 6,
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 4,
        gradient_accumulation_steps: 2,
        learning_rate: 3e-3,
        weight_decay: 0.01,
        warmup_steps: 0.2,
        logging_steps: 1,
        save_steps: 3,
        report_to: vec!["jsonl".into()],
        ..TrainingArguments::default()
    }
}

fn trainer(dir: &Path, tok: &TextTokenizer, args: TrainingArguments, device: &Device) -> Trainer<Gpt2LMHeadModel> {
    let model = small_model(tok, 0.1, device);
    Trainer::for_causal_lm(args, model, tok.clone(), open(dir, "train"), Some(open(dir, "validation")), 16, device)
        .unwrap()
}

/// Stops the run after step `at`.
struct StopAt(u64);

impl TrainerCallback for StopAt {
    fn on_step_end(&mut self, state: &TrainerState) -> Control {
        Control { should_stop: state.global_step >= self.0 }
    }
}

fn weights(model: &Gpt2LMHeadModel) -> Vec<Vec<f32>> {
    named_parameters(model).iter().map(|(_, t)| t.to_vec().unwrap()).collect()
}

#[test]
fn a_resumed_causal_run_matches_an_uninterrupted_one_and_its_folder_generates() {
    let (dir, tok) = data("resume");
    let device = Device::cpu();
    let mut full = trainer(&dir, &tok, args(&dir.join("full")), &device);
    let uninterrupted = full.train().unwrap();
    let final_weights = weights(&full.model);
    let eval = full.evaluate().unwrap();
    assert!(eval.to_string().contains("next tokens"), "{eval}");
    assert!((eval.perplexity.unwrap() - eval.loss.exp()).abs() < 1e-9);
    // Every block of 16 predicts its 15 next tokens.
    assert_eq!(eval.count, 15 * open(&dir, "validation").len() as u64);
    assert!(uninterrupted.losses[5] < uninterrupted.losses[0], "it learns: {:?}", uninterrupted.losses);

    let device = Device::cpu();
    let mut first = trainer(&dir, &tok, args(&dir.join("split")), &device);
    first.add_callback(Box::new(StopAt(3)));
    first.train().unwrap();
    drop(first);
    let device = Device::cpu();
    let resume = TrainingArguments { resume_from_checkpoint: Some("true".into()), ..args(&dir.join("split")) };
    let mut second = trainer(&dir, &tok, resume, &device);
    let rest = second.train().unwrap();
    assert_eq!(rest.losses, uninterrupted.losses[3..].to_vec(), "every later loss, bit for bit");
    assert_eq!(weights(&second.model), final_weights, "the final weights, bit for bit");

    let checkpoint = latest_checkpoint(&dir.join("split")).unwrap();
    let (saved, warnings) = hub::load_causal_lm(&checkpoint, &device).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(saved.config().model_type, lazytrain_models::ModelType::Gpt2);
    let pipe = TextGeneration::from_dir(&dir.join("split"), &device).unwrap();
    let (out, stats) = pipe.generate(&["the capital of"], &pipe.config_for(Some(5)).unwrap()).unwrap();
    assert!(out[0][0].generated_text.starts_with("the capital of"), "{out:?}");
    assert!(stats.new_tokens >= 1 && stats.new_tokens <= 5, "{stats:?}");
}

#[test]
fn bf16_causal_training_follows_f32() {
    let (dir, tok) = data("bf16");
    let run = |bf16: bool| {
        let device = Device::cpu();
        let a = TrainingArguments {
            max_steps: 30,
            save_steps: 1000,
            gradient_accumulation_steps: 1,
            per_device_train_batch_size: 8,
            report_to: vec![],
            bf16,
            ..args(&dir.join(format!("out-{bf16}")))
        };
        trainer(&dir, &tok, a, &device).train().unwrap().losses
    };
    let (f32_losses, bf16_losses) = (run(false), run(true));
    assert_ne!(f32_losses, bf16_losses, "bf16 changes the arithmetic");
    for (step, (a, b)) in f32_losses.iter().zip(&bf16_losses).enumerate() {
        assert!((a - b).abs() <= 0.02 * a.abs(), "step {step}: f32 loss {a}, bf16 loss {b}");
    }
}

#[test]
fn two_replicas_train_a_causal_lm_like_one_with_the_whole_batch() {
    let (dir, tok) = data("replicas");
    let train = |replicas: usize| {
        let a = TrainingArguments {
            max_steps: 5,
            per_device_train_batch_size: 8 / replicas,
            gradient_accumulation_steps: 1,
            save_steps: 1000,
            eval_strategy: IntervalStrategy::No,
            num_replicas: replicas,
            report_to: vec![],
            ..args(&dir.join(format!("out-{replicas}")))
        };
        run_replicas(replicas, |device| {
            let model = small_model(&tok, 0.0, device);
            let (train, eval) = (open(&dir, "train"), Some(open(&dir, "validation")));
            let mut trainer = Trainer::for_causal_lm(a.clone(), model, tok.clone(), train, eval, 16, device)?;
            let losses = trainer.train()?.losses;
            Ok((losses, weights(&trainer.model)))
        })
        .unwrap()
    };
    let (one_losses, one_weights) = train(1);
    let (two_losses, two_weights) = train(2);
    for (a, b) in one_losses.iter().zip(&two_losses) {
        assert!((a - b).abs() < 1e-4 * a.abs(), "losses {one_losses:?} vs {two_losses:?}");
    }
    let worst =
        one_weights.iter().flatten().zip(two_weights.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "parameters differ by {worst}");
}

#[test]
fn a_bert_preset_is_not_a_causal_lm_and_gpt2_is_not_a_masked_lm() {
    let (dir, tok) = data("mismatch");
    let out = dir.join("out");
    let cli = |task: &str, model: &str| {
        let tok_dir = dir.join("tokenizer");
        tok.save(&tok_dir, 1024).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
            .args(["train", "--task", task, "--model", model, "--tokenizer"])
            .arg(&tok_dir)
            .arg("--train-data")
            .arg(dir.join("data"))
            .arg("--output-dir")
            .arg(&out)
            .args(["--max-steps", "1", "--per-device-train-batch-size", "2"])
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (ok, err) = cli("causal-lm", "bert-tiny");
    assert!(!ok && err.contains("needs a gpt2 config"), "{err}");
    let (ok, err) = cli("masked-lm", "gpt2-tiny");
    assert!(!ok && err.contains("GPT-2 is a causal decoder") && err.contains("--task causal-lm"), "{err}");
}

#[test]
fn the_causal_demo_answers_its_facts() {
    let out = tmp("demo");
    let run = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .args(["demo", "--task", "causal-lm", "--max-steps", "300", "--sentences", "12000", "--countries", "4"])
        .arg("--output-dir")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("answers correct    4/4"), "{stdout}");
    assert!(stdout.contains("2 graphs compiled for 4 prompts"), "one prefill and one decode graph: {stdout}");
}
