//! The core's in-memory index of the local journal: the header of every journaled op (durable
//! or with its append in flight) and, for recent ops, the whole frame. The driver's journal is
//! the durable truth; this index mirrors what the core asked it to do.

use std::collections::VecDeque;

use wire::header::PrepareHeader;

use crate::constants::JOURNAL_SPAN_MAX;
use crate::types::Frame;

/// One journaled (or appending) prepare.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The prepare header as journaled (view as it arrived).
    pub header: PrepareHeader,
    /// The whole frame while cached; `None` once evicted (read back with `Effect::Read`).
    pub frame: Option<Frame>,
    /// `Completion::Appended` arrived for this identity.
    pub durable: bool,
    /// Known to be the current view's prepare at this op (directly or through the hash chain
    /// from a verified op above). Unverified entries are never applied (decision 13).
    pub verified: bool,
}

/// The frame's whole size as its header states it, whether or not the frame is cached.
fn appending_bytes_of(entry: &Entry) -> u64 {
    if entry.durable {
        0
    } else {
        u64::from(entry.header.frame.size.get())
    }
}

fn frame_bytes(entry: &Entry) -> u64 {
    entry
        .frame
        .as_ref()
        .map_or(0, |frame| frame.bytes().len() as u64)
}

impl Entry {
    pub fn checksum(&self) -> u128 {
        self.header.frame.checksum.get()
    }
}

/// Ops `base..base + slots.len()`, holes as `None`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Journal {
    base: u64,
    /// Boxed so a hole costs one pointer (a lagging replica's index can be sparse).
    slots: VecDeque<Option<Box<Entry>>>,
    /// Bytes of the frames the entries hold. A frame enters only with `insert` and leaves only
    /// through `truncate_from`, `trim_below` and `evict_frame`, which keep this sum.
    cached_bytes: u64,
    /// Frame sizes (from the headers) of the entries whose append has not completed. An entry
    /// enters with `insert`, turns durable only through `set_durable`, and leaves only through
    /// `truncate_from` and `trim_below`, which keep this sum.
    appending_bytes: u64,
}

impl Journal {
    /// An empty journal whose first op will be `base` (snapshot op + 1).
    pub fn new(base: u64) -> Journal {
        debug_assert!(base >= 1);
        Journal {
            base,
            slots: VecDeque::new(),
            cached_bytes: 0,
            appending_bytes: 0,
        }
    }

    /// Lowest op this index can hold (ops below were compacted or trimmed).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Highest op held, or `base - 1` if empty.
    pub fn head(&self) -> u64 {
        // Trailing holes never exist: `truncate_from` and `insert` keep the last slot filled.
        self.base + self.slots.len() as u64 - 1
    }

    pub fn get(&self, op: u64) -> Option<&Entry> {
        let index = op.checked_sub(self.base)?;
        self.slots.get(usize::try_from(index).ok()?)?.as_deref()
    }

    pub fn get_mut(&mut self, op: u64) -> Option<&mut Entry> {
        let index = op.checked_sub(self.base)?;
        self.slots
            .get_mut(usize::try_from(index).ok()?)?
            .as_deref_mut()
    }

    pub fn header(&self, op: u64) -> Option<&PrepareHeader> {
        self.get(op).map(|e| &e.header)
    }

    /// Whether the journal holds `op` with exactly this identity.
    pub fn has(&self, op: u64, checksum: u128) -> bool {
        self.get(op).is_some_and(|e| e.checksum() == checksum)
    }

    /// Whether `op` fits the index without growing it beyond [`JOURNAL_SPAN_MAX`] slots.
    pub fn fits(&self, op: u64) -> bool {
        op >= self.base && op - self.base < JOURNAL_SPAN_MAX
    }

    /// Inserts an entry (op must be `>= base`, fit, and not be held).
    pub fn insert(&mut self, entry: Entry) {
        let op = entry.header.op.get();
        assert!(op >= self.base, "insert below the journal base");
        let index = usize::try_from(op - self.base).expect("op fits usize");
        while self.slots.len() <= index {
            self.slots.push_back(None);
        }
        debug_assert!(self.slots[index].is_none(), "insert over a held op");
        self.cached_bytes += frame_bytes(&entry);
        self.appending_bytes += appending_bytes_of(&entry);
        self.slots[index] = Some(Box::new(entry));
    }

    /// Removes every op `>= from_op`; trailing holes are dropped too. Returns the
    /// `(op, identity)` of removed entries whose append had not completed yet.
    pub fn truncate_from(&mut self, from_op: u64) -> Vec<(u64, u128)> {
        let keep = if from_op < self.base {
            0
        } else {
            usize::try_from(from_op - self.base).unwrap_or(usize::MAX)
        };
        let mut in_flight = Vec::new();
        while self.slots.len() > keep {
            if let Some(Some(entry)) = self.slots.pop_back() {
                self.cached_bytes -= frame_bytes(&entry);
                self.appending_bytes -= appending_bytes_of(&entry);
                if !entry.durable {
                    in_flight.push((entry.header.op.get(), entry.checksum()));
                }
            }
        }
        while matches!(self.slots.back(), Some(None)) {
            self.slots.pop_back();
        }
        in_flight
    }

    /// Forgets every op `< op` (compaction of the index; the durable journal may keep them).
    pub fn trim_below(&mut self, op: u64) {
        while self.base < op {
            match self.slots.pop_front() {
                None => {
                    self.base = op;
                    break;
                }
                Some(slot) => {
                    if let Some(entry) = slot {
                        self.cached_bytes -= frame_bytes(&entry);
                        self.appending_bytes -= appending_bytes_of(&entry);
                    }
                }
            }
            self.base += 1;
        }
    }

    /// Drops the cached frame of `op`, keeping its header (read back with `Effect::Read`).
    pub fn evict_frame(&mut self, op: u64) {
        if let Some(entry) = self.get_mut(op)
            && let Some(frame) = entry.frame.take()
        {
            self.cached_bytes -= frame.bytes().len() as u64;
        }
    }

    /// Bytes of the frames held in memory.
    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Marks `op`'s append complete. `false` (nothing changed) when it is not held or already
    /// durable.
    pub fn set_durable(&mut self, op: u64) -> bool {
        let Some(entry) = self.get_mut(op) else {
            return false;
        };
        if entry.durable {
            return false;
        }
        let bytes = appending_bytes_of(entry);
        entry.durable = true;
        self.appending_bytes -= bytes;
        true
    }

    /// Frame bytes of the held entries whose append has not completed (decision 504).
    pub fn appending_bytes(&self) -> u64 {
        self.appending_bytes
    }

    /// The highest op `h` such that every op in `from..=h` is held; `from - 1` if `from` is not.
    pub fn contiguous_from(&self, from: u64) -> u64 {
        let mut op = from;
        while self.get(op).is_some() {
            op += 1;
        }
        op - 1
    }

    /// Entries from `op` upward.
    pub fn iter_from(&self, op: u64) -> impl Iterator<Item = &Entry> {
        let skip = usize::try_from(op.saturating_sub(self.base)).unwrap_or(usize::MAX);
        self.slots.iter().skip(skip).flatten().map(|e| &**e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::header::Layout;

    fn entry(op: u64) -> Entry {
        let mut header = PrepareHeader::zeroed();
        header.op.set(op);
        header.frame.checksum.set(u128::from(op) + 100);
        Entry {
            header,
            frame: None,
            durable: true,
            verified: true,
        }
    }

    #[test]
    fn holes_truncate_and_trim() {
        let mut j = Journal::new(1);
        assert_eq!(j.head(), 0);
        j.insert(entry(1));
        j.insert(entry(3));
        assert_eq!(j.head(), 3);
        assert!(j.get(2).is_none());
        assert_eq!(j.contiguous_from(1), 1);
        j.insert(entry(2));
        assert_eq!(j.contiguous_from(1), 3);
        let _ = j.truncate_from(2);
        assert_eq!(j.head(), 1);
        j.insert(entry(4));
        let _ = j.truncate_from(4);
        assert_eq!(j.head(), 1, "trailing holes are dropped");
        j.trim_below(2);
        assert_eq!(j.base(), 2);
        assert_eq!(j.head(), 1);
        assert!(j.get(1).is_none());
        j.trim_below(10);
        assert_eq!(j.base(), 10);
    }

    /// An entry whose append has not completed, `size` bytes as its header states.
    fn appending(op: u64, size: u32) -> Entry {
        let mut e = entry(op);
        e.header.frame.size.set(size);
        e.durable = false;
        e
    }

    #[test]
    fn appending_bytes_count_incomplete_appends_on_every_path() {
        let mut j = Journal::new(1);
        j.insert(appending(1, 100));
        j.insert(appending(2, 200));
        j.insert(appending(3, 300));
        j.insert(entry(4));
        assert_eq!(j.appending_bytes(), 600);
        assert!(j.set_durable(2));
        assert!(!j.set_durable(2), "already durable");
        assert!(!j.set_durable(9), "not held");
        assert_eq!(j.appending_bytes(), 400);
        // Evicting a frame keeps the header's size: the append is still in flight.
        j.evict_frame(3);
        assert_eq!(j.appending_bytes(), 400);
        assert_eq!(j.truncate_from(3), vec![(3, 103)]);
        assert_eq!(j.appending_bytes(), 100);
        j.trim_below(2);
        assert_eq!(j.appending_bytes(), 0);
    }
}
