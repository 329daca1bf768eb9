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

/// The rows `[rows, hidden]` of `hidden` `[batch, seq, hidden]` at the flat
/// `positions` (`[rows]` i64 indices `row * seq + column`).
pub(crate) fn rows_at(hidden: &Tensor, positions: &Tensor) -> Result<Tensor> {
    let [b, s, d] = crate::error::dims_of(hidden, "the hidden state", "[batch, seq, hidden]")?;
    Ok(hidden.reshape([b * s, d])?.embedding(positions)?)
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
        self.feed_forward(&attended, ctx)
    }

    /// The layer's output `[rows, hidden]` at the flat `positions` (`[rows]`
    /// i64 indices `row * seq + column`) of `x` `[batch, seq, hidden]`. The
    /// attention reads every token; what follows it works token by token,
    /// so only the rows at `positions` are computed: the output
    /// projection, the feed-forward block and their LayerNorms.
    fn forward_rows(&self, x: &Tensor, mask: Option<&Tensor>, positions: &Tensor, ctx: &Context) -> Result<Tensor> {
        let context = rows_at(&self.attention.forward(x, mask, ctx)?, positions)?;
        let attended = self.attention_output.forward(&context, &rows_at(x, positions)?, ctx)?;
        self.feed_forward(&attended, ctx)
    }

    /// The feed-forward block with its residual, token by token.
    fn feed_forward(&self, attended: &Tensor, ctx: &Context) -> Result<Tensor> {
        let hidden = expansion_activation(&self.intermediate.forward(attended)?, &self.hidden_act)?;
        self.output.forward(&hidden, attended, ctx)
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

    /// The last hidden state `[rows, hidden]` at the flat `positions`
    /// (`[rows]` i64 indices `row * seq + column` into `x` `[batch, seq,
    /// hidden]`): every layer but the last runs whole, the last one past its
    /// attention only at `positions` (a head that reads those rows alone
    /// gets the values it would get from [`Encoder::forward`]).
    pub fn forward_rows(&self, x: &Tensor, mask: Option<&Tensor>, positions: &Tensor, ctx: &Context) -> Result<Tensor> {
        let Some((last, before)) = self.layers.split_last() else { return rows_at(x, positions) };
        let mut h = x.clone();
        for layer in before {
            h = layer.forward(&h, mask, ctx)?;
        }
        last.forward_rows(&h, mask, positions, ctx)
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
    use lazytrain_nn::init::Initializer;

    /// The last layer run past its attention at chosen rows gives the whole
    /// stack's output rows there (positions may repeat, as a padded
    /// capacity's unused slots do). The masked-LM test compares a whole
    /// step's loss and gradients with the attention's dropout on.
    #[test]
    fn forward_rows_gives_the_rows_of_the_whole_forward() {
        let device = Device::cpu();
        let mut config = ModelConfig::preset("bert-tiny", 50).unwrap();
        (config.hidden_size, config.num_attention_heads, config.intermediate_size) = (16, 2, 32);
        (config.hidden_dropout_prob, config.attention_probs_dropout_prob) = (0.0, 0.0);
        let encoder = Encoder::new(&mut Initializer::new(7, &device), &config).unwrap();
        let (b, s, d) = (2, 6, 16);
        let values = (0..b * s * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let x = Tensor::from_vec(values, [b, s, d], &device).unwrap();
        let positions = [7i64, 0, 11, 3, 0, 0];
        let at = Tensor::from_vec(positions.to_vec(), [positions.len()], &device).unwrap();
        let ctx = || Context::train(&device, 1, 0).unwrap();
        let rows = encoder.forward_rows(&x, None, &at, &ctx()).unwrap();
        assert_eq!(rows.dims(), [positions.len(), d]);
        let whole = encoder.forward(&x, None, &ctx()).unwrap().to_vec::<f32>().unwrap();
        for (row, &p) in rows.to_vec::<f32>().unwrap().chunks(d).zip(&positions) {
            let expected = &whole[p as usize * d..(p as usize + 1) * d];
            for (got, want) in row.iter().zip(expected) {
                assert!((got - want).abs() <= 1e-5, "row {p}: {got} vs {want}");
            }
        }
        assert!(whole.chunks(d).any(|r| r != &whole[..d]), "the rows differ, so a wrong row would show");
    }

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
