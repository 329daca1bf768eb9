//! State dicts and safetensors files: round trips, resumable optimizers and
//! clear errors for checkpoints that do not fit.

use lazytrain_core::{Device, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{decay_groups, AdamW, AdamWConfig, Optimizer};
use lazytrain_nn::state::{load_safetensors, load_state_dict, save_safetensors, state_dict, StateDict};
use lazytrain_nn::{named_parameters, LayerNorm, Linear, Module, NnError, Result};

struct Net {
    dense: Linear,
    norm: LayerNorm,
}

impl Net {
    fn new(seed: u64, dev: &Device) -> Result<Net> {
        let mut init = Initializer::new(seed, dev);
        Ok(Net { dense: Linear::new(&mut init, 4, 3, true)?, norm: LayerNorm::new(&mut init, 3, 1e-12)? })
    }

    fn loss(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.norm.forward(&self.dense.forward(x)?)?.square()?.mean_all()?.add(&self.dense.weight.sum_all()?)?)
    }
}

impl Module for Net {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.dense.visit_parameters(&format!("{prefix}dense."), visit);
        self.norm.visit_parameters(&format!("{prefix}LayerNorm."), visit);
    }
}

/// A fresh scratch folder, removed when the test passes.
fn scratch() -> lazytrain_core::ScratchDir {
    lazytrain_core::ScratchDir::new("nn-state").unwrap()
}

#[test]
fn module_state_round_trips_through_safetensors() -> Result<()> {
    let dev = Device::cpu();
    let a = Net::new(1, &dev)?;
    let b = Net::new(2, &dev)?;
    let dir = scratch();
    let path = dir.join("model.safetensors");
    save_safetensors(&path, &state_dict(&a), &[("format", "pt")])?;
    let loaded = load_safetensors(&path, &dev)?;
    let mut names = loaded.names();
    names.sort();
    assert_eq!(names, vec!["LayerNorm.bias", "LayerNorm.weight", "dense.bias", "dense.weight"]);
    load_state_dict(&b, &loaded)?;
    for ((_, x), (_, y)) in named_parameters(&a).iter().zip(named_parameters(&b).iter()) {
        assert_eq!(x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    }
    let header_len = u64::from_le_bytes(std::fs::read(&path).unwrap()[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(std::fs::read(&path).unwrap()[8..8 + header_len].to_vec()).unwrap();
    assert!(header.contains("\"format\":\"pt\""), "{header}");
    Ok(())
}

#[test]
fn mismatched_state_lists_every_problem() -> Result<()> {
    let dev = Device::cpu();
    let net = Net::new(1, &dev)?;
    let mut bad = StateDict::new();
    for (name, t) in named_parameters(&net) {
        match name.as_str() {
            "dense.bias" => {}
            "LayerNorm.weight" => bad.push(name, Tensor::from_vec(vec![1f32; 5], [5], &dev)?),
            _ => bad.push(name, t),
        }
    }
    bad.push("pooler.dense.weight".into(), Tensor::from_vec(vec![0f32; 4], [2, 2], &dev)?);
    let err = load_state_dict(&net, &bad).unwrap_err();
    let NnError::StateMismatch { problems, .. } = &err else { panic!("{err}") };
    assert_eq!(problems.len(), 3, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("missing: dense.bias (expected f32[3])"), "{msg}");
    assert!(msg.contains("wrong shape: LayerNorm.weight: expected f32[3], found f32[5]"), "{msg}");
    assert!(msg.contains("unexpected: pooler.dense.weight (f32[2, 2])"), "{msg}");
    Ok(())
}

#[test]
fn truncated_and_missing_files_are_clear_errors() -> Result<()> {
    let dev = Device::cpu();
    let dir = scratch();
    let path = dir.join("truncated.safetensors");
    save_safetensors(&path, &state_dict(&Net::new(1, &dev)?), &[])?;
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let msg = load_safetensors(&path, &dev).err().unwrap().to_string();
    assert!(msg.contains("truncated.safetensors") && msg.contains("truncated or corrupt"), "{msg}");
    let msg = load_safetensors(&dir.join("absent.safetensors"), &dev).err().unwrap().to_string();
    assert!(msg.contains("absent.safetensors") && msg.contains("cannot read"), "{msg}");
    Ok(())
}

/// Train `steps` AdamW steps, optionally checkpointing and restoring into a
/// fresh model and optimizer halfway; returns the final weights.
fn train(steps: usize, resume_at: Option<usize>) -> Result<Vec<f32>> {
    let dev = Device::cpu();
    let x = Tensor::from_vec((0..8).map(|i| i as f32 * 0.1).collect(), [2, 4], &dev)?;
    let mut net = Net::new(5, &dev)?;
    let config = AdamWConfig { lr: 0.05, ..Default::default() };
    let mut opt = AdamW::new(decay_groups(named_parameters(&net), 0.01), config)?;
    for step in 0..steps {
        if Some(step) == resume_at {
            let dir = scratch();
            let (model_path, opt_path) = (dir.join("resume-model.safetensors"), dir.join("resume-opt.safetensors"));
            save_safetensors(&model_path, &state_dict(&net), &[])?;
            save_safetensors(&opt_path, &opt.state_dict(), &[])?;
            net = Net::new(99, &dev)?;
            opt = AdamW::new(decay_groups(named_parameters(&net), 0.01), config)?;
            load_state_dict(&net, &load_safetensors(&model_path, &dev)?)?;
            opt.load_state_dict(&load_safetensors(&opt_path, &dev)?)?;
            assert_eq!(opt.steps(), step as u64);
        }
        net.loss(&x)?.backward()?;
        opt.step()?;
        opt.zero_grad();
        dev.mark_step()?;
    }
    Ok(net.dense.weight.to_vec()?)
}

#[test]
fn a_resumed_optimizer_continues_bit_for_bit() -> Result<()> {
    assert_eq!(train(6, None)?, train(6, Some(3))?);
    Ok(())
}
