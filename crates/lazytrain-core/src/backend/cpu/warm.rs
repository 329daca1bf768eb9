//! Kernel threads kept awake for the length of a run.
//!
//! A step is a few hundred kernels, most of them split over the pool's
//! threads. Between two split kernels a rayon worker with nothing to do
//! goes to sleep after a few dozen rounds of looking for work, and the next
//! split kernel wakes it with a futex: on a 2-core virtual machine the
//! wake-ups cost 4-8 % of a step (`perf`: `try_to_wake_up` under
//! `futex_wake`, BERT-tiny). While a run lasts, every other thread of the
//! pool therefore runs a job that keeps executing the pool's pending work
//! and, between jobs, yields the core instead of sleeping (OpenMP runtimes
//! spin the same way, for `KMP_BLOCKTIME`); it returns when the run ends.
//! The run itself always leads from the pool's first thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Pause instructions between two looks for work while a kept-warm thread
/// finds none (each look touches the pool's shared queues).
const PAUSES_PER_LOOK: u32 = 16;
/// Fruitless looks after which a kept-warm thread yields its core once (to
/// any other thread the system has ready to run).
const LOOKS_PER_YIELD: u32 = 64;

/// Run `run` on `pool`'s first thread while its other threads stay awake
/// executing the pool's work, and return its result. The run always has the
/// same leader: a leader that changed from run to run (whichever thread was
/// awake took the next run) allocated the step's buffers from two threads'
/// malloc arenas, and the peak RSS of a BERT-small step grew from 0.75 to
/// 1.26 GB in some runs. Like every broadcast, it returns (or unwinds)
/// only once every thread's job has returned: no thread is left spinning.
pub(super) fn run_on_first_thread<R: Send>(pool: &rayon::ThreadPool, run: impl FnOnce() -> R + Send) -> R {
    let running = AtomicBool::new(true);
    let run = Mutex::new(Some(run));
    let mut results = pool.broadcast(|ctx| match ctx.index() {
        0 => {
            let _ends = RunEnds(&running);
            let run = run.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            run.map(|f| f())
        }
        _ => {
            stay_busy(&running);
            None
        }
    });
    results.swap_remove(0).expect("the first thread ran the step")
}

/// Turns `running` off when dropped: when the run returns, or unwinds.
struct RunEnds<'a>(&'a AtomicBool);

impl Drop for RunEnds<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Run the pool's pending jobs until `running` turns false, yielding the
/// core between them (never sleeping on a futex).
/// While profiling, the idle rounds are timed for the report.
fn stay_busy(running: &AtomicBool) {
    let profiling = crate::backend::profile::enabled();
    let mut idle = 0u32;
    while running.load(Ordering::Acquire) {
        let look = profiling.then(std::time::Instant::now);
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            Some(rayon::Yield::Idle) | None => {
                idle += 1;
                if idle.is_multiple_of(LOOKS_PER_YIELD) {
                    std::thread::yield_now();
                } else {
                    (0..PAUSES_PER_LOOK).for_each(|_| std::hint::spin_loop());
                }
                if let Some(look) = look {
                    crate::backend::profile::add_idle(look.elapsed().as_nanos() as u64);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// One kept-warm run of split work on `pool`: its sum and the thread
    /// that led it.
    fn kept_warm_sum(pool: &rayon::ThreadPool) -> (u64, Option<usize>) {
        run_on_first_thread(pool, || {
            let (a, b) = rayon::join(|| (0..1000u64).sum::<u64>(), || (1000..2000u64).sum::<u64>());
            (a + b, rayon::current_thread_index())
        })
    }

    /// `f` on another thread, its result within ten seconds (a thread left
    /// spinning, or two runs holding each other, would hang instead).
    fn within_ten_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || send.send(f()));
        receive.recv_timeout(Duration::from_secs(10)).expect("finished in time")
    }

    /// Runs led by the first thread compute their work, the kept-warm jobs
    /// end with their runs (a run returns only when every thread's job has:
    /// a job left spinning would hang it), runs from two threads sharing one
    /// pool do not hold each other, and a run that panics ends its
    /// kept-warm jobs too.
    #[test]
    fn kept_warm_threads_run_the_work_and_stop_with_the_run() {
        let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap());
        let expected = (0..2000u64).sum::<u64>();
        let sequential = pool.clone();
        let runs = within_ten_seconds(move || (0..50).map(|_| kept_warm_sum(&sequential)).collect::<Vec<_>>());
        assert!(runs.iter().all(|&run| run == (expected, Some(0))), "{runs:?}");
        let concurrent = pool.clone();
        let sums = within_ten_seconds(move || {
            std::thread::scope(|scope| {
                let runs: Vec<_> = (0..2)
                    .map(|_| scope.spawn(|| (0..50).map(|_| kept_warm_sum(&concurrent).0).sum::<u64>()))
                    .collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect::<Vec<_>>()
            })
        });
        assert_eq!(sums, vec![50 * expected; 2]);
        let panicking = pool.clone();
        let outcome = within_ten_seconds(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_on_first_thread(&panicking, || panic!("a kernel failed"))
            }))
            .is_err()
        });
        assert!(outcome, "the panic reaches the caller");
    }

    /// While profiling, a kept-warm thread with nothing to do counts the
    /// time it looked for work: a run that keeps its leader busy for 30 ms
    /// alone leaves at least 10 ms of idle time on the other thread's count
    /// (whether it spun or the host parked it meanwhile).
    #[test]
    fn kept_warm_threads_count_their_idle_time_while_profiling() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let was = crate::backend::profile::enabled();
        crate::backend::profile::set_enabled(true);
        let before = crate::backend::profile::idle_nanos();
        run_on_first_thread(&pool, || std::thread::sleep(Duration::from_millis(30)));
        let idle = crate::backend::profile::idle_nanos() - before;
        crate::backend::profile::set_enabled(was);
        assert!(idle >= 10_000_000, "{idle} ns idle");
    }
}
