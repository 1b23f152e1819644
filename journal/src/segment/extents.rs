//! A read-only view of where a partition's flushed batches are: per segment its file, its
//! written length, the offset after its last batch and its sparse index. The node's read path
//! reads older polls and state-transfer offers from these files without going through the
//! storage task that owns the log (decision 280).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{IndexEntry, PartitionLog, log_name};
use crate::storage::Storage;

/// One segment as the read path sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent<'a> {
    /// Base offset (the segment's first message).
    pub base: u64,
    /// Bytes of whole batches written to its `.log` (flushed; not necessarily synced).
    pub len: u64,
    /// The offset after its last written batch.
    pub end_offset: u64,
    /// Its index entries (one per flush), in position order.
    pub index: &'a [IndexEntry],
}

/// Marks are unique in the process (0 is never one), so a log opened anew never repeats the
/// mark of another.
static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

/// A mark no log of this process had.
pub(super) fn fresh_mark() -> u64 {
    NEXT_MARK.fetch_add(1, Ordering::Relaxed)
}

impl<S: Storage> PartitionLog<S> {
    /// A value that stays the same while the written data only grows (flushes append batches
    /// and index entries) and changes when it may have changed otherwise: a fresh mark per log
    /// opened and per cut (a rewind, a boot's settle). A reader holding a copy of the extents
    /// with the same mark needs to copy only what was appended since.
    pub fn rewrite_mark(&self) -> u64 {
        self.rewrite_mark
    }

    /// The segments' written extents, oldest first (batches held for the next flush are not
    /// in them).
    pub fn extents(&self) -> impl Iterator<Item = Extent<'_>> {
        self.segments.iter().map(|s| Extent {
            base: s.base,
            len: s.len,
            end_offset: s.end_offset,
            index: &s.index,
        })
    }

    /// The `.log` file name of the segment at `base`.
    pub fn extent_name(&self, base: u64) -> String {
        log_name(&self.prefix, base)
    }
}
