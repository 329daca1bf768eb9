//! `--dry-run`: a training step compiled and its memory planned without
//! running it, reported as parameters, optimizer state and the rest
//! (activations and gradients), with the largest buffers and the batch
//! size that would fit.

use crate::{Error, Result};
use lazytrain_core::backend::ExecutableStats;
use serde_json::json;

/// What one training step will take, known before it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPlan {
    /// Rows per micro-batch the step was planned with.
    pub batch_size: usize,
    /// Bytes of the model's parameters.
    pub parameter_bytes: u64,
    /// Bytes of the optimizer's state (AdamW: two moments per parameter).
    pub optimizer_bytes: u64,
    /// Bytes of all the step's inputs (parameters, optimizer state, batch).
    pub input_bytes: u64,
    /// The compiled step's plan.
    pub stats: ExecutableStats,
    /// Bytes the system has available now, when known.
    pub available_bytes: Option<u64>,
}

const MB: f64 = (1 << 20) as f64;

impl StepPlan {
    /// The plan carried by a dry run's error, or the error itself.
    pub fn from_dry_run(
        error: Error,
        batch_size: usize,
        parameter_bytes: u64,
        optimizer_bytes: u64,
    ) -> Result<StepPlan> {
        match error {
            Error::Core(lazytrain_core::Error::DryRun { stats, input_bytes }) => Ok(StepPlan {
                batch_size,
                parameter_bytes,
                optimizer_bytes,
                input_bytes,
                stats: *stats,
                available_bytes: lazytrain_core::available_memory_bytes(),
            }),
            other => Err(other),
        }
    }

    /// Bytes alive at the step's peak.
    pub fn peak_bytes(&self) -> u64 {
        self.stats.peak_bytes as u64
    }

    /// Bytes of everything but parameters and optimizer state at the peak
    /// (activations, gradients, the batch).
    pub fn other_bytes(&self) -> u64 {
        self.peak_bytes().saturating_sub(self.parameter_bytes + self.optimizer_bytes)
    }

    /// About the largest batch size whose step fits in the available
    /// memory, scaling the activations linearly (gradients do not scale).
    pub fn largest_batch(&self) -> Option<usize> {
        let budget = self.available_bytes? + self.input_bytes;
        let fixed = 2 * self.parameter_bytes + self.optimizer_bytes; // weights, their gradients, moments
        let per_row = self.peak_bytes().saturating_sub(fixed) / self.batch_size.max(1) as u64;
        Some(budget.saturating_sub(fixed).checked_div(per_row).map_or(usize::MAX, |rows| rows as usize))
    }

    /// The plan as JSON (`planned_peak_mb` among the rest).
    pub fn to_json(&self) -> serde_json::Value {
        let mb = |b: u64| (b as f64 / MB * 10.0).round() / 10.0;
        json!({
            "dry_run": true, "batch_size": self.batch_size, "planned_peak_mb": mb(self.peak_bytes()),
            "parameters_mb": mb(self.parameter_bytes), "optimizer_mb": mb(self.optimizer_bytes),
            "activations_and_gradients_mb": mb(self.other_bytes()),
            "largest_buffers_mb": self.stats.largest_buffers.iter().filter(|&&b| b > 0).map(|&b| mb(b)).collect::<Vec<_>>(),
            "kernels": self.stats.kernels, "available_mb": self.available_bytes.map(mb),
            "largest_batch_that_fits": self.largest_batch(),
        })
    }
}

impl std::fmt::Display for StepPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: u64| b as f64 / MB;
        writeln!(
            f,
            "dry run: the training step (batch {}) compiles to {} kernels; planned peak {:.0} MB",
            self.batch_size,
            self.stats.kernels,
            mb(self.peak_bytes())
        )?;
        writeln!(f, "  parameters                 {:>9.1} MB", mb(self.parameter_bytes))?;
        writeln!(f, "  optimizer state            {:>9.1} MB", mb(self.optimizer_bytes))?;
        writeln!(f, "  activations and gradients  {:>9.1} MB", mb(self.other_bytes()))?;
        let largest: Vec<String> =
            self.stats.largest_buffers.iter().filter(|&&b| b > 0).map(|&b| format!("{:.1}", mb(b))).collect();
        writeln!(f, "  largest buffers            {} MB", largest.join(", "))?;
        match (self.available_bytes, self.largest_batch()) {
            (Some(available), Some(batch)) => write!(
                f,
                "  available memory           {:>9.1} MB: {}; the largest batch that fits is about {batch}",
                mb(available),
                if self.peak_bytes() <= available + self.input_bytes { "fits" } else { "DOES NOT FIT" }
            ),
            _ => write!(f, "  available memory           unknown on this platform"),
        }
    }
}
