//! Launchers: how the replicas of a group come to exist, and what each gets
//! (its rank, its backend, its collective). [`ThreadLauncher`] runs them as
//! threads of this process over the in-process collective; a launcher for
//! processes and hosts (MPI) yields this process's replicas over its own
//! collective, and [`crate::spawn_with`] runs them the same way.

use crate::in_process::InProcessCollective;
use crate::SpawnConfig;
use lazytrain_core::backend::{self, Backend};
use lazytrain_core::collective::Collective;
use std::sync::Arc;

/// What one replica run by this process gets from its launcher.
#[derive(Clone)]
pub struct ReplicaSetup {
    /// The replica's rank in the whole group (0 is the master).
    pub rank: usize,
    /// The backend its device runs on.
    pub backend: Arc<dyn Backend>,
    /// The group's collective, as this replica reaches it.
    pub collective: Arc<dyn Collective>,
}

impl std::fmt::Debug for ReplicaSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replica {} of {} on {}", self.rank, self.collective.world_size(), self.backend.name())
    }
}

/// Starts the replicas of a group: yields the ones this process runs.
pub trait Launcher: Sync {
    /// The replicas this process runs (each becomes a thread with its own
    /// device), in rank order. Fails when the group cannot be formed.
    fn replicas(&self, config: &SpawnConfig) -> Result<Vec<ReplicaSetup>, String>;
}

/// `config.replicas` threads of this process, reducing in shared memory
/// ([`InProcessCollective`]). Each replica gets a backend of its own of the
/// kind `LAZYTRAIN_BACKEND` names (the CPU by default) with
/// [`SpawnConfig::threads`] kernel threads, unless one backend is given for
/// all of them.
#[derive(Clone, Default)]
pub struct ThreadLauncher {
    /// One backend every replica shares (default: one per replica, from
    /// [`backend::from_env`]).
    pub backend: Option<Arc<dyn Backend>>,
}

impl Launcher for ThreadLauncher {
    fn replicas(&self, config: &SpawnConfig) -> Result<Vec<ReplicaSetup>, String> {
        if config.replicas == 0 {
            return Err("the number of replicas must be at least 1".into());
        }
        let collective: Arc<dyn Collective> = Arc::new(InProcessCollective::new(config.replicas));
        (0..config.replicas)
            .map(|rank| {
                let backend = match &self.backend {
                    Some(backend) => backend.clone(),
                    None => backend::from_env(Some(config.threads())).map_err(|e| e.to_string())?,
                };
                Ok(ReplicaSetup { rank, backend, collective: collective.clone() })
            })
            .collect()
    }
}
