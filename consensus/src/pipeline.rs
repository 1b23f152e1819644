//! The primary's pipeline (§5.1-§5.7): in-flight prepares with their acks. Parked requests
//! live in the replica's request queue.

use std::collections::VecDeque;

use wire::header::PrepareHeader;

/// One in-flight prepare.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub header: PrepareHeader,
    /// Bit `r` set: replica `r` acked (durably holds) this prepare.
    pub acks: u32,
    /// Reached `Q_rep` acks.
    pub quorum: bool,
}

impl Prepared {
    pub fn op(&self) -> u64 {
        self.header.op.get()
    }
    pub fn checksum(&self) -> u128 {
        self.header.frame.checksum.get()
    }
}

/// Consecutive in-flight prepares, each chained to the previous one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pipeline {
    entries: VecDeque<Prepared>,
}

impl Pipeline {
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn clear(&mut self) {
        self.entries.clear();
    }
    pub fn head(&self) -> Option<&Prepared> {
        self.entries.front()
    }
    #[cfg(any(debug_assertions, feature = "invariants"))]
    pub fn tail(&self) -> Option<&Prepared> {
        self.entries.back()
    }
    pub fn iter(&self) -> impl Iterator<Item = &Prepared> {
        self.entries.iter()
    }

    /// Pushes the next prepare; asserts the chain (a bug otherwise, §5.10).
    pub fn push(&mut self, header: PrepareHeader) {
        if let Some(tail) = self.entries.back() {
            assert_eq!(
                header.op.get(),
                tail.op() + 1,
                "pipeline ops are consecutive"
            );
            assert_eq!(
                header.parent.get(),
                tail.checksum(),
                "pipeline entries chain"
            );
        }
        self.entries.push_back(Prepared {
            header,
            acks: 0,
            quorum: false,
        });
    }

    pub fn pop_head(&mut self) -> Option<Prepared> {
        self.entries.pop_front()
    }

    pub fn get_mut(&mut self, op: u64) -> Option<&mut Prepared> {
        let first = self.entries.front()?.op();
        let index = usize::try_from(op.checked_sub(first)?).ok()?;
        self.entries.get_mut(index)
    }

    pub fn get(&self, op: u64) -> Option<&Prepared> {
        let first = self.entries.front()?.op();
        let index = usize::try_from(op.checked_sub(first)?).ok()?;
        self.entries.get(index)
    }

    /// Invariant sweep: consecutive ops and chained parents.
    #[cfg(any(debug_assertions, feature = "invariants"))]
    pub fn verify(&self) {
        for pair in self.entries.iter().collect::<Vec<_>>().windows(2) {
            assert_eq!(pair[1].op(), pair[0].op() + 1);
            assert_eq!(pair[1].header.parent.get(), pair[0].checksum());
        }
    }
}
