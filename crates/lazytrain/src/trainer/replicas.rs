//! Running a training job on data-parallel replicas.

use super::TrainingArguments;
use crate::{Error, Result};
use lazytrain_core::Device;
use lazytrain_dist::{spawn, SpawnConfig};
use std::time::Duration;

/// Run `job` once per replica and return this process's first replica's
/// result (the master's, outside MPI): on a plain CPU device for one
/// replica, on the devices of a [`spawn`]ed group otherwise (each replica
/// builds its own model and [`super::Trainer`] on the device it is given;
/// they share one compile cache, and the Trainer shards the data, averages
/// gradients and lets only the master log and save). Under `mpirun -n N`
/// every process runs `num_replicas` replicas of the N × `num_replicas`.
pub fn run_replicas<T: Send>(num_replicas: usize, job: impl Fn(&Device) -> Result<T> + Sync) -> Result<T> {
    run_replicas_with(&SpawnConfig::new(num_replicas), job)
}

/// [`run_replicas`] with `args.num_replicas` replicas and its collective timeout.
pub fn run_replicas_for<T: Send>(args: &TrainingArguments, job: impl Fn(&Device) -> Result<T> + Sync) -> Result<T> {
    let timeout = Duration::try_from_secs_f64(args.collective_timeout)
        .map_err(|e| Error::Input(format!("collective_timeout {} is not a duration: {e}", args.collective_timeout)))?;
    run_replicas_with(&SpawnConfig::new(args.num_replicas).with_collective_timeout(timeout), job)
}

/// [`run_replicas`] with the replicas `config` describes.
fn run_replicas_with<T: Send>(config: &SpawnConfig, job: impl Fn(&Device) -> Result<T> + Sync) -> Result<T> {
    let num_replicas = config.replicas;
    if num_replicas <= 1 && lazytrain_dist::mpi_job_position().is_none() {
        return job(&Device::cpu());
    }
    let mut results = spawn(config, |replica| job(replica.device()))?;
    Ok(results.swap_remove(0))
}
