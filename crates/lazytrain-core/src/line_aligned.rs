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
//! freed, for later requests of that alignment: `gemm` allocates its
//! packing buffers (64 KiB to 16 MiB, 128-byte aligned) on every call, and
//! how often glibc then maps fresh pages for them depends on the heap's
//! layout and on which thread's arena serves the call. With line-aligned
//! tensors beside them a GPT-2 small f32 step faulted in 43 038 pages (168
//! MB) every step; kept blocks of 1-64 MiB, each reused for its own size,
//! fault in nothing. BERT-tiny's steady steps, whose products run on
//! whichever pool thread is free, still faulted in a 388 KB packing buffer
//! now and then (97 pages); blocks of 64 KiB-1 MiB are kept too, each
//! reused for requests down to half its size. (Reusing the large blocks for
//! smaller requests as well made BERT-mini's and BERT-base's steps fault in
//! 850 and 1 360 pages: the 16 MiB block lent to a smaller request left the
//! next 16 MiB request to map a fresh one.)
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
/// to 8 of each [`Class`] kept when freed for later requests.
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

/// Large blocks aligned past a line, freed and kept for later requests of
/// their alignment (see the module doc): a slot array per [`Class`].
struct Kept {
    /// `(address, bytes, alignment)` of each kept block; address 0 is an
    /// empty slot.
    blocks: [(usize, usize, usize); Kept::SLOTS],
}

/// Which blocks aligned past a line are kept, and how they are reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// 64 KiB up to 1 MiB (`gemm`'s packing buffers for BERT-tiny's
    /// products are a few hundred KiB): a kept block serves requests down
    /// to half its size, the smallest that fits first, and once the slots
    /// are full a freed block takes the place of a smaller one, so the
    /// slots come to hold the largest blocks a step asks for.
    Small,
    /// 1 to 64 MiB: a kept block serves requests of its own size only (a
    /// 16 MiB block lent to a 2 MiB request would leave the next 16 MiB
    /// request to map a fresh one), and a freed block is kept while a slot
    /// is free. At most 8 of them are held, 512 MiB.
    Large,
}

impl Class {
    /// The class of blocks of `layout`, if they are kept.
    fn of(layout: Layout) -> Option<Class> {
        if layout.align() <= LineAligned::LINE {
            return None;
        }
        match layout.size() {
            size if size < 64 << 10 => None,
            size if size < 1 << 20 => Some(Class::Small),
            size if size <= 64 << 20 => Some(Class::Large),
            _ => None,
        }
    }

    /// The kept blocks of this class (a lock that never allocates).
    fn kept(self) -> &'static std::sync::Mutex<Kept> {
        static SMALL: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept::EMPTY);
        static LARGE: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept::EMPTY);
        match self {
            Class::Small => &SMALL,
            Class::Large => &LARGE,
        }
    }

    /// A kept block for `layout`, taken out, or null.
    fn take(self, layout: Layout) -> *mut u8 {
        let most = match self {
            Class::Small => 2 * layout.size(),
            Class::Large => layout.size(),
        };
        self.kept().lock().map_or(std::ptr::null_mut(), |mut kept| kept.take(layout, most))
    }

    /// Keep the freed block at `ptr` of `layout`; returns the block that
    /// goes back to the system instead, if any.
    fn keep(self, ptr: *mut u8, layout: Layout) -> Option<(*mut u8, Layout)> {
        match self.kept().lock() {
            Ok(mut kept) => kept.keep(ptr, layout, self == Class::Small),
            Err(_) => Some((ptr, layout)),
        }
    }
}

impl Kept {
    /// Blocks kept at most per class.
    const SLOTS: usize = 8;
    /// No block kept.
    const EMPTY: Kept = Kept { blocks: [(0, 0, 0); Kept::SLOTS] };

    /// The smallest kept block of `layout`'s alignment with room for its
    /// size and at most `most` bytes, taken out, or null. A block handed to
    /// a smaller request is known by that request's size from then on
    /// (`free` needs no size).
    fn take(&mut self, layout: Layout, most: usize) -> *mut u8 {
        let fits = |size: usize| (layout.size()..=most).contains(&size);
        let fitting = self
            .blocks
            .iter_mut()
            .filter(|(address, size, align)| *address != 0 && *align == layout.align() && fits(*size))
            .min_by_key(|(_, size, _)| *size);
        match fitting {
            Some(slot) => std::mem::take(slot).0 as *mut u8,
            None => std::ptr::null_mut(),
        }
    }

    /// Keep the block at `ptr` of `layout` in an empty slot, or, when
    /// `evicts`, in place of the smallest kept block if that is smaller.
    /// Returns the block that goes back to the system, if any.
    fn keep(&mut self, ptr: *mut u8, layout: Layout, evicts: bool) -> Option<(*mut u8, Layout)> {
        let slot = self.blocks.iter_mut().min_by_key(|(address, size, _)| (*address != 0, *size))?;
        let (address, size, align) = *slot;
        if address != 0 && (!evicts || size >= layout.size()) {
            return Some((ptr, layout));
        }
        *slot = (ptr as usize, layout.size(), layout.align());
        // SAFETY: the slot held a block of this size and alignment, a layout when it was kept.
        (address != 0).then(|| (address as *mut u8, unsafe { Layout::from_size_align_unchecked(size, align) }))
    }
}

// SAFETY: small blocks go to `System` as asked; a large block is the part of
// a larger system block that `line_up` hands out, released and resized
// through the system block, whose start `skip` recovers; a kept block is a
// free system block of the alignment asked and at least the size asked,
// handed out once (the system frees a block whatever size it is told).
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match (Self::lined(layout), Self::system(layout.size())) {
            (true, Some(system)) => Self::line_up(System.alloc(system)),
            (true, None) => std::ptr::null_mut(),
            (false, _) => match Class::of(layout).map(|class| class.take(layout)) {
                Some(kept) if !kept.is_null() => kept,
                _ => System.alloc(layout),
            },
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
            (false, _) => {
                let released = match Class::of(layout) {
                    Some(class) => class.keep(ptr, layout),
                    None => Some((ptr, layout)),
                };
                if let Some((block, layout)) = released {
                    System.dealloc(block, layout)
                }
            }
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

    /// Small blocks: the slots hand out the smallest kept block with room,
    /// of the same alignment, at most twice the size asked; once full they
    /// keep the largest blocks, evicting the smallest. Large blocks: only
    /// the size asked, and a full set of slots keeps what it holds.
    #[test]
    fn kept_blocks_serve_requests_by_class() {
        let layout = |size| Layout::from_size_align(size, 128).expect("a layout");
        // Fake addresses: the slots only record them.
        let block = |n: usize| (n * 4096) as *mut u8;
        let kib = |n: usize| n << 10;
        assert_eq!(Class::of(layout(kib(64))), Some(Class::Small));
        assert_eq!(Class::of(layout(1 << 20)), Some(Class::Large));
        assert_eq!(Class::of(layout(kib(63))), None);
        assert_eq!(Class::of(layout((64 << 20) + 1)), None);
        assert_eq!(Class::of(Layout::from_size_align(1 << 20, 64).expect("a layout")), None, "lined up instead");

        let mut small = Kept::EMPTY;
        for n in 1..=Kept::SLOTS {
            assert_eq!(small.keep(block(n), layout(kib(64 * n)), true), None, "slot {n} was free");
        }
        assert_eq!(small.keep(block(20), layout(kib(64)), true), Some((block(20), layout(kib(64)))), "no larger");
        assert_eq!(small.keep(block(30), layout(kib(900)), true), Some((block(1), layout(kib(64)))), "evicts 64 KiB");
        let other_alignment = Layout::from_size_align(kib(128), 4096).expect("a layout");
        assert!(small.take(other_alignment, kib(256)).is_null());
        assert_eq!(small.take(layout(kib(129)), kib(258)), block(3), "192 KiB is the smallest with room");
        assert!(small.take(layout(kib(100)), kib(100)).is_null(), "128 KiB is more than asked");
        assert_eq!(small.take(layout(kib(100)), kib(200)), block(2));
        assert_eq!(small.take(layout(kib(800)), kib(1600)), block(30));
        assert_eq!(small.keep(block(40), layout(kib(64)), true), None, "a slot was freed by a take");

        let mut large = Kept::EMPTY;
        for n in 1..=Kept::SLOTS {
            assert_eq!(large.keep(block(n), layout(n << 20), false), None);
        }
        assert_eq!(large.keep(block(30), layout(30 << 20), false), Some((block(30), layout(30 << 20))), "full");
        assert!(large.take(layout((2 << 20) + 1), (2 << 20) + 1).is_null(), "only blocks of the size asked");
        assert_eq!(large.take(layout(3 << 20), 3 << 20), block(3));
    }
}
