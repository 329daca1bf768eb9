//! Hugging Face model folders: `config.json` + `model.safetensors`, both ways.

use crate::{ForMaskedLM, ForSequenceClassification, Gpt2LMHeadModel, ModelConfig, ModelError, ModelType, Result};
use lazytrain_core::{DType, Device};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::state::{load_safetensors, save_safetensors, StateDict};
use lazytrain_nn::{named_parameters, Module};
use std::path::Path;

/// Checkpoint tensors that are never parameters: tied decoder copies, old
/// `position_ids` buffers and GPT-2's causal-mask buffers (`attn.bias`,
/// `attn.masked_bias`; not `c_attn.bias`, which is a parameter).
fn ignorable(name: &str) -> bool {
    let unprefixed = |suffix: &str| name.ends_with(&format!(".{suffix}")) || name == suffix;
    name.ends_with("position_ids")
        || unprefixed("attn.bias")
        || unprefixed("attn.masked_bias")
        || name == "lm_head.weight"
        || name.ends_with("predictions.decoder.weight")
        || name.ends_with("predictions.decoder.bias")
        || name.ends_with("lm_head.decoder.weight")
        || name.ends_with("lm_head.decoder.bias")
}

/// The name old BERT checkpoints use for a LayerNorm parameter
/// (`LayerNorm.gamma`/`beta`, which HF renames to `weight`/`bias` on load).
fn legacy_layer_norm_name(name: &str) -> Option<String> {
    if let Some(stem) = name.strip_suffix("LayerNorm.weight") {
        return Some(format!("{stem}LayerNorm.gamma"));
    }
    name.strip_suffix("LayerNorm.bias").map(|stem| format!("{stem}LayerNorm.beta"))
}

/// Tensors a model may legitimately leave unused (another head, a pooler),
/// which HF reports as a warning rather than an error.
fn head_or_pooler(name: &str, base: &str) -> bool {
    let name = name.strip_prefix(&format!("{base}.")).unwrap_or(name);
    ["pooler.", "cls.", "lm_head.", "classifier."].iter().any(|p| name.starts_with(p))
}

/// Load `weights` (a safetensors file with HF names, with or without the
/// `bert.`/`roberta.`/`transformer.` prefix) into `module`. Every missing, unexpected or
/// mis-shaped tensor is listed in one error; an unused pooler or head is
/// returned as a warning, as is a missing parameter for which `fresh(name)`
/// is true (it keeps its initial value). Half-precision checkpoints are
/// widened to f32.
pub fn load_weights(
    module: &dyn Module,
    model_type: ModelType,
    weights: &Path,
    device: &Device,
    fresh: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let file = load_safetensors(weights, device)?;
    let base = model_type.weights_prefix();
    let prefix = format!("{base}.");
    let own = named_parameters(module);
    let mut used = vec![false; file.len()];
    let position = |name: &str| file.entries().iter().position(|(n, _)| n == name);
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut assignments = Vec::new();
    let lookup = |name: &str| {
        position(name)
            .or_else(|| name.strip_prefix(&prefix).and_then(position))
            .or_else(|| position(&format!("{prefix}{name}")))
    };
    for (name, param) in &own {
        let found = lookup(name).or_else(|| legacy_layer_norm_name(name).and_then(|old| lookup(&old)));
        let Some(k) = found else {
            if fresh(name) {
                warnings.push(format!("{name} is not in the checkpoint and was newly initialised"));
            } else {
                problems.push(format!("  missing: {name} (expected {}{})", param.dtype(), param.shape()));
            }
            continue;
        };
        used[k] = true;
        let value = &file.entries()[k].1;
        if value.shape() != param.shape() || !value.dtype().is_float() {
            let what = if value.shape() == param.shape() { "wrong dtype (not a float)" } else { "wrong shape" };
            problems.push(format!(
                "  {what}: {name}: the model has {}{}, the checkpoint {}{}",
                param.dtype(),
                param.shape(),
                value.dtype(),
                value.shape()
            ));
            continue;
        }
        assignments.push((param.clone(), value.clone()));
    }
    for ((name, value), used) in file.entries().iter().zip(used) {
        if used || ignorable(name) {
            continue;
        }
        if head_or_pooler(name, base) {
            warnings.push(format!("unused weight {name} ({}{}) was not loaded", value.dtype(), value.shape()));
        } else {
            problems.push(format!("  unexpected: {name} ({}{})", value.dtype(), value.shape()));
        }
    }
    if !problems.is_empty() {
        lazytrain_nn::state::shorten_problems(&mut problems);
        return Err(ModelError::Checkpoint { path: weights.display().to_string(), problems });
    }
    for (param, value) in assignments {
        param.assign(&value.cast(DType::F32)?)?;
    }
    device.sync()?;
    Ok(warnings)
}

/// Write `config.json` and `model.safetensors` (metadata `format: pt`, no
/// tied decoder copy, no buffers) into `dir`, creating it.
pub fn save_pretrained(dir: &Path, module: &dyn Module, config: &ModelConfig) -> Result<()> {
    let io = |e: std::io::Error| ModelError::Io { path: dir.display().to_string(), detail: e.to_string() };
    std::fs::create_dir_all(dir).map_err(io)?;
    let state: StateDict = named_parameters(module).into_iter().collect();
    save_safetensors(&dir.join("model.safetensors"), &state, &[("format", "pt")])?;
    lazytrain_nn::state::write_atomically(&dir.join("config.json"), config.to_json().as_bytes())?;
    Ok(())
}

/// Refuse a folder whose `config.json` describes far more parameters than
/// its `model.safetensors` can hold (two bytes a value, the narrowest float
/// a checkpoint stores) before the model is built: one mistyped size
/// (`num_hidden_layers: 100000`) would otherwise allocate and initialise
/// gigabytes only to find every tensor missing. A missing file is left to
/// the load, which names it, and a folder of the other family (a decoder
/// where `wanted` is an encoder, `Bert` or `Roberta`, or the reverse) to the
/// model's constructor, which says which class loads it.
fn check_weights_hold(dir: &Path, config: &ModelConfig, wanted: ModelType) -> Result<()> {
    let decoder = |t: ModelType| t == ModelType::Gpt2;
    if decoder(config.model_type) != decoder(wanted) {
        return Ok(());
    }
    let Ok(file) = std::fs::metadata(dir.join("model.safetensors")) else { return Ok(()) };
    let parameters = config.parameter_count().unwrap_or(usize::MAX);
    if (parameters as u64).saturating_mul(2) <= file.len() {
        return Ok(());
    }
    Err(ModelError::Config {
        path: dir.join("config.json").display().to_string(),
        detail: format!(
            "the sizes describe about {parameters} parameters (num_hidden_layers {}, hidden_size {}, intermediate_size \
             {}, vocab_size {}), but model.safetensors has {} bytes, too few to hold them: the config and the \
             weights disagree; is one of the sizes wrong?",
            config.num_hidden_layers,
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
            file.len()
        ),
    })
}

/// Read a folder's `config.json`.
pub fn load_config(dir: &Path) -> Result<ModelConfig> {
    ModelConfig::from_file(&dir.join("config.json"))
}

/// A masked-LM model from a Hugging Face folder; returns it with the load warnings.
pub fn load_masked_lm(dir: &Path, device: &Device) -> Result<(ForMaskedLM, Vec<String>)> {
    let config = load_config(dir)?;
    check_weights_hold(dir, &config, ModelType::Bert)?;
    let model = ForMaskedLM::new(&mut Initializer::new(0, device), &config)?;
    let warnings = load_weights(&model, config.model_type, &dir.join("model.safetensors"), device, &|_| false)
        .map_err(|e| name_a_classifier(e, &config))?;
    Ok((model, warnings))
}

/// A masked-LM load that failed on a sequence classifier's folder (no
/// masked-LM head) says what the folder holds and what reads it.
fn name_a_classifier(error: ModelError, config: &ModelConfig) -> ModelError {
    let classifier = config.architectures.iter().find(|a| a.ends_with("ForSequenceClassification"));
    match (error, classifier) {
        (ModelError::Checkpoint { path, mut problems }, Some(class)) => {
            problems.push(format!(
                "  config.json says this folder holds a {class}: a sequence classifier, without a masked-LM head; \
                 run it with `lazytrain text-classification`"
            ));
            ModelError::Checkpoint { path, problems }
        }
        (error, _) => error,
    }
}

/// A GPT-2 LM from a Hugging Face folder (saved by `GPT2LMHeadModel` or
/// `GPT2Model`, with or without the `transformer.` prefix); returns it with
/// the load warnings.
pub fn load_causal_lm(dir: &Path, device: &Device) -> Result<(Gpt2LMHeadModel, Vec<String>)> {
    let config = load_config(dir)?;
    check_weights_hold(dir, &config, ModelType::Gpt2)?;
    let model = Gpt2LMHeadModel::new(&mut Initializer::new(0, device), &config)?;
    let warnings = load_weights(&model, config.model_type, &dir.join("model.safetensors"), device, &|_| false)?;
    Ok((model, warnings))
}

/// A sequence classifier from a Hugging Face folder. A pretrained encoder
/// without a classification head (e.g. a masked-LM export) gets a fresh head
/// and pooler initialised from `seed`, reported in the warnings.
pub fn load_sequence_classifier(
    dir: &Path,
    num_labels: usize,
    seed: u64,
    device: &Device,
) -> Result<(ForSequenceClassification, Vec<String>)> {
    classifier_from(dir, load_config(dir)?, num_labels, seed, device)
}

/// A sequence classifier over `labels` (names in id order) from a folder:
/// its encoder weights, and its head when the folder has one of the right
/// size; the config gets the label names (`id2label`, `label2id`).
pub fn load_sequence_classifier_for_labels(
    dir: &Path,
    labels: &[String],
    seed: u64,
    device: &Device,
) -> Result<(ForSequenceClassification, Vec<String>)> {
    classifier_from(dir, load_config(dir)?.with_labels(labels), labels.len(), seed, device)
}

fn classifier_from(
    dir: &Path,
    config: ModelConfig,
    num_labels: usize,
    seed: u64,
    device: &Device,
) -> Result<(ForSequenceClassification, Vec<String>)> {
    check_weights_hold(dir, &config, ModelType::Bert)?;
    let model = ForSequenceClassification::new(&mut Initializer::new(seed, device), &config, num_labels)?;
    let fresh = |name: &str| name.contains("classifier.") || name.contains("pooler.");
    let warnings = load_weights(&model, config.model_type, &dir.join("model.safetensors"), device, &fresh)?;
    Ok((model, warnings))
}
