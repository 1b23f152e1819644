//! A global allocator for memory-bound tests: it forwards every call to [`System`] and counts,
//! per thread, the live heap bytes and their peak, so tests running in parallel threads do not
//! disturb each other's figures. Its own crate so that the one `unsafe impl` is written once for
//! the server's tests and the simulator crate's tests (which forbids `unsafe` in its library).
//!
//! A test binary installs it and measures a stretch of work:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;
//!
//! let base = counting_alloc::restart_peak();
//! work();
//! let grown = counting_alloc::peak() - base;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grow(bytes: usize) {
    // `try_with`: the thread-local may already be gone while a thread tears down.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + bytes;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrink(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(bytes)));
}

/// This thread's live heap bytes (allocated through [`Counting`] and not yet freed).
pub fn live() -> usize {
    LIVE.with(Cell::get)
}

/// The highest [`live`] of this thread since its start or the last [`restart_peak`].
pub fn peak() -> usize {
    PEAK.with(Cell::get)
}

/// Starts this thread's peak again at its live heap now, and returns that figure (the base to
/// subtract from a later [`peak`]).
pub fn restart_peak() -> usize {
    let base = live();
    PEAK.with(|peak| peak.set(base));
    base
}

/// Counts live heap bytes per thread and their peak; allocation itself is the system's.
pub struct Counting;

// SAFETY: every call forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; the counters are plain
// thread-local integers that never allocate (const-initialized `Cell`s).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grow(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            shrink(layout.size());
            grow(new_size);
        }
        new
    }
}

#[cfg(test)]
#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_shows_in_live_and_peak_and_leaves_live_when_freed() {
        let base = restart_peak();
        let buffer = vec![7u8; 1 << 20];
        assert!(live() >= base + (1 << 20));
        let grown = {
            let mut v = buffer;
            v.resize(3 << 20, 0);
            v.len()
        };
        assert_eq!(grown, 3 << 20);
        assert!(peak() >= base + (3 << 20), "the realloc is counted");
        assert!(
            live() < base + (1 << 20),
            "the freed buffer left the live count"
        );
        assert!(
            restart_peak() < base + (1 << 20),
            "a restart takes the live heap"
        );
    }

    #[test]
    fn another_thread_does_not_count_here() {
        let base = restart_peak();
        std::thread::spawn(|| drop(vec![1u8; 4 << 20]))
            .join()
            .unwrap();
        assert!(peak() < base + (4 << 20));
    }
}
