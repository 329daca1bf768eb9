//! Decoding with a GPT-2 LM, TPU-style: a fixed-capacity KV cache, one
//! prefill graph per prompt bucket, one decode graph for every later token,
//! and the next token chosen inside the graph (greedy, or sampled with
//! temperature, top-k and top-p from the counter-based generator keyed by
//! the seed and the position), so only the chosen ids are read back.

use crate::{Gpt2LMHeadModel, KvCache, ModelError, Result};
use lazytrain_core::{DType, Device, Tensor};
use lazytrain_nn::Context;

/// Prompts are padded up to a multiple of this many tokens, so prompts of
/// similar length share one prefill graph.
pub const PROMPT_BUCKET: usize = 32;

/// Seeds are spread by this prime before the position is added, so two
/// seeds never share a stream for generations shorter than 2^32 tokens.
const SEED_STRIDE: i64 = 4_294_967_311;

/// Bisection rounds that find a top-k or top-p threshold in the graph.
const THRESHOLD_ROUNDS: usize = 32;

/// How to choose tokens (Hugging Face's `generate` arguments).
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// Tokens to add after the prompt (fewer when every row ends early).
    pub max_new_tokens: usize,
    /// Sample instead of taking the most likely token.
    pub do_sample: bool,
    /// Divide the logits by this before sampling (> 0).
    pub temperature: f64,
    /// Sample only among the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities add up
    /// to at least `p` (in (0, 1]).
    pub top_p: Option<f64>,
    /// The sampling seed.
    pub seed: u64,
    /// A row stops after generating this id.
    pub eos_token_id: Option<u32>,
}

impl Default for GenerationConfig {
    /// Greedy, 20 new tokens (Hugging Face's `max_length` 20 default), and
    /// HF's sampling defaults for when sampling is turned on (top-k 50).
    fn default() -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: 20,
            do_sample: false,
            temperature: 1.0,
            top_k: Some(50),
            top_p: None,
            seed: 0,
            eos_token_id: None,
        }
    }
}

impl GenerationConfig {
    /// Refuse settings that sample nothing or everything by accident.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| Err(ModelError::Config { path: "generation".into(), detail });
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens must be at least 1".into());
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature {} must be a positive number", self.temperature));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad(format!("top_p {p} must be in (0, 1]"));
        }
        if self.top_k == Some(0) {
            return bad("top_k must be at least 1 (or unset)".into());
        }
        Ok(())
    }
}

/// The generated ids of each prompt, with counts for reporting.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// New token ids per prompt (up to and including an eos).
    pub tokens: Vec<Vec<u32>>,
    /// Decode steps run after the prefill.
    pub decode_steps: usize,
}

/// Generate continuations of `prompts` (token ids, each non-empty) as one
/// batch.
pub fn generate(
    model: &Gpt2LMHeadModel,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    device: &Device,
) -> Result<Generation> {
    config.validate()?;
    let positions = model.config().max_position_embeddings;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ModelError::Config { path: "generation".into(), detail: "every prompt needs a token".into() });
    }
    if longest.checked_add(config.max_new_tokens).is_none_or(|total| total > positions) {
        return Err(ModelError::Config {
            path: "generation".into(),
            detail: format!(
                "a prompt of {longest} tokens plus {} new tokens exceeds the model's n_positions {positions}; \
                 shorten the prompt or lower --max-new-tokens",
                config.max_new_tokens
            ),
        });
    }
    let bucket = longest.div_ceil(PROMPT_BUCKET) * PROMPT_BUCKET;
    let bucket = bucket.min(positions - config.max_new_tokens).max(longest);
    let batch = prompts.len();
    let mut cache = KvCache::new(model.config(), batch, bucket + config.max_new_tokens, device)?;
    let ctx = Context::eval();

    let pad = config.eos_token_id.unwrap_or(0) as i64;
    let mut ids = Vec::with_capacity(batch * bucket);
    let mut last = Vec::with_capacity(batch * model.config().hidden_size);
    for prompt in prompts {
        ids.extend(prompt.iter().map(|&t| t as i64));
        ids.extend(std::iter::repeat_n(pad, bucket - prompt.len()));
        last.extend(std::iter::repeat_n(prompt.len() as i64 - 1, model.config().hidden_size));
    }
    let input = Tensor::from_vec(ids, [batch, bucket], device)?;
    let hidden = model.transformer.forward_cached(&input, &mut cache, &ctx)?;
    let last = Tensor::from_vec(last, [batch, 1, model.config().hidden_size], device)?;
    let logits = model.head(&hidden.gather(1, &last)?)?;
    cache.set_lengths(&prompts.iter().map(Vec::len).collect::<Vec<_>>())?;
    let vocab = model.config().vocab_size;
    let mut chosen = read_ids(&choose(&logits, config, 0, device)?, vocab, 0, device)?;

    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); batch];
    let mut done = vec![false; batch];
    let mut decode_steps = 0;
    loop {
        for ((row, &id), finished) in tokens.iter_mut().zip(&chosen).zip(done.iter_mut()) {
            if !*finished {
                row.push(id);
                *finished = Some(id) == config.eos_token_id || row.len() == config.max_new_tokens;
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
        let next = Tensor::from_vec(chosen.iter().map(|&t| t as i64).collect::<Vec<_>>(), [batch, 1], device)?;
        let hidden = model.transformer.forward_cached(&next, &mut cache, &ctx)?;
        decode_steps += 1;
        chosen = read_ids(&choose(&model.head(&hidden)?, config, decode_steps, device)?, vocab, decode_steps, device)?;
    }
    Ok(Generation { tokens, decode_steps })
}

/// Run the step and read the chosen ids of new token `step`; an id past
/// the vocabulary marks logits that are not numbers ([`choose`]).
fn read_ids(ids: &Tensor, vocab: usize, step: usize, device: &Device) -> Result<Vec<u32>> {
    device.mark_step()?;
    let ids = ids.to_vec::<i64>()?;
    if let Some(row) = ids.iter().position(|&id| id < 0 || id as usize >= vocab) {
        return Err(ModelError::Config {
            path: "generation".into(),
            detail: format!(
                "the model's logits for prompt {} are NaN at new token {}: its weights hold non-finite \
                 values or its config.json a broken setting; check the folder it was loaded from",
                row + 1,
                step + 1
            ),
        });
    }
    Ok(ids.into_iter().map(|t| t as u32).collect())
}

/// The next id of each row `[batch]` from logits `[batch, 1, vocab]`, in
/// the graph: the argmax, or a sample after temperature, top-k and top-p
/// (Hugging Face's order), drawn by the Gumbel-max trick with uniforms
/// keyed by the seed and `step`. A row whose logits hold a NaN gets the id
/// `vocab`, which [`read_ids`] refuses.
fn choose(logits: &Tensor, config: &GenerationConfig, step: usize, device: &Device) -> Result<Tensor> {
    let [batch, _, vocab] = crate::error::dims_of(logits, "the logits", "[batch, 1, vocab]")?;
    let x = logits.reshape([batch, vocab])?.cast(DType::F32)?;
    let id = if config.do_sample { sample(x.clone(), config, step, device)? } else { argmax(&x)? };
    let not_a_number = x.ne(&x)?.cast(DType::F32)?.max(&[-1], false)?.gt_scalar(0.0)?;
    let past_end = Tensor::full([], vocab as f64, DType::I64, device)?;
    Ok(Tensor::select(&not_a_number, &past_end, &id)?)
}

/// [`choose`]'s sample from scores `x` (`[batch, vocab]`).
fn sample(mut x: Tensor, config: &GenerationConfig, step: usize, device: &Device) -> Result<Tensor> {
    let [batch, vocab] = crate::error::dims_of(&x, "the scores", "[batch, vocab]")?;
    let never = Tensor::full([], f64::NEG_INFINITY, DType::F32, device)?;
    x = x.mul_scalar(1.0 / config.temperature)?;
    if let Some(k) = config.top_k.filter(|&k| k < vocab) {
        let kth = threshold(&x, x.max(&[-1], true)?.add_scalar(1.0)?, |t| {
            Ok(x.ge(t)?.cast(DType::F32)?.sum(&[-1], true)?.ge_scalar(k as f64)?)
        })?;
        x = Tensor::select(&x.ge(&kth)?, &x, &never)?;
    }
    if let Some(p) = config.top_p.filter(|&p| p < 1.0) {
        let probs = x.softmax(-1)?;
        let zero = Tensor::zeros([], DType::F32, device)?;
        let cut = threshold(&probs, Tensor::full([batch, 1], 1.5, DType::F32, device)?, |t| {
            let kept = Tensor::select(&probs.ge(t)?, &probs, &zero)?;
            Ok(kept.sum(&[-1], true)?.ge_scalar(p)?)
        })?;
        x = Tensor::select(&probs.ge(&cut)?, &x, &never)?;
    }
    let key = (config.seed as i64).wrapping_mul(SEED_STRIDE).wrapping_add(step as i64);
    let uniform = Tensor::rand_uniform([batch, vocab], DType::F32, &Tensor::scalar(key, device))?;
    let gumbel = uniform.log()?.neg()?.log()?.neg()?;
    argmax(&x.add(&gumbel)?)
}

/// The largest `t` per row (`[batch, 1]`) for which `holds(t)` is true,
/// found by bisection between the row's minimum of `values` (where it must
/// hold) and `above` (where it must not): a top-k or top-p cut-off.
fn threshold(values: &Tensor, above: Tensor, holds: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let mut low = values.neg()?.max(&[-1], true)?.neg()?;
    let mut high = above;
    for _ in 0..THRESHOLD_ROUNDS {
        let middle = low.add(&high)?.mul_scalar(0.5)?;
        let ok = holds(&middle)?;
        low = Tensor::select(&ok, &middle, &low)?;
        high = Tensor::select(&ok, &high, &middle)?;
    }
    Ok(low)
}

/// The index of each row's largest value (the first of ties), `[batch]` i64.
fn argmax(x: &Tensor) -> Result<Tensor> {
    let [batch, vocab] = crate::error::dims_of(x, "the scores", "[batch, vocab]")?;
    let best = x.max(&[-1], true)?;
    let index = Tensor::iota([1, vocab], 1, DType::F32, x.device())?;
    let past_end = Tensor::full([], vocab as f64, DType::F32, x.device())?;
    let first = Tensor::select(&x.ge(&best)?, &index, &past_end)?.neg()?.max(&[-1], false)?.neg()?;
    Ok(first.cast(DType::I64)?.reshape([batch])?)
}
