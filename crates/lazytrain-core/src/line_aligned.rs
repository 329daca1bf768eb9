//! A global allocator that starts every large allocation on a cache line.
//!
//! glibc's `malloc` returns blocks 16 bytes past a page boundary once they
//! are large enough to be mapped on their own, so a tensor's 64-byte rows
//! straddle two cache lines: every AVX-512 load and AMX tile row of such a
//! tensor touches two lines, and its stores read both lines for ownership.
//! Measured on an AMX Xeon, a bf16 tile product reading misaligned
//! operands ran at less than half the speed of the same product reading
//! aligned ones.
//!
//! It also keeps a few large blocks aligned past a line when they are
//! freed, for the next request of that alignment that fits in one: `gemm`
//! allocates its packing buffers (64 KiB to 16 MiB, 128-byte aligned) on
//! every call, and how often glibc then maps fresh pages for them depends
//! on the heap's layout and on which thread's arena serves the call. With
//! line-aligned tensors beside them a GPT-2 small f32 step faulted in
//! 43 038 pages (168 MB) every step; BERT-tiny's steady steps, whose
//! products run on whichever pool thread is free, faulted in a packing
//! buffer's 97 pages now and then. Kept blocks fault in nothing.
//!
//! Programs opt in, as they would for any allocator:
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOCATOR: lazytrain_core::LineAligned = lazytrain_core::LineAligned;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, with allocations of [`LineAligned::MIN_BYTES`] or
/// more aligned to 64 bytes (a cache line, an AVX-512 vector, a tile row).
///
/// A large block is a system block 64 bytes longer, the caller's part
/// starting at the first line boundary with room for a word before it,
/// where the distance back to the system block's start is kept. Blocks
/// stay plain `malloc` blocks, so `realloc` still grows them in place or
/// by remapping, `calloc`'s fresh pages stay unmapped until written, and
/// the C allocator's thresholds for keeping freed memory work as before.
/// Blocks of 64 KiB-64 MiB aligned past a line are system blocks too, up
/// to 8 of them kept when freed, the largest, for the next request of the
/// same alignment that fits.
pub struct LineAligned;

impl LineAligned {
    /// Allocations this large or larger start on a cache line.
    pub const MIN_BYTES: usize = 4096;
    const LINE: usize = 64;

    /// True when blocks of `layout` are lined up here.
    fn lined(layout: Layout) -> bool {
        layout.size() >= Self::MIN_BYTES && layout.align() <= Self::LINE
    }

    /// The system block's layout for a lined block of `size` bytes, or
    /// `None` when that is too large to be a layout (the allocation fails).
    fn system(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.checked_add(Self::LINE)?, align_of::<usize>()).ok()
    }

    /// The caller's part of the system block at `raw`, with its distance
    /// back to `raw` written before it.
    ///
    /// # Safety
    /// `raw` is a system block of [`LineAligned::system`]'s size, aligned
    /// to a word.
    unsafe fn line_up(raw: *mut u8) -> *mut u8 {
        if raw.is_null() {
            return raw;
        }
        let skip = Self::LINE - raw as usize % Self::LINE;
        let lined = raw.add(skip);
        (lined as *mut usize).sub(1).write(skip);
        lined
    }

    /// The distance from a lined block back to its system block.
    ///
    /// # Safety
    /// `lined` came from [`LineAligned::line_up`].
    unsafe fn skip(lined: *mut u8) -> usize {
        (lined as *mut usize).sub(1).read()
    }
}

/// Large blocks aligned past a line, freed and kept for the next request
/// of the same alignment that fits in one (see the module doc).
struct Kept {
    /// `(address, bytes, alignment)` of each kept block; address 0 is an
    /// empty slot.
    blocks: [(usize, usize, usize); Kept::SLOTS],
}

impl Kept {
    /// Blocks kept at most.
    const SLOTS: usize = 8;
    /// Blocks from this large up to [`Kept::MAX_BYTES`] are kept: `gemm`'s
    /// packing buffers for BERT-tiny's products are a few hundred KiB.
    const MIN_BYTES: usize = 64 << 10;
    /// Blocks larger than this go back to the system (at most 8 of them
    /// are held, 512 MiB).
    const MAX_BYTES: usize = 64 << 20;

    /// True when blocks of `layout` are kept.
    fn keeps(layout: Layout) -> bool {
        (Self::MIN_BYTES..=Self::MAX_BYTES).contains(&layout.size()) && layout.align() > LineAligned::LINE
    }

    /// The smallest kept block of `layout`'s alignment with room for its
    /// size, taken out, or null. A block handed to a smaller request is
    /// known by that request's size from then on (`free` needs no size).
    fn take(&mut self, layout: Layout) -> *mut u8 {
        let fitting = self
            .blocks
            .iter_mut()
            .filter(|(address, size, align)| *address != 0 && *align == layout.align() && *size >= layout.size())
            .min_by_key(|(_, size, _)| *size);
        match fitting {
            Some(slot) => std::mem::take(slot).0 as *mut u8,
            None => std::ptr::null_mut(),
        }
    }

    /// Keep the block at `ptr` of `layout` in an empty slot, or in place of
    /// the smallest kept block when that is smaller (so the slots come to
    /// hold the largest blocks a step asks for, one per concurrent use).
    /// Returns the block that goes back to the system, if any.
    fn keep(&mut self, ptr: *mut u8, layout: Layout) -> Option<(*mut u8, Layout)> {
        let slot = self.blocks.iter_mut().min_by_key(|(address, size, _)| (*address != 0, *size))?;
        let (address, size, align) = std::mem::replace(slot, (ptr as usize, layout.size(), layout.align()));
        if address == 0 {
            return None;
        }
        if size >= layout.size() {
            *slot = (address, size, align);
            return Some((ptr, layout));
        }
        // SAFETY: the slot held a block of this size and alignment, a layout when it was kept.
        Some((address as *mut u8, unsafe { Layout::from_size_align_unchecked(size, align) }))
    }
}

/// The kept blocks (a lock that never allocates).
static KEPT: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept { blocks: [(0, 0, 0); Kept::SLOTS] });

// SAFETY: small blocks go to `System` as asked; a large block is the part of
// a larger system block that `line_up` hands out, released and resized
// through the system block, whose start `skip` recovers; a kept block is a
// free system block of exactly the layout asked, handed out once.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match (Self::lined(layout), Self::system(layout.size())) {
            (true, Some(system)) => Self::line_up(System.alloc(system)),
            (true, None) => std::ptr::null_mut(),
            (false, _) if Kept::keeps(layout) => {
                let kept = KEPT.lock().map_or(std::ptr::null_mut(), |mut kept| kept.take(layout));
                if kept.is_null() {
                    System.alloc(layout)
                } else {
                    kept
                }
            }
            (false, _) => System.alloc(layout),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match (Self::lined(layout), Self::system(layout.size())) {
            (true, Some(system)) => Self::line_up(System.alloc_zeroed(system)),
            (true, None) => std::ptr::null_mut(),
            (false, _) => System.alloc_zeroed(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match (Self::lined(layout), Self::system(layout.size())) {
            (true, Some(system)) => System.dealloc(ptr.sub(Self::skip(ptr)), system),
            // Never allocated here: `alloc` failed for this size.
            (true, None) => {}
            (false, _) if Kept::keeps(layout) => {
                let released = match KEPT.lock() {
                    Ok(mut kept) => kept.keep(ptr, layout),
                    Err(_) => Some((ptr, layout)),
                };
                if let Some((block, layout)) = released {
                    System.dealloc(block, layout)
                }
            }
            (false, _) => System.dealloc(ptr, layout),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with the old alignment is a layout.
        let asked = Layout::from_size_align_unchecked(new_size, layout.align());
        match (Self::lined(layout), Self::lined(asked)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            (true, true) => {
                let (Some(old), Some(new)) = (Self::system(layout.size()), Self::system(new_size)) else {
                    return std::ptr::null_mut();
                };
                let skip = Self::skip(ptr);
                let raw = System.realloc(ptr.sub(skip), old, new.size());
                if raw.is_null() {
                    return raw;
                }
                // The bytes lie `skip` into the system block, which may have
                // moved to another offset from a line: move them to its
                // first line boundary before writing the distance there.
                let line = Self::LINE - raw as usize % Self::LINE;
                if line != skip {
                    std::ptr::copy(raw.add(skip), raw.add(line), layout.size().min(new_size));
                }
                Self::line_up(raw)
            }
            (true, false) | (false, true) => {
                let moved = self.alloc(asked);
                if !moved.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                moved
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fill `len` bytes at `block` with a pattern of `seed`.
    unsafe fn fill(block: *mut u8, len: usize, seed: usize) {
        for i in 0..len {
            *block.add(i) = (i * 31 + seed) as u8;
        }
    }

    /// True when the first `len` bytes at `block` hold `seed`'s pattern.
    unsafe fn holds(block: *const u8, len: usize, seed: usize) -> bool {
        (0..len).all(|i| *block.add(i) == (i * 31 + seed) as u8)
    }

    /// Large blocks start on a cache line, and keep their bytes as they
    /// grow and shrink across the threshold and among each other (so the
    /// C allocator moves them to other offsets from a line); zeroed
    /// blocks read zero.
    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_bytes() {
        let allocator = LineAligned;
        let layout = |size| Layout::from_size_align(size, 4).expect("a layout");
        // SAFETY: each block is used within its size and released with the
        // layout it was last (re)allocated with.
        unsafe {
            let mut blocks: Vec<(*mut u8, usize)> = Vec::new();
            for b in 0..8 {
                let size = 100 + 1000 * b;
                let block = allocator.alloc(layout(size));
                fill(block, size, b);
                blocks.push((block, size));
            }
            for round in 1..40 {
                for (b, (block, size)) in blocks.iter_mut().enumerate() {
                    let new_size = match (round + b) % 5 {
                        0 => 60,
                        1 => LineAligned::MIN_BYTES,
                        _ => (round * 7919 + b * 104_729) % 300_000 + 1,
                    };
                    let moved = allocator.realloc(*block, layout(*size), new_size);
                    assert!(!moved.is_null());
                    assert!(holds(moved, (*size).min(new_size), b), "block {b}: {size} -> {new_size} bytes");
                    if new_size >= LineAligned::MIN_BYTES {
                        assert!(moved.align_offset(64) == 0, "block {b} of {new_size} bytes at {moved:p}");
                    }
                    fill(moved, new_size, b);
                    (*block, *size) = (moved, new_size);
                }
            }
            for (block, size) in blocks {
                allocator.dealloc(block, layout(size));
            }
            let too_large = Layout::from_size_align(isize::MAX as usize - 8, 8).expect("a layout");
            assert!(allocator.alloc(too_large).is_null(), "a block past the address space fails");
            for size in [LineAligned::MIN_BYTES, 1 << 20, 64 << 20] {
                let block = allocator.alloc_zeroed(layout(size));
                assert!(!block.is_null() && block.align_offset(64) == 0, "{size} bytes at {block:p}");
                assert!(*block == 0 && *block.add(size / 2) == 0 && *block.add(size - 1) == 0, "zeroed");
                allocator.dealloc(block, layout(size));
            }
        }
    }

    /// A large block aligned past a line is kept when freed and handed to
    /// the next request of the same layout; other layouts get their own,
    /// and blocks past the slots go back to the system.
    #[test]
    fn large_over_aligned_blocks_are_kept_for_the_same_layout() {
        let allocator = LineAligned;
        let layout = Layout::from_size_align(3 << 20, 128).expect("a layout");
        let other = Layout::from_size_align(3 << 20, 4096).expect("a layout");
        // SAFETY: blocks are used within their size and released with their layout.
        unsafe {
            let first = allocator.alloc(layout);
            assert!(!first.is_null() && first.align_offset(128) == 0);
            first.write_bytes(7, layout.size());
            allocator.dealloc(first, layout);
            let again = allocator.alloc(layout);
            assert_eq!(again, first, "the kept block comes back");
            let elsewhere = allocator.alloc(other);
            assert!(!elsewhere.is_null() && elsewhere != first && elsewhere.align_offset(4096) == 0);
            allocator.dealloc(elsewhere, other);
            let many: Vec<*mut u8> = (0..Kept::SLOTS + 2).map(|_| allocator.alloc(layout)).collect();
            assert!(many.iter().all(|p| !p.is_null() && p.align_offset(128) == 0));
            for &block in &many {
                allocator.dealloc(block, layout);
            }
            allocator.dealloc(again, layout);
        }
    }

    /// The slots hand out the smallest kept block with room, of the same
    /// alignment; once full they keep the largest blocks, evicting the
    /// smallest, and hand back a block no larger than every kept one.
    #[test]
    fn kept_blocks_are_the_largest_and_the_smallest_fitting_one_is_taken() {
        let mut kept = Kept { blocks: [(0, 0, 0); Kept::SLOTS] };
        let layout = |size| Layout::from_size_align(size, 128).expect("a layout");
        // Fake addresses: the slots only record them.
        let block = |n: usize| (n * 4096) as *mut u8;
        for n in 1..=Kept::SLOTS {
            assert_eq!(kept.keep(block(n), layout(n << 20)), None, "slot {n} was free");
        }
        assert_eq!(kept.keep(block(20), layout(1 << 20)), Some((block(20), layout(1 << 20))), "no larger");
        assert_eq!(kept.keep(block(30), layout(30 << 20)), Some((block(1), layout(1 << 20))), "evicts 1 MiB");
        let other_alignment = Layout::from_size_align(2 << 20, 4096).expect("a layout");
        assert!(kept.take(other_alignment).is_null());
        assert_eq!(kept.take(layout((2 << 20) + 1)), block(3), "3 MiB is the smallest with room");
        assert_eq!(kept.take(layout(1000)), block(2));
        assert_eq!(kept.take(layout(30 << 20)), block(30));
        assert!(kept.take(layout(31 << 20)).is_null());
        assert_eq!(kept.keep(block(40), layout(64 << 10)), None, "a slot was freed by a take");
    }
}
