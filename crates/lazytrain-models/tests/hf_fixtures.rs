//! BERT and RoBERTa against `transformers` (fixtures/gen_fixtures.py):
//! logits and hidden states for single and padded batched inputs, a 20-step
//! training trajectory, checkpoint round trips and checkpoint errors.

use lazytrain_core::{DType, Device, Tensor};
use lazytrain_models::hub::{load_masked_lm, load_sequence_classifier, load_weights, save_pretrained};
use lazytrain_models::{ForMaskedLM, ModelConfig, ModelError, Result};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup};
use lazytrain_nn::state::{load_safetensors, save_safetensors, StateDict};
use lazytrain_nn::{named_parameters, Context};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn json(path: PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    assert!(worst <= tol, "{what}: max abs difference {worst} > {tol}");
}

fn check_masked_lm(name: &str) -> Result<()> {
    let dev = Device::cpu();
    let (model, warnings) = load_masked_lm(&fixture(name), &dev)?;
    assert!(warnings.is_empty(), "{warnings:?}");
    let out = json(fixture(name).join("outputs.json"));
    let ctx = Context::eval();
    let single = Tensor::from_vec(ints(&out["single_ids"]), [1, 7], &dev)?;
    let hidden = model.model.forward(&single, None, None, &ctx)?;
    let logits = model.head(&hidden)?;
    assert_close(&logits.to_vec::<f32>()?, &floats(&out["single_logits"]), 1e-4, "single logits");
    assert_close(&hidden.to_vec::<f32>()?, &floats(&out["single_hidden"]), 1e-4, "single hidden");
    let batch = Tensor::from_vec(ints(&out["batch_ids"]), [2, 7], &dev)?;
    let mask = Tensor::from_vec(ints(&out["batch_mask"]), [2, 7], &dev)?;
    let types = match &out["batch_types"] {
        Value::Null => None,
        v => Some(Tensor::from_vec(ints(v), [2, 7], &dev)?),
    };
    let hidden = model.model.forward(&batch, Some(&mask), types.as_ref(), &ctx)?;
    let logits = model.head(&hidden)?;
    assert_close(&logits.to_vec::<f32>()?, &floats(&out["batch_logits"]), 1e-4, "batch logits");
    assert_close(&hidden.to_vec::<f32>()?, &floats(&out["batch_hidden"]), 1e-4, "batch hidden");
    Ok(())
}

#[test]
fn bert_masked_lm_matches_transformers() -> Result<()> {
    check_masked_lm("tiny-bert")
}

#[test]
fn roberta_masked_lm_matches_transformers() -> Result<()> {
    check_masked_lm("tiny-roberta")
}

#[test]
fn bert_sequence_classification_matches_transformers() -> Result<()> {
    let dev = Device::cpu();
    // Loaded as a masked LM, the classifier's folder is named for what it is.
    let err = load_masked_lm(&fixture("tiny-bert-cls"), &dev).err().expect("no masked-LM head").to_string();
    assert!(err.contains("missing: cls.predictions"), "{err}");
    assert!(err.contains("holds a BertForSequenceClassification") && err.contains("text-classification"), "{err}");
    let (model, warnings) = load_sequence_classifier(&fixture("tiny-bert-cls"), 3, 0, &dev)?;
    assert!(warnings.is_empty(), "{warnings:?}");
    let out = json(fixture("tiny-bert-cls").join("outputs.json"));
    let ids = Tensor::from_vec(ints(&out["batch_ids"]), [2, 6], &dev)?;
    let mask = Tensor::from_vec(ints(&out["batch_mask"]), [2, 6], &dev)?;
    let logits = model.forward(&ids, Some(&mask), None, &Context::eval())?;
    assert_close(&logits.to_vec::<f32>()?, &floats(&out["logits"]), 1e-4, "classifier logits");
    Ok(())
}

#[test]
fn training_trajectory_matches_pytorch() -> Result<()> {
    let dev = Device::cpu();
    let dir = fixture("tiny-bert");
    let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
    config.hidden_dropout_prob = 0.0;
    config.attention_probs_dropout_prob = 0.0;
    let model = ForMaskedLM::new(&mut Initializer::new(0, &dev), &config)?;
    load_weights(&model, config.model_type, &dir.join("model.safetensors"), &dev, &|_| false)?;
    let run = json(fixture("bert-train.json"));
    let group = ParamGroup { params: named_parameters(&model), weight_decay: run["weight_decay"].as_f64().unwrap() };
    let mut opt = AdamW::new(vec![group], AdamWConfig { lr: run["lr"].as_f64().unwrap(), ..Default::default() })?;
    let ctx = Context::train(&dev, 0, 0)?;
    for (step, batch) in run["batches"].as_array().unwrap().iter().enumerate() {
        let ids = Tensor::from_vec(ints(&batch["input_ids"]), [2, 8], &dev)?;
        let labels = Tensor::from_vec(ints(&batch["labels"]), [2, 8], &dev)?;
        let loss = model.loss(&model.forward(&ids, None, None, &ctx)?, &labels)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        dev.mark_step()?;
        let (got, want) = (loss.item::<f32>()? as f64, run["losses"][step].as_f64().unwrap());
        assert!((got - want).abs() <= 1e-3 * want.abs(), "step {step}: loss {got}, PyTorch {want}");
    }
    assert_eq!(dev.metrics().compiles, 2, "weight loading, then one step graph");
    Ok(())
}

/// A fresh scratch folder, removed when the test passes.
fn tmp(name: &str) -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new(&format!("models-{name}")).unwrap()
}

#[test]
fn save_then_load_is_bit_identical() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_masked_lm(&fixture("tiny-roberta"), &dev)?;
    let dir = tmp("roundtrip");
    save_pretrained(&dir, &model, model.config())?;
    let (again, warnings) = load_masked_lm(&dir, &dev)?;
    assert!(warnings.is_empty());
    assert_eq!(again.config(), model.config());
    for ((name, a), (_, b)) in named_parameters(&model).iter().zip(named_parameters(&again).iter()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{name}");
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    assert!(header.contains("\"format\":\"pt\""));
    assert!(!header.contains("decoder") && !header.contains("position_ids"), "{header}");
    Ok(())
}

fn write_folder(name: &str, config: &str, weights_from: Option<&Path>) -> lazytrain_core::ScratchDir {
    let dir = tmp(name);
    std::fs::write(dir.join("config.json"), config).unwrap();
    if let Some(src) = weights_from {
        std::fs::copy(src, dir.join("model.safetensors")).unwrap();
    }
    dir
}

#[test]
fn bad_checkpoints_are_clear_errors() {
    let dev = Device::cpu();
    let good_config = std::fs::read_to_string(fixture("tiny-bert/config.json")).unwrap();
    let weights = fixture("tiny-bert/model.safetensors");

    let t5 = good_config.replace("\"model_type\": \"bert\"", "\"model_type\": \"t5\"");
    let msg = load_masked_lm(&write_folder("t5", &t5, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("model_type") && msg.contains("\"bert\", \"roberta\" or \"gpt2\""), "{msg}");
    let gpt = good_config.replace("\"model_type\": \"bert\"", "\"model_type\": \"gpt2\"");
    let msg = load_masked_lm(&write_folder("gpt", &gpt, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("GPT-2 is a causal decoder"), "{msg}");

    let missing = good_config.replace("\"hidden_size\": 32,", "");
    let msg = load_masked_lm(&write_folder("missing", &missing, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("hidden_size"), "{msg}");

    let wider = good_config.replace("\"intermediate_size\": 37", "\"intermediate_size\": 40");
    let err = load_masked_lm(&write_folder("wider", &wider, Some(&weights)), &dev).err().unwrap();
    let ModelError::Checkpoint { problems, .. } = &err else { panic!("{err}") };
    assert_eq!(problems.len(), 6, "two layers x (intermediate weight, bias, output weight): {err}");
    assert!(
        err.to_string().contains("intermediate.dense.weight: the model has f32[40, 32], the checkpoint f32[37, 32]"),
        "{err}"
    );

    for (field, expected) in [
        ("\"position_embedding_type\": \"relative_key\"", "position_embedding_type `relative_key` is not supported"),
        ("\"tie_word_embeddings\": false", "tie_word_embeddings = false"),
        ("\"problem_type\": \"ranking\"", "problem_type `ranking`; choose one of"),
    ] {
        let config = good_config.replace("\"tie_word_embeddings\": true,", "").replacen('{', &format!("{{{field},"), 1);
        let msg =
            load_masked_lm(&write_folder("unsupported", &config, Some(&weights)), &dev).err().unwrap().to_string();
        assert!(msg.contains(expected), "{field}: {msg}");
    }

    let no_types = good_config.replace("\"type_vocab_size\": 2", "\"type_vocab_size\": 0");
    assert_ne!(no_types, good_config);
    let msg = load_masked_lm(&write_folder("no-types", &no_types, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("type_vocab_size must be at least 1"), "{msg}");

    // One mistyped size is refused before the model is built, not after
    // allocating it and listing every tensor as missing.
    let deep = good_config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 100000");
    assert_ne!(deep, good_config);
    let msg = load_masked_lm(&write_folder("deep", &deep, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("num_hidden_layers 100000") && msg.contains("too few to hold them"), "{msg}");
    for (from, to, expected) in [
        ("\"layer_norm_eps\": 1e-12", "\"layer_norm_eps\": -1", "layer_norm_eps -1 must be a small positive number"),
        ("\"hidden_dropout_prob\": 0.1", "\"hidden_dropout_prob\": 1.5", "hidden_dropout_prob 1.5 is not in [0, 1)"),
    ] {
        let bad = good_config.replace(from, to);
        assert_ne!(bad, good_config, "{from}");
        let msg = load_masked_lm(&write_folder("numbers", &bad, Some(&weights)), &dev).err().unwrap().to_string();
        assert!(msg.contains(expected), "{msg}");
    }
    let labels = good_config.replacen('{', "{\"id2label\": {\"0\": \"A\", \"1\": \"B\", \"5\": \"C\"},", 1);
    let msg = load_masked_lm(&write_folder("labels", &labels, Some(&weights)), &dev).err().unwrap().to_string();
    assert!(msg.contains("id2label's keys must be the label ids 0 to 2 (one per label), found \"5\""), "{msg}");

    let dir = write_folder("truncated", &good_config, Some(&weights));
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let msg = load_masked_lm(&dir, &dev).err().unwrap().to_string();
    assert!(msg.contains("truncated or corrupt"), "{msg}");
}

/// Old BERT checkpoints name LayerNorm parameters `gamma`/`beta`; they
/// load as `weight`/`bias` (as HF renames them) and give the same logits.
#[test]
fn legacy_layer_norm_names_load() -> Result<()> {
    let dev = Device::cpu();
    let state = load_safetensors(&fixture("tiny-bert/model.safetensors"), &dev)?;
    let mut renamed = StateDict::new();
    for (name, tensor) in state.entries() {
        let name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta");
        renamed.push(name, tensor.clone());
    }
    assert!(renamed.names().iter().any(|n| n.ends_with("LayerNorm.gamma")));
    let dir = write_folder("legacy", &std::fs::read_to_string(fixture("tiny-bert/config.json")).unwrap(), None);
    save_safetensors(&dir.join("model.safetensors"), &renamed, &[])?;
    let (legacy, warnings) = load_masked_lm(&dir, &dev)?;
    assert!(warnings.is_empty(), "{warnings:?}");
    let (model, _) = load_masked_lm(&fixture("tiny-bert"), &dev)?;
    let ids = Tensor::from_vec(vec![2i64, 17, 3, 9], [1, 4], &dev)?;
    let ctx = Context::eval();
    let logits = |m: &ForMaskedLM| m.forward(&ids, None, None, &ctx).and_then(|l| Ok(l.to_vec::<f32>()?));
    assert_eq!(logits(&legacy)?, logits(&model)?);
    Ok(())
}

#[test]
fn presets_have_the_stated_sizes() -> Result<()> {
    let tiny = ModelConfig::preset("bert-tiny", 1000)?;
    assert_eq!(
        (tiny.num_hidden_layers, tiny.hidden_size, tiny.intermediate_size, tiny.num_attention_heads),
        (2, 128, 512, 2)
    );
    let base = ModelConfig::preset("roberta-base", 50265)?;
    assert_eq!(
        (base.num_hidden_layers, base.hidden_size, base.pad_token_id, base.max_position_embeddings),
        (12, 768, 1, 514)
    );
    assert!(ModelConfig::preset("bert-huge", 10).unwrap_err().to_string().contains("choose one of"));
    Ok(())
}

#[test]
fn malformed_inputs_are_errors_not_panics() {
    let dev = Device::cpu();
    let (model, _) = load_masked_lm(&fixture("tiny-bert"), &dev).unwrap();
    let ctx = Context::eval();
    let flat = Tensor::from_vec(vec![2i64, 17, 3], [3], &dev).unwrap();
    let msg = model.forward(&flat, None, None, &ctx).err().unwrap().to_string();
    assert!(msg.contains("[batch, seq]") && msg.contains("i64[3]"), "{msg}");
    let long = Tensor::from_vec(vec![5i64; 100], [1, 100], &dev).unwrap();
    let msg = model.forward(&long, None, None, &ctx).err().unwrap().to_string();
    assert!(msg.contains("100 tokens exceed the model's 64 positions"), "{msg}");
    let ids = Tensor::from_vec(vec![2i64, 17, 3], [1, 3], &dev).unwrap();
    let bad_mask = Tensor::from_vec(vec![1i64, 1], [1, 2], &dev).unwrap();
    assert!(model.forward(&ids, Some(&bad_mask), None, &ctx).is_err());
    // The public pieces check their own inputs too.
    let hidden = Tensor::zeros([3, 32], DType::F32, &dev).unwrap();
    let msg = model.head(&hidden).err().unwrap().to_string();
    assert!(msg.contains("[batch, seq, hidden]") && msg.contains("[3, 32]"), "{msg}");
    assert!(model.model.pool(&hidden).err().unwrap().to_string().contains("[batch, seq, hidden]"));
    let msg = model.model.embeddings.forward(&flat, None, &ctx).err().unwrap().to_string();
    assert!(msg.contains("input_ids must be [batch, seq]"), "{msg}");
}
