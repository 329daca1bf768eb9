//! `lazytrain bench-trace`: the cost of tracing, and of cutting, hashing and
//! looking up a large graph, on this machine.

use clap::Args;
use lazytrain_core::{DType, Device, Tensor};
use std::time::Instant;

/// Options for `lazytrain bench-trace`.
#[derive(Args)]
pub struct BenchTraceArgs {
    /// Nodes in the traced graph.
    #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000_000))]
    nodes: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    repeats: usize,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
}

/// Trace a chain of `nodes` elementwise ops over a small tensor.
fn trace_chain(x: &Tensor, nodes: usize) -> lazytrain_core::Result<Tensor> {
    let mut y = x.clone();
    for i in 0..nodes {
        y = match i % 4 {
            0 => y.add(x)?,
            1 => y.mul(x)?,
            2 => y.tanh()?,
            _ => y.sub(x)?,
        };
    }
    Ok(y)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run the benchmark and print the figures.
pub fn run(args: &BenchTraceArgs) -> lazytrain_core::Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![0.5f32; 16], [4, 4], &dev)?;
    let _ = Tensor::zeros([1], DType::F32, &dev)?;
    let mut trace_us = Vec::new();
    let mut lookup_ms = Vec::new();
    for _ in 0..args.repeats + 1 {
        let start = Instant::now();
        let y = trace_chain(&x, args.nodes)?;
        trace_us.push(start.elapsed().as_secs_f64() * 1e6 / args.nodes as f64);
        let before = dev.metrics().lookup_ms;
        dev.sync()?;
        lookup_ms.push(dev.metrics().lookup_ms - before);
        drop(y);
    }
    // The first round compiled; the rest are cache hits.
    let (trace_us, lookup_ms) = (median(trace_us[1..].to_vec()), median(lookup_ms[1..].to_vec()));
    let m = dev.metrics();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "nodes": args.nodes, "trace_us_per_node": trace_us, "cut_hash_lookup_ms": lookup_ms,
                "compiles": m.compiles, "cache_hits": m.cache_hits,
            })
        );
    } else {
        println!("traced {} nodes: {:.3} us/node (median of {})", args.nodes, trace_us, args.repeats);
        println!("cut + hash + cache lookup: {:.3} ms", lookup_ms);
        println!("compiles {}, cache hits {}", m.compiles, m.cache_hits);
    }
    Ok(())
}
