//! GPT-2 against `transformers` (fixtures/gen_gpt2_fixtures.py): logits
//! for single and padded batches, checkpoints with and without the
//! `transformer.` prefix, greedy generation through the KV cache, a
//! 20-step training trajectory, and round trips of weights and config.

use lazytrain_core::{Device, Tensor};
use lazytrain_models::generation::{generate, GenerationConfig};
use lazytrain_models::hub::{load_causal_lm, load_masked_lm, load_weights, save_pretrained};
use lazytrain_models::{Gpt2LMHeadModel, ModelConfig, ModelError, ModelType, Result};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup};
use lazytrain_nn::state::load_safetensors;
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

fn worst_difference(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max)
}

#[test]
fn logits_match_transformers() -> Result<()> {
    let dev = Device::cpu();
    let (model, warnings) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    assert!(warnings.is_empty(), "{warnings:?}");
    let out = json(fixture("tiny-gpt2/outputs.json"));
    let ctx = Context::eval();
    let single = Tensor::from_vec(ints(&out["single_ids"]), [1, 7], &dev)?;
    let logits = model.forward(&single, None, &ctx)?.to_vec::<f32>()?;
    let worst = worst_difference(&logits, &floats(&out["single_logits"]));
    assert!(worst <= 1e-4, "single logits differ by {worst}");

    let batch = Tensor::from_vec(ints(&out["batch_ids"]), [2, 7], &dev)?;
    let mask_values = ints(&out["batch_mask"]);
    let mask = Tensor::from_vec(mask_values.clone(), [2, 7], &dev)?;
    let logits = model.forward(&batch, Some(&mask), &ctx)?.to_vec::<f32>()?;
    let want = floats(&out["batch_logits"]);
    let vocab = out["vocab"].as_u64().unwrap() as usize;
    // Padded positions predict nothing; every real position must agree.
    for (position, &keep) in mask_values.iter().enumerate().filter(|(_, &m)| m == 1) {
        let row = position * vocab..(position + 1) * vocab;
        let worst = worst_difference(&logits[row.clone()], &want[row]);
        assert!(worst <= 1e-4, "batch position {position} differs by {worst} (mask {keep})");
    }
    Ok(())
}

#[test]
fn checkpoints_without_the_transformer_prefix_load() -> Result<()> {
    let dev = Device::cpu();
    let (bare, warnings) = load_causal_lm(&fixture("tiny-gpt2-bare"), &dev)?;
    assert!(warnings.is_empty(), "{warnings:?}");
    let (full, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    for ((name, a), (_, b)) in named_parameters(&bare).iter().zip(named_parameters(&full).iter()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{name}");
    }
    // HF's Conv1D layout, [in, out], as the file stores it.
    let file = load_safetensors(&fixture("tiny-gpt2/model.safetensors"), &dev)?;
    let c_attn = file.entries().iter().find(|(n, _)| n == "transformer.h.0.attn.c_attn.weight").unwrap();
    assert_eq!(c_attn.1.dims(), [32, 96]);
    assert_eq!(full.transformer.h[0].attn.c_attn.weight.to_vec::<f32>()?, c_attn.1.to_vec::<f32>()?);
    Ok(())
}

#[test]
fn greedy_generation_matches_transformers_and_compiles_once_per_shape() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let out = json(fixture("tiny-gpt2/outputs.json"));
    let new_tokens = out["greedy_new_tokens"].as_u64().unwrap() as usize;
    let config = GenerationConfig { max_new_tokens: new_tokens, ..GenerationConfig::default() };
    let compiles_before = dev.metrics().compiles;
    for (prompt, want) in out["prompts"].as_array().unwrap().iter().zip(out["greedy"].as_array().unwrap()) {
        let prompt: Vec<u32> = ints(prompt).into_iter().map(|t| t as u32).collect();
        let read_before = dev.metrics().device_to_host_bytes;
        let got = generate(&model, &[prompt], &config, &dev)?;
        let want: Vec<u32> = ints(want).into_iter().map(|t| t as u32).collect();
        assert_eq!(got.tokens, [want]);
        assert_eq!(got.decode_steps, new_tokens - 1);
        // Only the chosen ids come back: one i64 per step, never logits.
        assert_eq!(dev.metrics().device_to_host_bytes - read_before, 8 * new_tokens as u64);
    }
    // Both prompts fall in one bucket: one prefill graph and one decode graph.
    assert_eq!(dev.metrics().compiles - compiles_before, 2, "{:?}", dev.metrics());
    // Both prompts at once, in one batch, give the same continuations.
    let prompts: Vec<Vec<u32>> =
        out["prompts"].as_array().unwrap().iter().map(|p| ints(p).into_iter().map(|t| t as u32).collect()).collect();
    let together = generate(&model, &prompts, &config, &dev)?;
    for (got, want) in together.tokens.iter().zip(out["greedy"].as_array().unwrap()) {
        assert_eq!(got.iter().map(|&t| t as i64).collect::<Vec<_>>(), ints(want));
    }
    Ok(())
}

#[test]
fn sampling_is_seeded_and_respects_top_k() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let prompt = vec![vec![17u32, 45, 9]];
    let sample = |seed: u64, top_k: Option<usize>, top_p: Option<f64>| {
        let config =
            GenerationConfig { max_new_tokens: 12, do_sample: true, top_k, top_p, seed, ..GenerationConfig::default() };
        generate(&model, &prompt, &config, &dev).map(|g| g.tokens[0].clone())
    };
    assert_eq!(sample(7, Some(50), None)?, sample(7, Some(50), None)?, "same seed, same text");
    let runs: Vec<_> = (0..4).map(|seed| sample(seed, Some(50), None)).collect::<Result<_>>()?;
    assert!(runs.windows(2).any(|w| w[0] != w[1]), "different seeds give different text: {runs:?}");
    // top-k 1 and a tiny top-p both leave only the most likely token: greedy.
    let greedy = generate(&model, &prompt, &GenerationConfig { max_new_tokens: 12, ..Default::default() }, &dev)?;
    assert_eq!(sample(3, Some(1), None)?, greedy.tokens[0]);
    assert_eq!(sample(3, None, Some(1e-6))?, greedy.tokens[0]);
    Ok(())
}

#[test]
fn bad_generation_settings_are_refused() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let refuse = |config: GenerationConfig, prompt: Vec<u32>, expect: &str| {
        let err = generate(&model, &[prompt], &config, &dev).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
    };
    let base = GenerationConfig::default();
    refuse(
        GenerationConfig { top_p: Some(0.0), do_sample: true, ..base.clone() },
        vec![1],
        "top_p 0 must be in (0, 1]",
    );
    refuse(GenerationConfig { top_p: Some(1.5), do_sample: true, ..base.clone() }, vec![1], "top_p 1.5");
    refuse(GenerationConfig { temperature: 0.0, ..base.clone() }, vec![1], "temperature 0");
    refuse(GenerationConfig { max_new_tokens: 10, ..base.clone() }, vec![1; 60], "exceeds the model's n_positions 64");
    // A count whose sum with the prompt overflows is refused the same way.
    refuse(
        GenerationConfig { max_new_tokens: usize::MAX, ..base.clone() },
        vec![1; 2],
        "exceeds the model's n_positions 64",
    );
    refuse(base, vec![], "every prompt needs a token");
    Ok(())
}

/// Weights holding a NaN make every logit NaN: generation (greedy and
/// sampled) stops with an error naming the prompt and the token instead of
/// feeding an id past the vocabulary back into the model.
#[test]
fn logits_that_are_not_numbers_stop_generation_by_name() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let (_, norm) = named_parameters(&model).into_iter().find(|(n, _)| n.ends_with("ln_f.weight")).expect("ln_f");
    norm.assign(&Tensor::full(norm.dims().to_vec(), f64::NAN, lazytrain_core::DType::F32, &dev)?)?;
    for do_sample in [false, true] {
        let config = GenerationConfig { max_new_tokens: 4, do_sample, top_k: Some(5), ..Default::default() };
        let err = generate(&model, &[vec![17, 45], vec![9]], &config, &dev).unwrap_err().to_string();
        assert!(err.contains("the model's logits for prompt 1 are NaN at new token 1"), "{err}");
    }
    Ok(())
}

#[test]
fn training_trajectory_matches_pytorch() -> Result<()> {
    let dev = Device::cpu();
    let dir = fixture("tiny-gpt2");
    let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
    config.hidden_dropout_prob = 0.0;
    config.attention_probs_dropout_prob = 0.0;
    config.gpt2.as_mut().unwrap().embd_pdrop = 0.0;
    let model = Gpt2LMHeadModel::new(&mut Initializer::new(0, &dev), &config)?;
    load_weights(&model, config.model_type, &dir.join("model.safetensors"), &dev, &|_| false)?;
    let run = json(fixture("gpt2-train.json"));
    let group = ParamGroup { params: named_parameters(&model), weight_decay: run["weight_decay"].as_f64().unwrap() };
    let mut opt = AdamW::new(vec![group], AdamWConfig { lr: run["lr"].as_f64().unwrap(), ..Default::default() })?;
    let ctx = Context::train(&dev, 0, 0)?;
    for (step, batch) in run["batches"].as_array().unwrap().iter().enumerate() {
        let ids = Tensor::from_vec(ints(&batch["input_ids"]), [2, 8], &dev)?;
        let labels = Tensor::from_vec(ints(&batch["labels"]), [2, 8], &dev)?;
        let loss = model.loss(&model.forward(&ids, None, &ctx)?, &labels)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        dev.mark_step()?;
        let (got, want) = (loss.item::<f32>()? as f64, run["losses"][step].as_f64().unwrap());
        assert!((got - want).abs() <= 1e-3 * want.abs(), "step {step}: loss {got}, PyTorch {want}");
    }
    Ok(())
}

#[test]
fn held_out_loss_matches_transformers() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let out = json(fixture("tiny-gpt2/outputs.json"));
    let ids = ints(&out["held_out_ids"]);
    let ids = Tensor::from_vec(ids.clone(), [1, ids.len()], &dev)?;
    let loss = model.loss(&model.forward(&ids, None, &Context::eval())?, &ids)?.item::<f32>()? as f64;
    let want = out["held_out_loss"].as_f64().unwrap();
    assert!((loss - want).abs() <= 1e-4, "loss {loss}, transformers {want}");
    Ok(())
}

/// A fresh scratch folder, removed when the test passes.
fn tmp(name: &str) -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new(&format!("gpt2-{name}")).unwrap()
}

#[test]
fn save_then_load_is_bit_identical_in_hf_layout() -> Result<()> {
    let dev = Device::cpu();
    let (model, _) = load_causal_lm(&fixture("tiny-gpt2"), &dev)?;
    let dir = tmp("roundtrip");
    save_pretrained(&dir, &model, model.config())?;
    let (again, warnings) = load_causal_lm(&dir, &dev)?;
    assert!(warnings.is_empty());
    assert_eq!(again.config(), model.config());
    for ((name, a), (_, b)) in named_parameters(&model).iter().zip(named_parameters(&again).iter()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{name}");
    }
    let config: Value = json(dir.join("config.json"));
    assert_eq!(config["model_type"], "gpt2");
    assert_eq!(config["n_embd"], 32);
    assert_eq!(config["n_layer"], 2);
    assert_eq!(config["activation_function"], "gelu_new");
    assert!(config.get("hidden_size").is_none(), "GPT-2's own field names: {config}");
    let names: Vec<String> =
        load_safetensors(&dir.join("model.safetensors"), &dev)?.entries().iter().map(|(n, _)| n.clone()).collect();
    assert!(names.contains(&"transformer.h.1.mlp.c_fc.weight".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("lm_head")), "the tied head is not saved: {names:?}");
    Ok(())
}

#[test]
fn gpt2_configs_are_checked_by_name() {
    let refuse = |json: &str, expect: &str| {
        let err = ModelConfig::from_json(json, "config.json").unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
    };
    refuse(r#"{"model_type": "gpt2", "reorder_and_upcast_attn": true}"#, "reorder_and_upcast_attn");
    refuse(r#"{"model_type": "gpt2", "n_embd": 30, "n_head": 4}"#, "multiple of num_attention_heads");
    refuse(r#"{"model_type": "gpt2", "activation_function": "swish"}"#, "swish");
    refuse(r#"{"model_type": "gpt2", "vocab_size": 10, "eos_token_id": 50256}"#, "outside the vocabulary");
    refuse(r#"{"model_type": "gpt2", "tie_word_embeddings": false}"#, "(an lm_head of its own) is not supported");
    refuse("[]", "a config must be a JSON object of settings");
    // A GPT-2 config relabelled as BERT: the null that does not fit is named.
    refuse(
        r#"{"model_type": "bert", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "pad_token_id": null}"#,
        "null here: pad_token_id",
    );
    let config = ModelConfig::from_json(r#"{"model_type": "gpt2"}"#, "config.json").unwrap();
    assert_eq!((config.hidden_size, config.num_hidden_layers, config.vocab_size), (768, 12, 50257), "HF's defaults");
    assert_eq!(config.intermediate_size, 3072);
    // A GPT-2 folder is not an encoder.
    let dev = Device::cpu();
    let err = load_masked_lm(&fixture("tiny-gpt2"), &dev).err().expect("refused");
    assert!(matches!(err, ModelError::Config { .. }) && err.to_string().contains("causal decoder"), "{err}");
}

#[test]
fn presets_follow_hf_gpt2() -> Result<()> {
    let dev = Device::cpu();
    let config = ModelConfig::preset("gpt2-small", 50257)?;
    assert_eq!(config.model_type, ModelType::Gpt2);
    assert_eq!((config.hidden_size, config.num_hidden_layers, config.num_attention_heads), (768, 12, 12));
    assert_eq!(config.max_position_embeddings, 1024);
    let tiny = Gpt2LMHeadModel::new(&mut Initializer::new(0, &dev), &ModelConfig::preset("gpt2-tiny", 1000)?)?;
    let params = named_parameters(&tiny);
    let count: usize = params.iter().map(|(_, t)| t.numel()).sum();
    // wte + wpe + 2 × (ln, c_attn, c_proj, ln, c_fc, c_proj) + ln_f.
    let block = 2 * 128 + 128 * 384 + 384 + 128 * 128 + 128 + 2 * 128 + 128 * 512 + 512 + 512 * 128 + 128;
    assert_eq!(count, 1000 * 128 + 1024 * 128 + 2 * block + 2 * 128);
    // HF's init: c_proj weights have std 0.02/√(2·n_layer), the others 0.02.
    let std = |name: &str| -> f64 {
        let v = params.iter().find(|(n, _)| n == name).unwrap().1.to_vec::<f32>().unwrap();
        (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    };
    assert!((std("transformer.h.0.mlp.c_fc.weight") - 0.02).abs() < 0.001);
    assert!((std("transformer.h.0.mlp.c_proj.weight") - 0.01).abs() < 0.0005);
    Ok(())
}

/// Absurd sizes (a fuzzed `n_embd` of 2^64 − 1) are a config error, not an
/// overflow or an allocation of the impossible.
#[test]
fn absurd_sizes_are_refused() {
    let err = ModelConfig::from_json(r#"{"model_type": "gpt2", "n_embd": 18446744073709551615, "n_head": 1}"#, "c")
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 100000000000 parameters"), "{err}");
    let err = ModelConfig::from_json(
        r#"{"model_type": "bert", "vocab_size": 1000000000, "hidden_size": 1024, "num_hidden_layers": 1,
            "num_attention_heads": 1, "intermediate_size": 4}"#,
        "c",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("is one of them wrong"), "{err}");
}
