//! The `lazytrain` command line.

mod bench_trace;
mod demo;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Train transformer language models with lazy tensors.
#[derive(Parser)]
#[command(name = "lazytrain", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The end-to-end demo: today, gradient-descent linear regression run as
    /// one cached graph per step (the MLM training demo arrives with the Trainer).
    Demo(demo::DemoArgs),
    /// Measure tracing cost per node and the cut+hash+lookup time of a large graph.
    BenchTrace(bench_trace::BenchTraceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::BenchTrace(args) => bench_trace::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
