//! Transformer layers in BERT's post-LayerNorm arrangement.

use crate::{ModelConfig, Result};
use lazytrain_core::{DType, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, Dropout, LayerNorm, Linear, Module, SelfAttention};

/// The activation named by `hidden_act`.
pub(crate) fn activation(x: &Tensor, name: &str) -> Result<Tensor> {
    Ok(match name {
        "relu" => x.maximum_scalar(0.0)?,
        "gelu_new" => {
            let inner =
                x.add(&x.square()?.mul(x)?.mul_scalar(0.044715)?)?.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?;
            x.mul(&inner.tanh()?.add_scalar(1.0)?.mul_scalar(0.5)?)?
        }
        _ => x.gelu()?,
    })
}

/// The activation of a feed-forward block's expansion, whose output only
/// feeds the block's second matmul. Under autocast its input is stored in
/// bf16 (as PyTorch's autocast keeps a linear layer's output), the
/// activation computes in f32 from it, and its output is rounded to bf16
/// once (the matmul reads bf16 anyway): half the bytes of the largest
/// activations, each rounding inside the fused kernels around the matmuls.
pub(crate) fn expansion_activation(pre: &Tensor, name: &str) -> Result<Tensor> {
    match pre.device().autocast_dtype() {
        Some(low) if pre.dtype() == DType::F32 => {
            let stored = pre.cast(low)?;
            Ok(activation(&stored.cast(DType::F32)?, name)?.cast(low)?)
        }
        _ => activation(pre, name),
    }
}

/// `dense`, dropout, residual, LayerNorm: BERT's `*Output` blocks.
pub struct ResidualOutput {
    /// The projection.
    pub dense: Linear,
    /// Normalisation after the residual sum.
    pub layer_norm: LayerNorm,
    dropout: Dropout,
}

impl ResidualOutput {
    fn new(init: &mut Initializer, config: &ModelConfig, input: usize) -> Result<ResidualOutput> {
        let mut linear = Linear::new(init, input, config.hidden_size, true)?;
        rescale_init(&mut linear, config)?;
        Ok(ResidualOutput {
            dense: linear,
            layer_norm: LayerNorm::new(init, config.hidden_size, config.layer_norm_eps)?,
            dropout: Dropout::new(config.hidden_dropout_prob)?,
        })
    }

    fn forward(&self, x: &Tensor, residual: &Tensor, ctx: &Context) -> Result<Tensor> {
        let y = self.dropout.forward(&self.dense.forward(x)?, ctx)?;
        Ok(self.layer_norm.forward(&y.add(residual)?)?)
    }
}

impl Module for ResidualOutput {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.dense.visit_parameters(&format!("{prefix}dense."), visit);
        self.layer_norm.visit_parameters(&format!("{prefix}LayerNorm."), visit);
    }
}

/// The layers are created with BERT's std 0.02; a config with another
/// `initializer_range` rescales them.
pub(crate) fn rescale_init(linear: &mut Linear, config: &ModelConfig) -> Result<()> {
    let factor = config.initializer_range / lazytrain_nn::init::BERT_INIT_STD as f64;
    if (factor - 1.0).abs() > 1e-12 {
        linear.weight.assign(&linear.weight.mul_scalar(factor)?)?;
    }
    Ok(())
}

/// One encoder layer: self-attention and feed-forward, each with a residual.
pub struct Layer {
    /// `attention.self`.
    pub attention: SelfAttention,
    /// `attention.output`.
    pub attention_output: ResidualOutput,
    /// `intermediate.dense`.
    pub intermediate: Linear,
    /// `output`.
    pub output: ResidualOutput,
    hidden_act: String,
}

impl Layer {
    fn new(init: &mut Initializer, config: &ModelConfig) -> Result<Layer> {
        let mut attention = SelfAttention::new(
            init,
            config.hidden_size,
            config.num_attention_heads,
            config.attention_probs_dropout_prob,
        )?;
        for l in [&mut attention.query, &mut attention.key, &mut attention.value] {
            rescale_init(l, config)?;
        }
        let mut intermediate = Linear::new(init, config.hidden_size, config.intermediate_size, true)?;
        rescale_init(&mut intermediate, config)?;
        Ok(Layer {
            attention,
            attention_output: ResidualOutput::new(init, config, config.hidden_size)?,
            intermediate,
            output: ResidualOutput::new(init, config, config.intermediate_size)?,
            hidden_act: config.hidden_act.clone(),
        })
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        let attended = self.attention_output.forward(&self.attention.forward(x, mask, ctx)?, x, ctx)?;
        let hidden = expansion_activation(&self.intermediate.forward(&attended)?, &self.hidden_act)?;
        self.output.forward(&hidden, &attended, ctx)
    }
}

impl Module for Layer {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.attention.visit_parameters(&format!("{prefix}attention.self."), visit);
        self.attention_output.visit_parameters(&format!("{prefix}attention.output."), visit);
        self.intermediate.visit_parameters(&format!("{prefix}intermediate.dense."), visit);
        self.output.visit_parameters(&format!("{prefix}output."), visit);
    }
}

/// The stack of layers.
pub struct Encoder {
    /// `encoder.layer.N`.
    pub layers: Vec<Layer>,
}

impl Encoder {
    /// `num_hidden_layers` fresh layers.
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<Encoder> {
        let layers = (0..config.num_hidden_layers).map(|_| Layer::new(init, config)).collect::<Result<_>>()?;
        Ok(Encoder { layers })
    }

    /// Run every layer.
    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: &Context) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h, mask, ctx)?;
        }
        Ok(h)
    }
}

impl Module for Encoder {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_parameters(&format!("{prefix}layer.{i}."), visit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazytrain_core::Device;

    /// Under autocast the expansion's input is rounded to bf16 once, the
    /// GELU computes in f32 from it, and its output is rounded to bf16 once;
    /// without autocast it is the f32 GELU.
    #[test]
    fn expansion_activation_keeps_bf16_under_autocast() {
        let device = Device::cpu();
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.123_457).collect();
        let x = Tensor::from_vec(values, [8, 8], &device).unwrap();
        let plain = expansion_activation(&x, "gelu").unwrap();
        assert_eq!(plain.dtype(), DType::F32);
        assert_eq!(plain.to_vec::<f32>().unwrap(), x.gelu().unwrap().to_vec::<f32>().unwrap());
        let rounded = |t: &Tensor| t.cast(DType::BF16).unwrap().cast(DType::F32).unwrap();
        let expected = rounded(&rounded(&x).gelu().unwrap()).to_vec::<f32>().unwrap();
        let guard = device.autocast(DType::BF16).unwrap();
        let low = expansion_activation(&x, "gelu").unwrap();
        drop(guard);
        assert_eq!(low.dtype(), DType::BF16);
        assert_eq!(low.cast(DType::F32).unwrap().to_vec::<f32>().unwrap(), expected);
        assert_ne!(expected, plain.to_vec::<f32>().unwrap(), "the roundings show");
    }
}
