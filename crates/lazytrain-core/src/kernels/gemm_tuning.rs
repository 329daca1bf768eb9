//! A `gemm` route chosen by thresholds is tried against the direct call on
//! this machine, and the faster one kept.
//!
//! [`GemmRoute::of`] copies a transposed right operand row-major, or
//! computes a tall, narrow product column-major and transposes it, where
//! that was measured faster on some machine. On another it can be slower:
//! BERT-small's masked-position decoder gradient (`[440, 8192]^T x [440,
//! 512]`), computed column-major as the Intel Xeon preferred, took 1.3x the
//! direct call on an AMD Zen 4, while BERT-tiny's dense one (`[4096,
//! 8192]^T x [4096, 128]`) was faster column-major there too. The first
//! calls of each such product (by shape, strides and threads) therefore
//! alternate between the planned route and the direct one, and from then on
//! the faster of the two (best of [`TRIALS_PER_ROUTE`] calls each) runs.
//! Both routes give the same bits (`gemm` sums every element in the same
//! order whichever way it is laid out; the tests check it across `k`
//! blocks), so results never depend on which one won. The split shared
//! dimension changes the bits and is never tried.

use super::gemm::GemmRoute;
use rustc_hash::FxHashMap;
use std::sync::{LazyLock, Mutex};

/// Timed calls of each candidate route before one is kept.
pub(crate) const TRIALS_PER_ROUTE: u8 = 2;

/// Products with fewer multiply-adds run their planned route untried: too
/// short to time, too short to matter.
const TRIED_FROM_MACS: usize = 1 << 25;

/// True when an `m x k x n` product planned on `route` is tried against the
/// direct call: a copy planned for a product of at least
/// [`TRIED_FROM_MACS`] multiply-adds.
pub(crate) fn tried(route: GemmRoute, (m, k, n): (usize, usize, usize)) -> bool {
    match route {
        GemmRoute::CopyRhs | GemmRoute::TransposeOutput => m * k * n >= TRIED_FROM_MACS,
        GemmRoute::Direct | GemmRoute::SplitK => false,
    }
}

/// What identifies a product for its trials: `(m, k, n)`, both operands'
/// strides and the threads it runs on.
pub(crate) type RouteKey = ((usize, usize, usize), (usize, usize), (usize, usize), usize);

/// The key of an `m x k x n` product with operand strides `a` and `b` run
/// with `parallelism`.
pub(crate) fn route_key(
    dims: (usize, usize, usize),
    a: (usize, usize),
    b: (usize, usize),
    parallelism: gemm::Parallelism,
) -> RouteKey {
    let threads = match parallelism {
        gemm::Parallelism::Rayon(threads) => threads,
        gemm::Parallelism::None => 1,
    };
    (dims, a, b, threads)
}

/// The trials of one product's two candidate routes, or the route kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Trials {
    /// Still timing: the candidates, the best time of each so far (seconds)
    /// and how many calls each has had.
    Running { candidates: [GemmRoute; 2], best: [f64; 2], runs: [u8; 2] },
    /// The faster candidate, and both best times.
    Kept { route: GemmRoute, best: [f64; 2], candidates: [GemmRoute; 2] },
}

/// Which route the next call of a product takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pick {
    /// Run this route without timing it.
    Untimed(GemmRoute),
    /// Run candidate `index` and report its time.
    Timed(GemmRoute, usize),
}

impl Trials {
    /// Trials of `planned` against the direct call.
    pub(crate) fn new(planned: GemmRoute) -> Trials {
        Trials::Running { candidates: [planned, GemmRoute::Direct], best: [f64::INFINITY; 2], runs: [0; 2] }
    }

    /// The route of the next call: the candidate with fewer calls so far
    /// (the planned one first), or the one kept.
    pub(crate) fn pick(&self) -> Pick {
        match *self {
            Trials::Running { candidates, runs, .. } => {
                let index = usize::from(runs[1] < runs[0]);
                Pick::Timed(candidates[index], index)
            }
            Trials::Kept { route, .. } => Pick::Untimed(route),
        }
    }

    /// Count a call of candidate `index` that took `seconds`; once every
    /// candidate has had its calls, keep the faster (the planned one on a tie).
    pub(crate) fn record(&mut self, index: usize, seconds: f64) {
        let Trials::Running { candidates, mut best, mut runs } = *self else { return };
        best[index] = best[index].min(seconds);
        runs[index] = runs[index].saturating_add(1);
        *self = match runs.iter().all(|&r| r >= TRIALS_PER_ROUTE) {
            true => Trials::Kept { route: candidates[usize::from(best[1] < best[0])], best, candidates },
            false => Trials::Running { candidates, best, runs },
        };
    }
}

/// Every tried product of this process.
static TABLE: LazyLock<Mutex<FxHashMap<RouteKey, Trials>>> = LazyLock::new(Mutex::default);

/// The route the next call of product `key`, planned on `planned`, takes.
pub(crate) fn pick(key: RouteKey, planned: GemmRoute) -> Pick {
    let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    table.entry(key).or_insert_with(|| Trials::new(planned)).pick()
}

/// The route the trials of product `key` kept, or `None` while they run (or
/// before they start): a product with an epilogue runs whole, timed, until
/// its trials are over, and then by row panels along the route they kept
/// where that route allows panels.
pub(crate) fn kept(key: RouteKey) -> Option<GemmRoute> {
    let table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    match table.get(&key) {
        Some(Trials::Kept { route, .. }) => Some(*route),
        Some(Trials::Running { .. }) | None => None,
    }
}

/// Count a timed call of candidate `index` of product `key`.
pub(crate) fn record(key: RouteKey, index: usize, seconds: f64) {
    let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(trials) = table.get_mut(&key) {
        trials.record(index, seconds);
    }
}

/// One line per product whose trials have ended: its shape, the route kept
/// and both candidates' best times (for `LAZYTRAIN_PROFILE`'s report).
pub fn describe() -> String {
    let table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let mut lines: Vec<String> = table
        .iter()
        .filter_map(|(&((m, k, n), a, b, threads), trials)| match *trials {
            Trials::Kept { route, best, candidates } => Some(format!(
                "  {m} x {k} x {n} (strides {a:?} {b:?}, {threads} threads): {route:?} ({:?} {:.2} ms, {:?} {:.2} ms)\n",
                candidates[0],
                best[0] * 1e3,
                candidates[1],
                best[1] * 1e3
            )),
            Trials::Running { .. } => None,
        })
        .collect();
    lines.sort();
    lines.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The candidates alternate, planned first, for their calls; then the
    /// faster by best time is kept, and a tie keeps the planned route.
    #[test]
    fn trials_alternate_then_keep_the_faster_route() {
        let mut trials = Trials::new(GemmRoute::TransposeOutput);
        let mut order = Vec::new();
        for time in [3.0, 2.0, 1.0, 4.0] {
            let Pick::Timed(route, index) = trials.pick() else { panic!("still trying") };
            order.push(route);
            trials.record(index, time);
        }
        use GemmRoute::{Direct, TransposeOutput};
        assert_eq!(order, [TransposeOutput, Direct, TransposeOutput, Direct]);
        assert_eq!(trials.pick(), Pick::Untimed(TransposeOutput), "best 1.0 against 2.0");
        let mut slower = Trials::new(GemmRoute::CopyRhs);
        for (index, time) in [(0, 5.0), (1, 2.0), (0, 4.0), (1, 3.0)] {
            slower.record(index, time);
        }
        assert_eq!(slower.pick(), Pick::Untimed(Direct));
        let mut tie = Trials::new(GemmRoute::CopyRhs);
        for index in [0, 1, 0, 1] {
            tie.record(index, 1.0);
        }
        assert_eq!(tie.pick(), Pick::Untimed(GemmRoute::CopyRhs));
    }

    /// The kept route is known once the trials are over, not while they run
    /// nor for a product never tried.
    #[test]
    fn the_kept_route_is_known_when_the_trials_end() {
        // Shapes no other test times.
        let key = |n: usize| ((7, 513, n), (513, 1), (1, 513), 2);
        for (n, times, route) in [(5, [9.0, 1.0], GemmRoute::Direct), (6, [1.0, 9.0], GemmRoute::CopyRhs)] {
            assert!(matches!(pick(key(n), GemmRoute::CopyRhs), Pick::Timed(GemmRoute::CopyRhs, 0)));
            assert_eq!(kept(key(n)), None, "trials still run");
            for round in 0..2 * usize::from(TRIALS_PER_ROUTE) {
                record(key(n), round % 2, times[round % 2]);
            }
            assert_eq!(kept(key(n)), Some(route), "copy {} ms, direct {} ms", times[0], times[1]);
        }
        assert_eq!(kept(key(8)), None, "never tried");
    }
}
