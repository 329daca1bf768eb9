//! The seeded train/validation split of `prepare`'s blocks, made as the
//! blocks stream by, with the whole-corpus rule's result and order.
//!
//! The rule: block `i` is held out when draw `i` of the seed's uniform
//! stream is below the fraction; when that holds out no block (or every
//! block), the block with the lowest draw (the first of equals) goes to
//! validation (the highest, the last of equals, to training), so neither
//! side is empty. Until some block has been held out and some kept, the
//! last-minute moves may still apply, so the blocks are kept back, in a
//! file beside the shards; from then on each block is written as it comes.
//! With the default fraction of 1 % that is about the first hundred blocks.

use crate::{DataError, Result};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;

/// Where placed blocks go: the shards (or, in tests, a list).
pub(crate) trait BlockSink {
    /// Write `block` to the validation split, or to the training split.
    fn write(&mut self, block: &[u32], validation: bool) -> Result<()>;
}

/// Places the training blocks of one preparation.
pub(crate) struct Splitter {
    fraction: f64,
    seed: u64,
    /// Blocks seen.
    next: u64,
    /// The blocks with the lowest draw (the first of equals) and the
    /// highest (the last of equals) so far: `(index, draw)`.
    lowest: Option<(u64, f32)>,
    highest: Option<(u64, f32)>,
    /// Whether some block was held out (kept for training) by its draw.
    any_held_out: bool,
    any_trained: bool,
    /// The blocks kept back, from the first: until both of the above hold.
    kept_back: Option<KeptBack>,
    /// Where the kept-back blocks are written.
    kept_back_file: PathBuf,
}

impl Splitter {
    /// Hold out `fraction` of the blocks by `seed`; kept-back blocks go to
    /// `kept_back_file` (in the preparation's partial folder).
    pub(crate) fn new(fraction: f64, seed: u64, kept_back_file: PathBuf) -> Splitter {
        Splitter {
            fraction,
            seed,
            next: 0,
            lowest: None,
            highest: None,
            any_held_out: false,
            any_trained: false,
            kept_back: None,
            kept_back_file,
        }
    }

    /// Whether `draw` holds its block out.
    fn holds_out(&self, draw: f32) -> bool {
        (draw as f64) < self.fraction
    }

    /// Draw `index` of the split's stream.
    fn draw(&self, index: u64) -> f32 {
        let mut draw = [0f32];
        lazytrain_core::random::uniform_f32_from(self.seed, 0x5eed, index as usize, &mut draw);
        draw[0]
    }

    /// Place the next training block: written now, or kept back until the
    /// split can place it.
    pub(crate) fn place(&mut self, block: &[u32], shards: &mut dyn BlockSink) -> Result<()> {
        if self.fraction <= 0.0 {
            return shards.write(block, false);
        }
        let index = self.next;
        self.next += 1;
        let draw = self.draw(index);
        match self.holds_out(draw) {
            true => self.any_held_out = true,
            false => self.any_trained = true,
        }
        if self.lowest.is_none_or(|(_, low)| draw < low) {
            self.lowest = Some((index, draw));
        }
        if self.highest.is_none_or(|(_, high)| draw >= high) {
            self.highest = Some((index, draw));
        }
        let settled = self.any_held_out && self.any_trained;
        if settled && self.kept_back.is_none() {
            return shards.write(block, self.holds_out(draw));
        }
        if self.kept_back.is_none() {
            self.kept_back = Some(KeptBack::create(self.kept_back_file.clone())?);
        }
        self.kept_back.as_mut().expect("just created").push(block)?;
        if settled {
            self.write_kept_back(shards)?;
        }
        Ok(())
    }

    /// Place the blocks still kept back, now that all `blocks` training
    /// blocks are known.
    pub(crate) fn finish(&mut self, blocks: u64, shards: &mut dyn BlockSink) -> Result<()> {
        if self.fraction <= 0.0 {
            return Ok(());
        }
        if blocks < 2 {
            return Err(DataError::Invalid(format!(
                "the input packs into {blocks} block(s), too few to hold out validation data; add text, lower \
                 --block-size, or pass --validation-fraction 0"
            )));
        }
        self.write_kept_back(shards)
    }

    /// Write the kept-back blocks in order, each where the rule puts it as
    /// far as the blocks seen so far tell.
    fn write_kept_back(&mut self, shards: &mut dyn BlockSink) -> Result<()> {
        let Some(kept_back) = self.kept_back.take() else { return Ok(()) };
        let lowest = self.lowest.map(|(i, _)| i);
        let highest = self.highest.map(|(i, _)| i);
        kept_back.drain(|index, block| {
            let validation = match self.holds_out(self.draw(index)) {
                false => Some(index) == lowest && !self.any_held_out,
                true => Some(index) != highest || self.any_trained,
            };
            shards.write(block, validation)
        })
    }
}

/// Blocks kept back, in order from the first block, in a file of
/// little-endian `u32` tokens (all blocks have one length).
struct KeptBack {
    path: PathBuf,
    file: BufWriter<std::fs::File>,
    blocks: u64,
    block_len: usize,
}

impl KeptBack {
    fn create(path: PathBuf) -> Result<KeptBack> {
        let file = std::fs::File::create(&path).map_err(|e| io(&path, e))?;
        Ok(KeptBack { path, file: BufWriter::new(file), blocks: 0, block_len: 0 })
    }

    fn push(&mut self, block: &[u32]) -> Result<()> {
        self.block_len = block.len();
        let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.file.write_all(&bytes).map_err(|e| io(&self.path, e))?;
        self.blocks += 1;
        Ok(())
    }

    /// Hand each block, with its index, to `each`, in order; the file is
    /// removed.
    fn drain(self, mut each: impl FnMut(u64, &[u32]) -> Result<()>) -> Result<()> {
        let KeptBack { path, file, blocks, block_len } = self;
        drop(file.into_inner().map_err(|e| io(&path, e.into_error()))?);
        let mut reader = BufReader::new(std::fs::File::open(&path).map_err(|e| io(&path, e))?);
        let mut bytes = vec![0u8; block_len * 4];
        let mut block = vec![0u32; block_len];
        for index in 0..blocks {
            reader.read_exact(&mut bytes).map_err(|e| io(&path, e))?;
            for (token, raw) in block.iter_mut().zip(bytes.chunks_exact(4)) {
                *token = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            }
            each(index, &block)?;
        }
        drop(reader);
        std::fs::remove_file(&path).map_err(|e| io(&path, e))
    }
}

/// An error of the kept-back file at `path`.
fn io(path: &std::path::Path, e: std::io::Error) -> DataError {
    crate::formats::io_error(path, format!("cannot keep blocks back for the split: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocks written, in order, with their split.
    #[derive(Default)]
    struct Recorded(Vec<(Vec<u32>, bool)>);

    impl BlockSink for Recorded {
        fn write(&mut self, block: &[u32], validation: bool) -> Result<()> {
            self.0.push((block.to_vec(), validation));
            Ok(())
        }
    }

    /// The split of `blocks` blocks the whole-corpus rule makes: every draw
    /// at once, the lowest (highest) flipped when no block (every block)
    /// is held out.
    fn whole_corpus_split(blocks: usize, fraction: f64, seed: u64) -> Vec<bool> {
        let mut draws = vec![0f32; blocks];
        lazytrain_core::random::uniform_f32(seed, 0x5eed, &mut draws);
        let mut held_out: Vec<bool> = draws.iter().map(|&u| (u as f64) < fraction).collect();
        let by_draw = |a: &(usize, &f32), b: &(usize, &f32)| a.1.total_cmp(b.1);
        if !held_out.contains(&true) {
            held_out[draws.iter().enumerate().min_by(by_draw).unwrap().0] = true;
        }
        if !held_out.contains(&false) {
            held_out[draws.iter().enumerate().max_by(by_draw).unwrap().0] = false;
        }
        held_out
    }

    #[test]
    fn the_streamed_split_writes_what_the_whole_corpus_rule_does_in_order() {
        let dir = lazytrain_core::ScratchDir::new("block-split").unwrap();
        for (blocks, fraction, seed) in
            [(2, 0.01, 0), (2, 0.99, 1), (3, 0.5, 7), (50, 0.01, 42), (500, 0.1, 3), (97, 0.999, 5), (40, 1e-9, 9)]
        {
            let expected = whole_corpus_split(blocks, fraction, seed);
            let mut shards = Recorded::default();
            let mut splitter = Splitter::new(fraction, seed, dir.join("kept-back"));
            // Each block is its index, so the writes say which block went where.
            for i in 0..blocks {
                splitter.place(&[i as u32, 7], &mut shards).unwrap();
            }
            splitter.finish(blocks as u64, &mut shards).unwrap();
            let written = shards.0;
            let in_order: Vec<u32> = written.iter().map(|(block, _)| block[0]).collect();
            assert_eq!(in_order, (0..blocks as u32).collect::<Vec<_>>(), "blocks are written in order");
            let got: Vec<bool> = written.iter().map(|&(_, validation)| validation).collect();
            assert_eq!(got, expected, "{blocks} blocks, fraction {fraction}, seed {seed}");
            assert!(!dir.join("kept-back").exists(), "the kept-back file is removed");
        }
        let mut one = Splitter::new(0.5, 0, dir.join("kept-back"));
        let mut shards = Recorded::default();
        one.place(&[0, 7], &mut shards).unwrap();
        assert!(one.finish(1, &mut shards).unwrap_err().to_string().contains("1 block(s), too few"));
    }
}
