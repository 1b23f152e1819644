//! The owner table: the one piece of mutable state shards share.
//!
//! One atomic per replica connection slot `(peer, lane)`, holding the shard that installed that
//! connection. A shard installs a connection by compare-and-swap from "no owner" to itself, so
//! two shards that accepted the same peer on the same lane cannot both install it (the second
//! closes its duplicate, as the reference closes duplicates). Nothing else is shared: groups
//! move between shards only as messages on the mesh.

use std::sync::atomic::{AtomicU32, Ordering};

const NO_OWNER: u32 = u32::MAX;

/// `(peer, lane) -> shard` slots.
#[derive(Debug)]
pub struct OwnerTable {
    peers: usize,
    lanes: usize,
    slots: Box<[AtomicU32]>,
}

impl OwnerTable {
    /// A table for `peers` replica ids and `lanes` lanes per peer, all unowned.
    pub fn new(peers: usize, lanes: usize) -> OwnerTable {
        let slots = (0..peers * lanes)
            .map(|_| AtomicU32::new(NO_OWNER))
            .collect();
        OwnerTable {
            peers,
            lanes,
            slots,
        }
    }

    fn slot(&self, peer: u8, lane: u8) -> Option<&AtomicU32> {
        let (peer, lane) = (usize::from(peer), usize::from(lane));
        (peer < self.peers && lane < self.lanes).then(|| &self.slots[peer * self.lanes + lane])
    }

    /// Installs `shard` as the owner of `(peer, lane)`. `Err(Some(owner))` if another shard (or
    /// this one) already owns it, `Err(None)` if the slot is outside the table.
    pub fn claim(&self, peer: u8, lane: u8, shard: u16) -> Result<(), Option<u16>> {
        let slot = self.slot(peer, lane).ok_or(None)?;
        slot.compare_exchange(
            NO_OWNER,
            u32::from(shard),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .map(|_| ())
        .map_err(|owner| Some(owner as u16))
    }

    /// Releases `(peer, lane)` if `shard` owns it; false otherwise (a stale release never frees
    /// another shard's connection).
    pub fn release(&self, peer: u8, lane: u8, shard: u16) -> bool {
        self.slot(peer, lane).is_some_and(|slot| {
            slot.compare_exchange(
                u32::from(shard),
                NO_OWNER,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// The shard that owns `(peer, lane)`, if any.
    pub fn owner(&self, peer: u8, lane: u8) -> Option<u16> {
        let owner = self.slot(peer, lane)?.load(Ordering::Acquire);
        (owner != NO_OWNER).then_some(owner as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn claim_release_and_bounds() {
        let table = OwnerTable::new(3, 4);
        assert_eq!(table.owner(1, 2), None);
        assert_eq!(table.claim(1, 2, 5), Ok(()));
        assert_eq!(table.owner(1, 2), Some(5));
        assert_eq!(table.claim(1, 2, 6), Err(Some(5)));
        assert!(!table.release(1, 2, 6), "only the owner releases");
        assert!(table.release(1, 2, 5));
        assert_eq!(table.owner(1, 2), None);
        assert_eq!(table.claim(3, 0, 0), Err(None));
        assert_eq!(table.claim(0, 4, 0), Err(None));
        assert!(!table.release(3, 0, 0));
        assert_eq!(table.owner(2, 3), None);
    }

    /// Shards racing for the same slots: exactly one winner per slot.
    #[test]
    fn one_winner_per_slot() {
        let table = Arc::new(OwnerTable::new(4, 16));
        let threads: Vec<_> = (0..4u16)
            .map(|shard| {
                let table = Arc::clone(&table);
                std::thread::spawn(move || {
                    let mut won = 0;
                    for peer in 0..4 {
                        for lane in 0..16 {
                            won += usize::from(table.claim(peer, lane, shard).is_ok());
                        }
                    }
                    won
                })
            })
            .collect();
        let won: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(won, 64);
        for peer in 0..4 {
            for lane in 0..16 {
                assert!(table.owner(peer, lane).is_some_and(|s| s < 4));
            }
        }
    }
}
