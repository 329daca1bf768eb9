//! `BertForMaskedLM` / `RobertaForMaskedLM`.

use crate::encoder::{activation, rescale_init, rows_at};
use crate::{EncoderModel, ModelConfig, ModelType, Result};
use lazytrain_core::Tensor;
use lazytrain_nn::init::Initializer;
use lazytrain_nn::{Context, LayerNorm, Linear, Module};

/// The encoder with a masked-LM head: dense → activation → LayerNorm →
/// decoder tied to the word embeddings, plus an output bias.
///
/// Names: BERT `bert.*` and `cls.predictions.{transform.dense,
/// transform.LayerNorm, bias}`; RoBERTa `roberta.*` and `lm_head.{dense,
/// layer_norm, bias}`. The tied decoder weight is not a separate parameter.
pub struct ForMaskedLM {
    /// The encoder (no pooler).
    pub model: EncoderModel,
    /// Head transform.
    pub transform: Linear,
    /// Head normalisation.
    pub layer_norm: LayerNorm,
    /// Per-token output bias `[vocab]`.
    pub bias: Tensor,
}

impl ForMaskedLM {
    /// A freshly initialised model.
    pub fn new(init: &mut Initializer, config: &ModelConfig) -> Result<ForMaskedLM> {
        let model = EncoderModel::new(init, config, false)?;
        let mut transform = Linear::new(init, config.hidden_size, config.hidden_size, true)?;
        rescale_init(&mut transform, config)?;
        Ok(ForMaskedLM {
            model,
            transform,
            layer_norm: LayerNorm::new(init, config.hidden_size, config.layer_norm_eps)?,
            bias: init.constant(&[config.vocab_size], 0.0)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// Vocabulary logits `[batch, seq, vocab]` from the last hidden state.
    pub fn head(&self, hidden: &Tensor) -> Result<Tensor> {
        let [b, s, d] = crate::error::dims_of(hidden, "the hidden state", "[batch, seq, hidden]")?;
        let logits = self.head_rows(&hidden.reshape([b * s, d])?)?;
        Ok(logits.reshape([b, s, self.config().vocab_size])?)
    }

    /// Vocabulary logits `[capacity, vocab]` at `positions` only (`[capacity]`
    /// i64 flat indices `row * seq + column` into the hidden state): the
    /// original BERT recipe's `max_predictions_per_seq`, the head's transform,
    /// LayerNorm and tied decoder computed for the labelled tokens alone.
    pub fn head_at(&self, hidden: &Tensor, positions: &Tensor) -> Result<Tensor> {
        self.head_rows(&rows_at(hidden, positions)?)
    }

    /// The head over `[rows, hidden]` rows.
    fn head_rows(&self, rows: &Tensor) -> Result<Tensor> {
        // BERT's head follows `hidden_act`; RoBERTa's is always exact GELU (as in HF).
        let act = match self.config().model_type {
            ModelType::Bert | ModelType::Gpt2 => self.config().hidden_act.as_str(),
            ModelType::Roberta => "gelu",
        };
        let h = activation(&self.transform.forward(rows)?, act)?;
        let h = self.layer_norm.forward(&h)?;
        let word = &self.model.embeddings.word_embeddings.weight;
        Ok(h.matmul_transposed(word, false, true)?.add(&self.bias)?)
    }

    /// Logits `[capacity, vocab]` at the flat `positions` of `[batch, seq]`
    /// ids. Past its attention, the last encoder layer also runs only at
    /// `positions` ([`EncoderModel::forward_rows`]): the logits are those
    /// of [`ForMaskedLM::forward`] at these positions, up to float
    /// summation order, except that the last layer's dropout draws its
    /// masks over the gathered rows.
    pub fn forward_at(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        positions: &Tensor,
        ctx: &Context,
    ) -> Result<Tensor> {
        self.head_rows(&self.model.forward_rows(input_ids, attention_mask, token_type_ids, positions, ctx)?)
    }

    /// Logits `[batch, seq, vocab]` for `[batch, seq]` ids.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        ctx: &Context,
    ) -> Result<Tensor> {
        self.head(&self.model.forward(input_ids, attention_mask, token_type_ids, ctx)?)
    }

    /// Mean cross-entropy over the labelled positions (`-100` elsewhere).
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        Ok(logits.cross_entropy(labels, -100)?)
    }
}

impl Module for ForMaskedLM {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        let base = self.config().model_type.name();
        self.model.visit_parameters(&format!("{prefix}{base}."), visit);
        match self.config().model_type {
            // (An encoder is never built from a GPT-2 config: `EncoderModel::new` refuses it.)
            ModelType::Bert | ModelType::Gpt2 => {
                self.transform.visit_parameters(&format!("{prefix}cls.predictions.transform.dense."), visit);
                self.layer_norm.visit_parameters(&format!("{prefix}cls.predictions.transform.LayerNorm."), visit);
                visit(format!("{prefix}cls.predictions.bias"), &self.bias);
            }
            ModelType::Roberta => {
                self.transform.visit_parameters(&format!("{prefix}lm_head.dense."), visit);
                self.layer_norm.visit_parameters(&format!("{prefix}lm_head.layer_norm."), visit);
                visit(format!("{prefix}lm_head.bias"), &self.bias);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazytrain_core::Device;
    use lazytrain_nn::named_parameters;

    /// The loss and every gradient of a step, the head (and the last layer
    /// past its attention) dense or at the labelled positions only (padded
    /// with unused slots). Without dropout after the attention: the gathered
    /// rows draw their own masks.
    fn loss_and_grads(gathered: bool) -> (f32, Vec<Vec<f32>>) {
        let dev = Device::cpu();
        let mut config = ModelConfig::preset("bert-tiny", 97).unwrap();
        (config.hidden_size, config.num_attention_heads, config.intermediate_size) = (32, 2, 64);
        config.hidden_dropout_prob = 0.0;
        let model = ForMaskedLM::new(&mut Initializer::new(3, &dev), &config).unwrap();
        let (b, s) = (3, 16);
        let ids: Vec<i64> = (0..b * s).map(|i| 5 + (i * 37 % 90) as i64).collect();
        let labels: Vec<i64> = (0..b * s).map(|i| if i % 7 == 2 { 5 + (i * 11 % 90) as i64 } else { -100 }).collect();
        let input = Tensor::from_vec(ids, [b, s], &dev).unwrap();
        let ctx = Context::train(&dev, 1, 0).unwrap();
        let loss = if gathered {
            let mut positions: Vec<i64> = (0..b * s).filter(|&i| labels[i] != -100).map(|i| i as i64).collect();
            let mut picked: Vec<i64> = positions.iter().map(|&i| labels[i as usize]).collect();
            positions.resize(16, 0);
            picked.resize(16, -100);
            let positions = Tensor::from_vec(positions, [16], &dev).unwrap();
            let logits = model.forward_at(&input, None, None, &positions, &ctx).unwrap();
            assert_eq!(logits.dims(), [16, 97]);
            logits.cross_entropy(&Tensor::from_vec(picked, [16], &dev).unwrap(), -100).unwrap()
        } else {
            let logits = model.forward(&input, None, None, &ctx).unwrap();
            model.loss(&logits, &Tensor::from_vec(labels, [b, s], &dev).unwrap()).unwrap()
        };
        loss.backward().unwrap();
        let grads = named_parameters(&model).iter().map(|(_, p)| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
        (loss.item::<f32>().unwrap(), grads)
    }

    #[test]
    fn the_head_at_labelled_positions_gives_the_dense_loss_and_gradients() {
        let (dense, dense_grads) = loss_and_grads(false);
        let (gathered, gathered_grads) = loss_and_grads(true);
        assert!((dense - gathered).abs() <= 1e-6 * dense.abs(), "{dense} vs {gathered}");
        for (a, b) in dense_grads.iter().zip(&gathered_grads) {
            let scale = a.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 1e-5 * scale, "gradient differs by {worst} (scale {scale})");
        }
    }
}
