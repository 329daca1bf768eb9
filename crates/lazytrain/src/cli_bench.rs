//! `lazytrain bench`: the BERT masked-LM (or GPT-2 causal-LM) training step
//! of `../shared/anchors/bench_torch_mlm.py`, run by lazytrain.

use clap::Args;
use lazytrain_core::ir::AllReduceOp;
use lazytrain_core::{DType, Device, Tensor};
use lazytrain_data::collator::{label_capacity, select_labelled};
use lazytrain_dist::{spawn, train_step, Replica, SpawnConfig, StepConfig};
use lazytrain_models::{ForMaskedLM, Gpt2LMHeadModel, ModelConfig, ModelType, TaskModel};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{AdamW, AdamWConfig, ParamGroup};
use lazytrain_nn::{named_parameters, Context};
use std::time::Instant;

/// Options for `lazytrain bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// tiny, mini, small or base (BERT), or gpt2-tiny, gpt2-mini or gpt2-small
    /// (the anchor's configurations; sequence length 128).
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Timed steps (after 3 warm-up steps).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Data-parallel replicas, each training on its own batch of the
    /// config's size (tokens/s counts all of them).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=lazytrain_dist::MAX_REPLICAS as u64))]
    replicas: usize,
    /// bf16 mixed precision: matmuls in bf16 with f32 accumulation, f32
    /// master weights and optimizer state (`torch.autocast(bfloat16)`).
    #[arg(long)]
    bf16: bool,
    /// Keep the activations the backward pass reads in bf16
    /// (`Device::save_activations_as`; with or without `--bf16`).
    #[arg(long)]
    bf16_saved_activations: bool,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
    /// Compile the step and print its memory plan (`planned_peak_mb`, ...) without running it.
    #[arg(long)]
    dry_run: bool,
    /// BERT: compute the masked-LM head at every token as the anchor (and
    /// Hugging Face) does, instead of only at the masked positions.
    #[arg(long)]
    mlm_dense_head: bool,
}

/// What one replica measured.
struct ReplicaRun {
    /// With `--dry-run`: the step's plan (nothing ran).
    plan: Option<lazytrain::trainer::plan::StepPlan>,
    times: Vec<f64>,
    first_loss: f32,
    last_loss: f32,
    backend: &'static str,
    /// Replicas in the whole group (every process's).
    world: usize,
    params: usize,
    /// Compiles, cache hits and compile time of the whole group.
    compiles: u64,
    cache_hits: u64,
    compile_ms: f64,
    /// Minor page faults of the whole process during the timed steps (on
    /// Linux; `None` elsewhere or with `--dry-run`).
    timed_faults: Option<u64>,
}

/// The anchor's sequence length.
const SEQ: usize = 128;
/// The anchor's masking rate.
const MLM_PROBABILITY: f64 = 0.15;

/// `(layers, hidden, heads, vocab, batch)` as in the anchor script.
fn anchor_config(name: &str) -> Option<(usize, usize, usize, usize, usize)> {
    Some(match name {
        "tiny" => (2, 128, 2, 8192, 32),
        "mini" => (4, 256, 4, 8192, 32),
        "small" => (4, 512, 8, 8192, 16),
        "base" => (12, 768, 12, 30522, 8),
        "gpt2-tiny" => (2, 128, 2, 8192, 32),
        "gpt2-mini" => (4, 256, 4, 8192, 32),
        "gpt2-small" => (12, 768, 12, 50257, 8),
        _ => return None,
    })
}

/// FLOPs per token the step executes: the anchor's, less what the token
/// rows skipped by a masked-LM head at `head_rows` of every `tokens` (the
/// masked positions' capacity) leave out: the head's transform and decoder,
/// and the last encoder layer's output projection and feed-forward block
/// (which run at those rows only).
pub fn executed_flops_per_token(config: &ModelConfig, seq: usize, head_rows: usize, tokens: usize) -> f64 {
    let (h, v, i) = (config.hidden_size as f64, config.vocab_size as f64, config.intermediate_size as f64);
    let skipped = 1.0 - head_rows as f64 / tokens as f64;
    let last_layer = match config.num_hidden_layers {
        0 => 0.0,
        _ => h * h + 2.0 * h * i,
    };
    anchor_flops_per_token(config, seq) - 6.0 * (h * h + v * h + last_layer) * skipped
}

/// Model FLOPs per token of the anchor's step for `config`: BERT's
/// [`flops_per_token`], or GPT-2's (no head transform: `N_mm = 12 L H² + V H`).
pub fn anchor_flops_per_token(config: &ModelConfig, seq: usize) -> f64 {
    let (h, v) = (config.hidden_size, config.vocab_size);
    let bert = flops_per_token(config.num_hidden_layers, h, v, seq);
    match config.model_type {
        ModelType::Bert | ModelType::Roberta => bert,
        ModelType::Gpt2 => bert - 6.0 * (h * h) as f64,
    }
}

/// Model FLOPs per token of a BERT MLM training step, the anchor's formula:
/// `6 N_mm + 12 L S H` with `N_mm = 12 L H² + H² + V H`.
pub fn flops_per_token(layers: usize, hidden: usize, vocab: usize, seq: usize) -> f64 {
    let (l, h, v) = (layers as f64, hidden as f64, vocab as f64);
    let n_mm = l * 12.0 * h * h + h * h + v * h;
    6.0 * n_mm + 12.0 * l * seq as f64 * h
}

/// The GEMM throughput of this machine (GFLOP/s) for `dtype` (f32, or bf16
/// with f32 accumulation), measured with the kernels the CPU backend uses.
pub fn gemm_peak_gflops(device: &Device, dtype: DType) -> lazytrain_core::Result<f64> {
    let n = 1024;
    let a = Tensor::from_vec(vec![0.5f32; n * n], [n, n], device)?.cast(dtype)?;
    let b = Tensor::from_vec(vec![0.25f32; n * n], [n, n], device)?.cast(dtype)?;
    device.sync()?;
    let mut best = f64::MAX;
    // Ten products a millisecond's pause apart, the fastest kept: five back
    // to back once all ran while the host had taken a core away (a 2-core
    // VM read half its rate, and `mfu` read high).
    for trial in 0..10 {
        if trial > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let start = Instant::now();
        let c = a.matmul(&b)?;
        device.sync()?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(c);
    }
    Ok(2.0 * (n * n * n) as f64 / best / 1e9)
}

/// The minor page faults of this process so far (all its threads), from
/// `/proc/self/stat` (Linux only): a step that allocates nothing faults in
/// no page, one that maps a fresh buffer faults in each of its pages.
fn minor_faults() -> Option<u64> {
    minor_faults_in(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The `minflt` field of a `/proc/<pid>/stat` line.
fn minor_faults_in(stat: &str) -> Option<u64> {
    // The fields after the command name, which is parenthesised and may hold
    // spaces and parentheses of its own.
    let fields = &stat[stat.rfind(')')? + 1..];
    // `minflt` is the 10th field of the line, the 8th after the name.
    fields.split_whitespace().nth(7)?.parse().ok()
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The anchor's training step on one replica: `steps + 3` steps of the
/// model built from `config` (BERT masked LM or GPT-2), on this replica's
/// own random batch.
fn bench_replica(
    replica: &Replica,
    config: &ModelConfig,
    batch: usize,
    steps: usize,
    precision: (bool, bool),
    (dry_run, head_rows): (bool, usize),
) -> lazytrain::Result<ReplicaRun> {
    let mut init = Initializer::new(0, replica.device());
    let plan = (steps, dry_run, head_rows);
    match config.model_type {
        ModelType::Bert | ModelType::Roberta => {
            bench_model(replica, ForMaskedLM::new(&mut init, config)?, batch, plan, precision)
        }
        ModelType::Gpt2 => bench_model(replica, Gpt2LMHeadModel::new(&mut init, config)?, batch, plan, precision),
    }
}

/// [`bench_replica`] for a built model: a masked LM gets 15 % of its
/// positions masked and labelled, a causal LM its inputs as labels.
fn bench_model<M: TaskModel>(
    replica: &Replica,
    model: M,
    batch: usize,
    (steps, dry_run, head_rows): (usize, bool, usize),
    (bf16, bf16_saved_activations): (bool, bool),
) -> lazytrain::Result<ReplicaRun> {
    let device = replica.device();
    let vocab = model.config().vocab_size;
    let causal = model.config().model_type == ModelType::Gpt2;
    let params = named_parameters(&model);
    let n_params: usize = params.iter().map(|(_, p)| p.numel()).sum();
    let mut opt = AdamW::new(
        vec![ParamGroup { params, weight_decay: 0.01 }],
        AdamWConfig { lr: 1e-4, ..AdamWConfig::default() },
    )?;
    let mut u = vec![0f32; 2 * batch * SEQ];
    lazytrain_core::random::uniform_f32(0, replica.rank() as u64, &mut u);
    let ids: Vec<i64> = u[..batch * SEQ].iter().map(|&x| 5 + (x * (vocab - 5) as f32) as i64).collect();
    let masked: Vec<bool> = u[batch * SEQ..].iter().map(|&x| (x as f64) < MLM_PROBABILITY && !causal).collect();
    let mut labels: Vec<i64> = ids.iter().zip(&masked).map(|(&t, &m)| if m || causal { t } else { -100 }).collect();
    let mut inputs: Vec<i64> = ids.iter().zip(&masked).map(|(&t, &m)| if m { 4 } else { t }).collect();
    // The masked positions, for a head that runs only there (`head_rows` slots),
    // gathered as the MLM collator gathers them.
    let selected = match head_rows < batch * SEQ {
        true => {
            let s = select_labelled(&mut inputs, &mut labels, &ids, head_rows);
            Some((
                Tensor::from_vec(s.positions, [head_rows], device)?,
                Tensor::from_vec(s.labels, [head_rows], device)?,
            ))
        }
        false => None,
    };
    let input_ids = Tensor::from_vec(inputs, [batch, SEQ], device)?;
    let labels = Tensor::from_vec(labels, [batch, SEQ], device)?;
    let config = StepConfig {
        autocast: bf16.then_some(DType::BF16),
        saved_activations: bf16_saved_activations.then_some(DType::BF16),
        ..StepConfig::default()
    };
    let mut times = Vec::new();
    let mut first_loss = f32::NAN;
    let mut last_loss = f32::NAN;
    let mut faults_before_timed = None;
    for step in 0..steps + 3 {
        if step == 3 && replica.is_master() {
            // The profile covers the timed steps only (not the first step's page faults).
            lazytrain_core::backend::profile::reset();
            faults_before_timed = minor_faults();
        }
        let start = Instant::now();
        let ctx = Context::train(device, replica.rank() as i64, step as i64)?;
        if dry_run {
            device.plan_next_sync();
        }
        let output = train_step(device, &mut opt, &[()], &config, &[], |_| -> lazytrain::Result<_> {
            if let Some((positions, picked)) = &selected {
                if let Some(logits) = model.forward_at(&input_ids, None, None, positions, &ctx)? {
                    return Ok(logits.cross_entropy(picked, -100)?);
                }
            }
            let logits = model.forward(&input_ids, None, None, &ctx)?;
            Ok(logits.cross_entropy(&model.targets(&labels)?, -100)?)
        });
        let output = match (output, dry_run) {
            (Err(e), true) => {
                let bytes = 4 * n_params as u64;
                let plan = lazytrain::trainer::plan::StepPlan::from_dry_run(e, batch, bytes, 2 * bytes)?;
                return Ok(ReplicaRun {
                    plan: Some(plan),
                    times: Vec::new(),
                    first_loss: f32::NAN,
                    last_loss: f32::NAN,
                    backend: device.backend_name(),
                    world: replica.world_size(),
                    params: n_params,
                    compiles: 0,
                    cache_hits: 0,
                    compile_ms: 0.0,
                    timed_faults: None,
                });
            }
            (output, _) => output?,
        };
        let value = output.loss.item::<f32>()?;
        times.push(start.elapsed().as_secs_f64());
        if step == 0 {
            first_loss = value;
        }
        last_loss = value;
    }
    let timed_faults = faults_before_timed.zip(minor_faults()).map(|(before, after)| after.saturating_sub(before));
    let m = device.metrics();
    // The group's totals (every replica of every process), read before this
    // sum's own compile counts.
    let local = vec![m.compiles as f64, m.cache_hits as f64, m.compile_ms];
    let totals = match replica.world_size() {
        1 => local,
        _ => Tensor::from_vec(local, [3], device)?.all_reduce(AllReduceOp::Sum)?.to_vec::<f64>()?,
    };
    Ok(ReplicaRun {
        plan: None,
        times,
        first_loss,
        last_loss,
        backend: device.backend_name(),
        world: replica.world_size(),
        params: n_params,
        compiles: totals[0] as u64,
        cache_hits: totals[1] as u64,
        compile_ms: totals[2],
        timed_faults,
    })
}

/// Run the benchmark and print the figures.
pub fn run(args: &BenchArgs) -> lazytrain::Result<()> {
    let Some((layers, hidden, heads, vocab, batch)) = anchor_config(&args.model) else {
        return Err(lazytrain::Error::Input(format!(
            "unknown bench model `{}`; choose tiny, mini, small, base, gpt2-tiny, gpt2-mini or gpt2-small",
            args.model
        )));
    };
    if args.replicas == 0 || args.steps == 0 {
        return Err(lazytrain::Error::Input("--replicas and --steps must be at least 1".into()));
    }
    let preset = if args.model.starts_with("gpt2-") { "gpt2-tiny" } else { "bert-tiny" };
    let mut config = ModelConfig::preset(preset, vocab)?;
    config.hidden_size = hidden;
    config.num_hidden_layers = layers;
    config.num_attention_heads = heads;
    config.intermediate_size = 4 * hidden;
    let causal = config.model_type == ModelType::Gpt2;
    // The masked-LM head's rows: the capacity of the masked positions, or every token.
    let head_rows = match causal || args.mlm_dense_head {
        true => batch * SEQ,
        false => label_capacity(batch * SEQ, MLM_PROBABILITY),
    };
    let runs = spawn(&SpawnConfig::new(args.replicas), |replica| {
        let precision = (args.bf16, args.bf16_saved_activations);
        bench_replica(replica, &config, batch, args.steps, precision, (args.dry_run, head_rows))
    })?;
    if let Some(plan) = &runs[0].plan {
        if lazytrain_dist::is_master_process() {
            let mut report = plan.to_json();
            report["config"] = serde_json::json!(args.model);
            report["precision"] = serde_json::json!(if args.bf16 { "bf16" } else { "fp32" });
            report["params"] = serde_json::json!(runs[0].params);
            match args.json {
                true => println!("{report}"),
                false => println!("{plan}"),
            }
        }
        return Ok(());
    }
    // The replicas step in lockstep (they meet in every all-reduce): the
    // master's step times are the group's.
    let master = &runs[0];
    let first_step_s = master.times[0];
    let mut timed = master.times[3..].to_vec();
    timed.sort_by(f64::total_cmp);
    let median = timed[timed.len() / 2];
    if !lazytrain_dist::is_master_process() {
        // Under MPI, rank 0's process reports for the group.
        return Ok(());
    }
    let tokens = (master.world * batch * SEQ) as f64;
    let gflops = anchor_flops_per_token(&config, SEQ) * tokens / median / 1e9;
    let executed = executed_flops_per_token(&config, SEQ, head_rows, batch * SEQ) * tokens / median / 1e9;
    let (compiles, cache_hits, compile_ms) = (master.compiles, master.cache_hits, master.compile_ms);
    let precision = if args.bf16 { DType::BF16 } else { DType::F32 };
    // The profile covers the training steps, not the GEMM-peak probe.
    let profile = lazytrain_core::backend::profile::enabled().then(lazytrain_core::backend::profile::report);
    // Under MPI every process has its own cores (mpirun binds them): the
    // group's peak is this process's times the processes.
    let processes = lazytrain_dist::mpi_job_position().map_or(1, |(_, n)| n);
    let peak = gemm_peak_gflops(&Device::on_backend(master.backend)?, precision)? * processes as f64;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fma_peak = lazytrain_core::fma_peak_gflops(threads) * processes as f64;
    let mut report = serde_json::json!({
        "framework": "lazytrain", "config": args.model, "arch": config.model_type.name(), "precision": if args.bf16 { "bf16" } else { "fp32" },
        "bf16_saved_activations": args.bf16_saved_activations,
        "replicas": master.world, "processes": processes,
        "batch": batch, "seq": SEQ,
        "params": master.params,
        "backend": master.backend,
        "first_step_s": (first_step_s * 1000.0).round() / 1000.0, "first_loss": master.first_loss,
        "loss": master.last_loss,
        "compile_ms": (compile_ms * 100.0).round() / 100.0,
        "step_ms_median": (median * 1e5).round() / 100.0, "tokens_per_s": (tokens / median * 10.0).round() / 10.0,
        "model_gflops": (gflops * 100.0).round() / 100.0, "gemm_peak_gflops": (peak * 100.0).round() / 100.0,
        "mfu": (gflops / peak * 1000.0).round() / 1000.0, "compiles": compiles, "cache_hits": cache_hits,
        "mlm_head": if head_rows == batch * SEQ { "dense" } else { "masked-positions" }, "mlm_head_rows": head_rows,
        "executed_gflops": (executed * 100.0).round() / 100.0,
        "mfu_executed": (executed / peak * 1000.0).round() / 1000.0,
        "fma_peak_gflops": (fma_peak * 100.0).round() / 100.0,
        "peak_rss_mb": peak_rss_mb().round(),
        "page_faults_per_step": master.timed_faults.map(|f| f / timed.len() as u64),
    });
    if args.bf16 {
        report["bf16_matmul"] = serde_json::json!(lazytrain_core::bf16_matmul_method());
    } else {
        // The share of the f32 FMA units' rate the step's matmul work used:
        // 1 would be a step of nothing but matmuls at the hardware's peak.
        report["executed_of_fma_peak"] = serde_json::json!((executed / fma_peak * 1000.0).round() / 1000.0);
    }
    if let Some(profile) = profile {
        eprint!("{profile}");
    }
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The executed FLOPs of BERT-tiny's step, counted matmul by matmul:
    /// every layer's projections and attention at all 4 096 tokens except
    /// the last layer's output projection and feed-forward block, which run
    /// at the 800 masked-position rows, as the head does.
    #[test]
    fn executed_flops_count_the_rows_the_last_layer_and_head_skip() {
        let mut config = ModelConfig::preset("bert-tiny", 8192).unwrap();
        (config.hidden_size, config.intermediate_size, config.num_hidden_layers) = (128, 512, 2);
        let (tokens, rows, (h, i, v, s)) = (4096.0, 800.0, (128.0, 512.0, 8192.0, 128.0));
        let per_layer_row = 4.0 * h * h + 2.0 * h * i + 2.0 * s * h;
        let kept_last_layer_row = 3.0 * h * h + 2.0 * s * h;
        let macs = tokens * (per_layer_row + kept_last_layer_row)
            + rows * (per_layer_row - kept_last_layer_row)
            + rows * (h * h + v * h);
        let counted = executed_flops_per_token(&config, 128, 800, 4096) * tokens;
        assert!((counted - 6.0 * macs).abs() <= 1e-9 * counted, "{counted} vs {}", 6.0 * macs);
        assert_eq!(executed_flops_per_token(&config, 128, 4096, 4096), anchor_flops_per_token(&config, 128));
    }

    /// `minflt` is read past a command name with spaces and parentheses,
    /// and this process's own count is there on Linux and only grows.
    #[test]
    fn minor_faults_are_the_tenth_field_of_the_stat_line() {
        let line = "4242 (lazy (train) x) R 1 4242 4242 0 -1 4194560 18225 0 3 0 120 30 0 0 20 0 3 0 99 1 2\n";
        assert_eq!(minor_faults_in(line), Some(18225));
        assert_eq!(minor_faults_in("4242 (truncated) R 1 2"), None);
        if cfg!(target_os = "linux") {
            let before = minor_faults().unwrap();
            std::hint::black_box(vec![1u8; 8 << 20]);
            assert!(minor_faults().unwrap() >= before);
        }
    }
}
