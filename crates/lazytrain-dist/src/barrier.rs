//! A reusable barrier that a failing replica can abort.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a waiter spins before it sleeps: replicas usually arrive within
/// microseconds of each other, and waking a sleeping thread costs more.
const SPIN: Duration = Duration::from_micros(50);

#[derive(Default)]
struct State {
    arrived: usize,
    generation: u64,
}

/// Why a barrier was aborted: the replica and its message.
#[derive(Clone, Debug)]
pub(crate) struct Abort {
    pub rank: usize,
    pub message: String,
}

/// A barrier for `parties` threads, reusable across generations.
pub(crate) struct Barrier {
    parties: usize,
    state: Mutex<State>,
    released: Condvar,
    generation: AtomicU64,
    aborted: OnceLock<Abort>,
}

impl Barrier {
    pub(crate) fn new(parties: usize) -> Barrier {
        Barrier {
            parties,
            state: Mutex::new(State::default()),
            released: Condvar::new(),
            generation: AtomicU64::new(0),
            aborted: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The first abort, if any.
    pub(crate) fn aborted(&self) -> Option<&Abort> {
        self.aborted.get()
    }

    /// Abort the barrier: waiters that the last arrival has not released yet
    /// return the abort, and so does every later `wait`. The first abort wins.
    pub(crate) fn abort(&self, rank: usize, message: String) {
        let _ = self.aborted.set(Abort { rank, message });
        let _state = self.lock();
        self.released.notify_all();
    }

    /// Wait for every party, or for an abort. A generation completes
    /// atomically: either all parties pass it or none does.
    pub(crate) fn wait(&self) -> Result<(), Abort> {
        self.wait_inner(true)
    }

    /// Wait for every party, ignoring aborts. Only for barriers every party is
    /// certain to reach (inside a collective, after an abortable barrier all
    /// of them passed together).
    pub(crate) fn wait_all(&self) {
        let _ = self.wait_inner(false);
    }

    fn wait_inner(&self, abortable: bool) -> Result<(), Abort> {
        let mut state = self.lock();
        if abortable {
            if let Some(abort) = self.aborted.get() {
                return Err(abort.clone());
            }
        }
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.parties {
            state.arrived = 0;
            state.generation += 1;
            self.generation.store(state.generation, Ordering::Release);
            self.released.notify_all();
            return Ok(());
        }
        drop(state);
        let spin_until = Instant::now() + SPIN;
        while Instant::now() < spin_until {
            if self.generation.load(Ordering::Acquire) != generation {
                return Ok(());
            }
            if abortable && self.aborted.get().is_some() {
                break;
            }
            std::hint::spin_loop();
        }
        let mut state = self.lock();
        loop {
            if state.generation != generation {
                return Ok(());
            }
            if abortable {
                if let Some(abort) = self.aborted.get() {
                    // Withdraw, so the generation cannot complete without us.
                    state.arrived -= 1;
                    return Err(abort.clone());
                }
            }
            state = self.released.wait_timeout(state, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_party_passes_each_generation_together() {
        let barrier = Barrier::new(3);
        let counter = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for round in 0..50 {
                        counter.fetch_add(1, Ordering::SeqCst);
                        barrier.wait().unwrap();
                        // Nobody starts round + 1 before all finished round.
                        assert!(counter.load(Ordering::SeqCst) >= 3 * (round + 1));
                        barrier.wait().unwrap();
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::SeqCst), 150);
    }

    #[test]
    fn an_abort_releases_the_waiters_with_its_reason() {
        let barrier = Barrier::new(3);
        let started = Instant::now();
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| barrier.wait())).collect();
            std::thread::sleep(Duration::from_millis(20));
            barrier.abort(2, "replica 2 failed".into());
            for w in waiters {
                let abort = w.join().unwrap().unwrap_err();
                assert_eq!((abort.rank, abort.message.as_str()), (2, "replica 2 failed"));
            }
        });
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(barrier.wait().is_err(), "later waits fail at once");
    }
}
