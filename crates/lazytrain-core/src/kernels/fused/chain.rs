//! Row chains of fused programs (see [`crate::schedule::chain`]): several
//! programs over the same rows run a block of rows at a time, each in turn,
//! so a program reads the rows earlier ones just wrote from cache.

use super::softmax_rows::SoftmaxRows;
use super::{FusedProgram, OutView, OutViews, Source, TileWork, PARALLEL_MIN};

/// Elements of the widest program a block of rows holds: a few such
/// arrays (an input and the outputs of each program) stay in a core's L2.
const BLOCK_ELEMENTS: usize = 1 << 15;

/// One program of a chain with its inputs and output buffers.
pub(crate) struct ChainLink<'a> {
    /// The program.
    pub program: &'a FusedProgram,
    /// Its inputs; values of earlier links are [`Source::Chained`].
    pub inputs: Vec<Source<'a>>,
    /// Its outputs' buffers, sized for the program.
    pub outputs: Vec<OutView>,
}

/// Run `links` over `rows` rows: the rows split at the middle one (as a
/// column sum's canonical order has it) into two halves run on two threads
/// (or one after the other), each half a block of rows at a time through
/// every link in order. The values are those of the links run one after
/// the other, bit for bit: elementwise results do not depend on where rows
/// split, each row reduction sees its whole row on one thread, and column
/// sums add each half's rows in order in `f64`, then the two halves. A
/// softmax chain runs each half as fused rows instead of blocks of
/// interpreted programs, with the same bits (`SoftmaxRows`).
pub(crate) fn run_chain(links: &[ChainLink], rows: usize) -> Result<(), String> {
    if rows == 0 {
        return Ok(());
    }
    let mut widths = Vec::with_capacity(links.len());
    for link in links {
        let numel = link.program.numel();
        if !numel.is_multiple_of(rows) {
            return Err(format!("a chain over {rows} rows cannot run {numel} elements"));
        }
        widths.push(numel / rows);
    }
    // A softmax chain runs each half as fused rows (see `SoftmaxRows`).
    let softmax = SoftmaxRows::of(links, rows);
    let widest = widths.iter().copied().max().unwrap_or(1).max(1);
    let block = (BLOCK_ELEMENTS / widest).max(1);
    let outs: Vec<OutViews> = links.iter().map(|l| OutViews(l.outputs.clone())).collect();
    let fresh = || -> Vec<Vec<Vec<f64>>> { links.iter().map(|l| l.program.column_partials(l.outputs.len())).collect() };
    let half = |lo: usize, hi: usize, columns: &mut Vec<Vec<Vec<f64>>>| -> Result<(), String> {
        if let (Some(softmax), Some(last)) = (&softmax, columns.last_mut()) {
            // SAFETY: `SoftmaxRows::of` took the pointers from the links'
            // buffers, sized for their programs and alive for the run; the
            // two halves touch disjoint rows.
            unsafe { softmax.run_rows(lo, hi, last) };
            return Ok(());
        }
        let mut work: Vec<TileWork> = links.iter().map(|_| TileWork::default()).collect();
        let mut row = lo;
        while row < hi {
            let end = (row + block).min(hi);
            for (k, link) in links.iter().enumerate() {
                let (w, columns, work) = (widths[k], &mut columns[k], &mut work[k]);
                link.program.run_range(&link.inputs, &outs[k], (row * w, end * w), None, columns, work)?;
            }
            row = end;
        }
        Ok(())
    };
    let mid = rows / 2;
    let (mut first, mut second) = (fresh(), fresh());
    if rows * widest >= PARALLEL_MIN && rayon::current_num_threads() > 1 {
        let (a, b) = rayon::join(|| half(0, mid, &mut first), || half(mid, rows, &mut second));
        a.and(b)?;
    } else {
        half(0, mid, &mut first)?;
        half(mid, rows, &mut second)?;
    }
    for (k, link) in links.iter().enumerate() {
        // SAFETY: both halves have finished; each link's outputs are sized for its program.
        unsafe { link.program.write_column_sums(&link.outputs, &first[k], &second[k]) };
    }
    Ok(())
}
