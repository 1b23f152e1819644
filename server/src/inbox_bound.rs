//! The bound on what waits in a pump's inbox from the network: a count of entries and a
//! count of their bytes (decision 503). A frame-count bound alone let a shard whose pump did
//! not run hold 8,192 prepares of a megabyte each; the byte bound keeps a backlog of large
//! frames to a fixed amount of memory.

use std::cell::Cell;

/// Bytes of frames (and request bodies) one inbox holds at most. An inbox that holds nothing
/// takes any one entry, so a frame of `max_message_size` always gets in.
pub const INBOX_BYTES_MAX: usize = 256 << 20;

/// Counts what an inbox holds against its bounds.
#[derive(Debug)]
pub struct InboxBound {
    entries: Cell<usize>,
    bytes: Cell<usize>,
    entries_max: usize,
    bytes_max: usize,
}

impl InboxBound {
    /// At most `entries_max` entries and [`INBOX_BYTES_MAX`] bytes.
    pub fn new(entries_max: usize) -> InboxBound {
        InboxBound::with_bytes(entries_max, INBOX_BYTES_MAX)
    }

    /// At most `entries_max` entries and `bytes_max` bytes.
    pub fn with_bytes(entries_max: usize, bytes_max: usize) -> InboxBound {
        InboxBound {
            entries: Cell::new(0),
            bytes: Cell::new(0),
            entries_max,
            bytes_max,
        }
    }

    /// Counts an entry of `len` bytes in if it fits (fewer than `entries_max` entries, and
    /// with it at most `bytes_max` bytes unless the inbox is empty); `false` when it does not
    /// (the caller drops and counts it, or refuses it).
    pub fn admit(&self, len: usize) -> bool {
        let entries = self.entries.get();
        let bytes = self.bytes.get();
        if entries >= self.entries_max {
            return false;
        }
        if entries > 0 && bytes.saturating_add(len) > self.bytes_max {
            return false;
        }
        self.entries.set(entries + 1);
        self.bytes.set(bytes + len);
        true
    }

    /// Counts an admitted entry of `len` bytes out.
    pub fn release(&self, len: usize) {
        let entries = self.entries.get();
        let bytes = self.bytes.get();
        assert!(
            entries > 0,
            "an inbox released more entries than it admitted"
        );
        assert!(
            bytes >= len,
            "an inbox released more bytes than it admitted"
        );
        self.entries.set(entries - 1);
        self.bytes.set(bytes - len);
    }

    /// Entries held.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries.get()
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_bytes_are_both_bounded() {
        let bound = InboxBound::with_bytes(3, 100);
        assert!(bound.admit(60));
        assert!(!bound.admit(41), "60 + 41 bytes is over 100");
        assert!(bound.admit(40));
        assert_eq!((bound.entries(), bound.bytes()), (2, 100));
        assert!(bound.admit(0));
        assert!(!bound.admit(0), "a fourth entry is over 3");
        bound.release(60);
        assert!(bound.admit(60));
        assert_eq!((bound.entries(), bound.bytes()), (3, 100));
    }

    #[test]
    fn an_empty_inbox_takes_one_entry_of_any_size() {
        let bound = InboxBound::with_bytes(8, 100);
        assert!(bound.admit(1_000));
        assert!(!bound.admit(1), "nothing joins an entry over the bound");
        bound.release(1_000);
        assert_eq!((bound.entries(), bound.bytes()), (0, 0));
        assert!(bound.admit(100));
    }
}
