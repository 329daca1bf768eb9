//! End-to-end training behaviour: learning, one compile per step graph,
//! reproducible dropout, and donation keeping peak memory near one copy of
//! the training state.

use lazytrain_core::{DType, Device, Tensor};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{clip_grad_norm, decay_groups, AdamW, AdamWConfig, LrSchedule, Optimizer, ScheduleKind};
use lazytrain_nn::{named_parameters, Context, Dropout, Embedding, LayerNorm, Linear, Module, Result, SelfAttention};

/// Linear → GELU → Linear.
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn new(init: &mut Initializer, input: usize, hidden: usize, classes: usize) -> Result<Mlp> {
        Ok(Mlp { fc1: Linear::new(init, input, hidden, true)?, fc2: Linear::new(init, hidden, classes, true)? })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.gelu()?)
    }
}

impl Module for Mlp {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.fc1.visit_parameters(&format!("{prefix}fc1."), visit);
        self.fc2.visit_parameters(&format!("{prefix}fc2."), visit);
    }
}

/// Points in [-1, 1]² labelled by quadrant parity (an XOR: not linearly separable).
fn xor_data(n: usize) -> (Vec<f32>, Vec<i64>) {
    let mut u = vec![0f32; 2 * n];
    lazytrain_core::random::uniform_f32(11, 0, &mut u);
    let x: Vec<f32> = u.iter().map(|v| v * 2.0 - 1.0).collect();
    let y = x.chunks(2).map(|p| ((p[0] > 0.0) ^ (p[1] > 0.0)) as i64).collect();
    (x, y)
}

#[test]
fn an_mlp_learns_xor() -> Result<()> {
    let dev = Device::cpu();
    let mut init = Initializer::new(0, &dev);
    let mlp = Mlp::new(&mut init, 2, 32, 2)?;
    // A wider init than BERT's so a small net starts learning at once.
    for (_, p) in named_parameters(&mlp) {
        if p.rank() == 2 {
            p.assign(&p.mul_scalar(25.0)?)?;
        }
    }
    dev.sync()?;
    let (x, y) = xor_data(256);
    let x = Tensor::from_vec(x, [256, 2], &dev)?;
    let y = Tensor::from_vec(y, [256], &dev)?;
    let mut opt =
        AdamW::new(decay_groups(named_parameters(&mlp), 0.0), AdamWConfig { lr: 2e-2, ..Default::default() })?;
    let mut loss_value = f32::NAN;
    for _ in 0..300 {
        let loss = mlp.forward(&x)?.cross_entropy(&y, -100)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        dev.mark_step()?;
        loss_value = loss.item::<f32>()?;
    }
    assert!(loss_value < 0.1, "final loss {loss_value}");
    assert_eq!(dev.metrics().compiles, 2, "the init rescale and the training step");
    Ok(())
}

/// A 2-layer post-LN transformer encoder with an MLM-style head.
struct Encoder {
    embed: Embedding,
    layers: Vec<Block>,
    head: Linear,
    dropout: Dropout,
}

struct Block {
    attention: SelfAttention,
    attention_out: Linear,
    ln1: LayerNorm,
    ffn_in: Linear,
    ffn_out: Linear,
    ln2: LayerNorm,
}

impl Encoder {
    fn new(init: &mut Initializer, vocab: usize, hidden: usize, heads: usize, layers: usize) -> Result<Encoder> {
        let mut blocks = Vec::new();
        for _ in 0..layers {
            blocks.push(Block {
                attention: SelfAttention::new(init, hidden, heads, 0.1)?,
                attention_out: Linear::new(init, hidden, hidden, true)?,
                ln1: LayerNorm::new(init, hidden, 1e-12)?,
                ffn_in: Linear::new(init, hidden, 4 * hidden, true)?,
                ffn_out: Linear::new(init, 4 * hidden, hidden, true)?,
                ln2: LayerNorm::new(init, hidden, 1e-12)?,
            });
        }
        Ok(Encoder {
            embed: Embedding::new(init, vocab, hidden)?,
            layers: blocks,
            head: Linear::new(init, hidden, vocab, true)?,
            dropout: Dropout::new(0.1)?,
        })
    }

    fn loss(&self, ids: &Tensor, labels: &Tensor, mask: &Tensor, ctx: &Context) -> Result<Tensor> {
        let mut h = self.dropout.forward(&self.embed.forward(ids)?, ctx)?;
        for b in &self.layers {
            let a = b.attention_out.forward(&b.attention.forward(&h, Some(mask), ctx)?)?;
            h = b.ln1.forward(&h.add(&self.dropout.forward(&a, ctx)?)?)?;
            let f = b.ffn_out.forward(&b.ffn_in.forward(&h)?.gelu()?)?;
            h = b.ln2.forward(&h.add(&self.dropout.forward(&f, ctx)?)?)?;
        }
        Ok(self.head.forward(&h)?.cross_entropy(labels, -100)?)
    }
}

impl Module for Encoder {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.embed.visit_parameters(&format!("{prefix}embeddings.word_embeddings."), visit);
        for (i, b) in self.layers.iter().enumerate() {
            let p = format!("{prefix}encoder.layer.{i}.");
            b.attention.visit_parameters(&format!("{p}attention.self."), visit);
            b.attention_out.visit_parameters(&format!("{p}attention.output.dense."), visit);
            b.ln1.visit_parameters(&format!("{p}attention.output.LayerNorm."), visit);
            b.ffn_in.visit_parameters(&format!("{p}intermediate.dense."), visit);
            b.ffn_out.visit_parameters(&format!("{p}output.dense."), visit);
            b.ln2.visit_parameters(&format!("{p}output.LayerNorm."), visit);
        }
        self.head.visit_parameters(&format!("{prefix}head."), visit);
    }
}

const VOCAB: usize = 50;
const SEQ: usize = 8;
const BATCH: usize = 4;

fn batch(dev: &Device, step: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7 + step * 3) % VOCAB) as i64).collect();
    let labels: Vec<i64> =
        ids.iter().enumerate().map(|(i, &t)| if i % 3 == 0 { (t + 1) % VOCAB as i64 } else { -100 }).collect();
    let mask: Vec<f32> = (0..BATCH * SEQ).map(|i| if i % SEQ == SEQ - 1 { -1e9 } else { 0.0 }).collect();
    Ok((
        Tensor::from_vec(ids, [BATCH, SEQ], dev)?,
        Tensor::from_vec(labels, [BATCH, SEQ], dev)?,
        Tensor::from_vec(mask, [BATCH, 1, 1, SEQ], dev)?,
    ))
}

/// Train the encoder for `steps` steps with dropout seed `seed`; the losses.
fn train_encoder(seed: i64, steps: usize) -> Result<(Vec<f32>, Device)> {
    let dev = Device::cpu();
    let mut init = Initializer::new(42, &dev);
    let model = Encoder::new(&mut init, VOCAB, 32, 4, 2)?;
    let params = named_parameters(&model);
    assert_eq!(params[1].0, "encoder.layer.0.attention.self.query.weight");
    let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
    let mut opt = AdamW::new(decay_groups(params, 0.01), AdamWConfig { lr: 1e-3, ..Default::default() })?;
    let schedule = LrSchedule { kind: ScheduleKind::Linear, base_lr: 1e-3, warmup_steps: 5, total_steps: steps as u64 };
    let mut losses = Vec::new();
    for step in 0..steps {
        let (ids, labels, mask) = batch(&dev, step)?;
        let ctx = Context::train(&dev, seed, step as i64)?;
        let loss = model.loss(&ids, &labels, &mask, &ctx)?;
        loss.backward()?;
        clip_grad_norm(&tensors, 1.0)?;
        opt.set_lr(schedule.lr_at(step as u64));
        opt.step()?;
        opt.zero_grad();
        dev.mark_step()?;
        losses.push(loss.item::<f32>()?);
    }
    Ok((losses, dev))
}

#[test]
fn a_transformer_training_loop_compiles_once() -> Result<()> {
    let (losses, dev) = train_encoder(7, 50)?;
    let m = dev.metrics();
    assert_eq!((m.compiles, m.cache_hits, m.executions), (1, 49, 50), "{}", dev.metrics_report());
    assert_eq!(m.forced_sync_count(), 0);
    assert!(losses.iter().all(|l| l.is_finite()));
    let first = losses[..5].iter().sum::<f32>() / 5.0;
    let last = losses[45..].iter().sum::<f32>() / 5.0;
    assert!(last < first, "loss should fall: {first} -> {last}");
    Ok(())
}

#[test]
fn dropout_is_reproducible_per_seed() -> Result<()> {
    let (a, _) = train_encoder(1, 3)?;
    let (b, _) = train_encoder(1, 3)?;
    let (c, _) = train_encoder(2, 3)?;
    assert_eq!(a, b, "same seed, same losses bit for bit");
    assert_ne!(a, c, "another seed draws other masks");
    let dev = Device::cpu();
    let x = Tensor::ones([1000], DType::F32, &dev)?;
    let eval = Dropout::new(0.5)?.forward(&x, &Context::eval())?;
    let train = Dropout::new(0.5)?.forward(&x, &Context::train(&dev, 0, 0)?)?;
    assert_eq!(eval.sum_all()?.item::<f32>()?, 1000.0);
    let kept = train.to_vec::<f32>()?;
    assert!(kept.iter().all(|&v| v == 0.0 || v == 2.0));
    let frac = kept.iter().filter(|&&v| v == 2.0).count() as f64 / 1000.0;
    assert!((frac - 0.5).abs() < 0.05, "kept {frac}");
    Ok(())
}

/// One AdamW step of a parameter-heavy MLP; returns the peak execution
/// bytes of the step and the bytes of the training state.
fn step_peak(keep_old_handles: bool) -> Result<(u64, u64)> {
    let dev = Device::cpu();
    let mut init = Initializer::new(3, &dev);
    let mlp = Mlp::new(&mut init, 256, 256, 256)?;
    let params = named_parameters(&mlp);
    let mut opt = AdamW::new(decay_groups(params.clone(), 0.01), AdamWConfig::default())?;
    let state_bytes: u64 = params.iter().map(|(_, p)| 3 * 4 * p.numel() as u64).sum();
    let x = Tensor::from_vec(vec![0.1f32; 4 * 256], [4, 256], &dev)?;
    let y = Tensor::from_vec(vec![1i64; 4], [4], &dev)?;
    let _old: Vec<Tensor> = if keep_old_handles {
        params
            .iter()
            .map(|(_, p)| p.detach())
            .chain(opt.state_dict().entries().iter().map(|(_, t)| t.detach()))
            .collect::<lazytrain_core::Result<_>>()?
    } else {
        Vec::new()
    };
    let loss = mlp.forward(&x)?.cross_entropy(&y, -100)?;
    loss.backward()?;
    opt.step()?;
    opt.zero_grad();
    dev.mark_step()?;
    Ok((dev.metrics().peak_execution_bytes, state_bytes))
}

#[test]
fn donation_keeps_one_copy_of_the_training_state() -> Result<()> {
    let (donated, state) = step_peak(false)?;
    let (copied, _) = step_peak(true)?;
    // The state is parameters, exp_avg and exp_avg_sq (3 P bytes); the
    // gradients add P. With donation the update writes over the state, so
    // the peak is the state, the gradients and small activations.
    let params = state / 3;
    assert!(
        (donated as f64) < 1.1 * (state + params) as f64,
        "peak {donated} bytes vs state {state} + gradients {params}"
    );
    // Without donation the old state stays alive beside the new one; only
    // one of the three new tensors can take over a dying gradient's buffer.
    assert!(copied - donated >= params * 9 / 5, "donation saves two state tensors: {copied} vs {donated}");
    assert!(donated < state * 2, "the step does not double the state: {donated} vs {state}");
    Ok(())
}
