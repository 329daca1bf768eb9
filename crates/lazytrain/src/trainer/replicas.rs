//! Running a training job on data-parallel replicas.

use crate::Result;
use lazytrain_core::Device;
use lazytrain_dist::{spawn, SpawnConfig};

/// Run `job` once per replica and return this process's first replica's
/// result (the master's, outside MPI): on a plain CPU device for one
/// replica, on the devices of a [`spawn`]ed group otherwise (each replica
/// builds its own model and [`super::Trainer`] on the device it is given;
/// they share one compile cache, and the Trainer shards the data, averages
/// gradients and lets only the master log and save). Under `mpirun -n N`
/// every process runs `num_replicas` replicas of the N × `num_replicas`.
pub fn run_replicas<T: Send>(num_replicas: usize, job: impl Fn(&Device) -> Result<T> + Sync) -> Result<T> {
    if num_replicas <= 1 && lazytrain_dist::mpi_job_position().is_none() {
        return job(&Device::cpu());
    }
    let mut results = spawn(&SpawnConfig::new(num_replicas), |replica| job(replica.device()))?;
    Ok(results.swap_remove(0))
}
