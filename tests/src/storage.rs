//! The simulated disk of one replica: per group, a journal (entries by op) and a superblock.
//!
//! A write is only *issued* when the replica emits its effect; it becomes durable when the
//! simulator delivers its completion (the replica then learns it through an input). A crash keeps
//! the durable state, lets an in-order prefix of the issued-but-unreported journal writes land
//! (the last one possibly torn), and forgets the rest. Disk faults (bit flips in durable entries,
//! lost entries) are injected only on replicas the fault schedule marks as faulty, a minority.
//!
//! The superblock type is generic: the simulator stores whatever the core asks to persist.

use std::collections::{BTreeMap, VecDeque};

use crate::prng::Prng;

/// Identifies one issued write until its completion is delivered.
pub type WriteId = u64;

/// A write issued by a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write<S> {
    /// Journal the frame at `op` (replacing whatever was there).
    Append {
        /// Op number.
        op: u64,
        /// The whole prepare frame.
        frame: Vec<u8>,
    },
    /// Remove every journal entry at or above `from_op`.
    Truncate {
        /// First op removed.
        from_op: u64,
    },
    /// Replace the superblock (atomic: either the old or the new copy survives a crash).
    Superblock(S),
}

/// An issued, not yet completed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending<S> {
    /// Its id.
    pub id: WriteId,
    /// Group it belongs to.
    pub group: u64,
    /// What it writes.
    pub write: Write<S>,
    /// Tick at which its completion is delivered.
    pub complete_at: u64,
    /// A later truncate removed it: it completes but writes nothing.
    pub void: bool,
    /// The device reports an error for it: nothing is written, the completion says failed.
    pub failed: bool,
}

/// Counters of the storage model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Writes issued.
    pub issued: u64,
    /// Writes completed (became durable and were reported).
    pub completed: u64,
    /// Unreported writes lost in a crash.
    pub lost_in_crash: u64,
    /// Unreported writes that landed anyway before a crash.
    pub landed_in_crash: u64,
    /// Entries torn by a crash.
    pub torn: u64,
    /// Durable entries corrupted by a fault.
    pub corrupted: u64,
}

/// One group's durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDisk<S> {
    /// Durable journal entries by op (bytes as stored, possibly torn or corrupted).
    pub journal: BTreeMap<u64, Vec<u8>>,
    /// The checksum each entry was written with (a WAL entry carries its own checksum, which
    /// also covers partition bodies that the prepare identity does not).
    pub sums: BTreeMap<u64, u64>,
    /// Durable superblock, if one was ever written.
    pub superblock: Option<S>,
}

/// The checksum a journal entry is written with.
pub fn sum(bytes: &[u8]) -> u64 {
    wire::integrity::xxh3(bytes)
}

impl<S> GroupDisk<S> {
    /// The entry at `op` if it reads back with the checksum it was written with.
    pub fn intact(&self, op: u64) -> Option<&Vec<u8>> {
        let bytes = self.journal.get(&op)?;
        (self.sums.get(&op) == Some(&sum(bytes))).then_some(bytes)
    }
}

impl<S> Default for GroupDisk<S> {
    fn default() -> Self {
        GroupDisk {
            journal: BTreeMap::new(),
            sums: BTreeMap::new(),
            superblock: None,
        }
    }
}

/// A replica's disk.
#[derive(Debug, Clone)]
pub struct Disk<S> {
    groups: BTreeMap<u64, GroupDisk<S>>,
    pending: VecDeque<Pending<S>>,
    /// Latest completion tick per group and kind (journal 0, superblock 1), to keep order.
    last_completion: BTreeMap<(u64, u8), u64>,
    next_id: WriteId,
    /// Counters.
    pub stats: DiskStats,
}

impl<S: Clone> Default for Disk<S> {
    fn default() -> Self {
        Disk {
            groups: BTreeMap::new(),
            pending: VecDeque::new(),
            last_completion: BTreeMap::new(),
            next_id: 1,
            stats: DiskStats::default(),
        }
    }
}

impl<S: Clone> Disk<S> {
    /// Issues a write that completes `latency` ticks after `now` (never before an earlier write of
    /// the same group and kind: the journal and the superblock are each written in order).
    pub fn issue(&mut self, now: u64, group: u64, write: Write<S>, latency: u64) -> WriteId {
        self.issue_with(now, group, write, latency, false)
    }

    /// [`Disk::issue`] of a write that fails (an IO error) when `failed`.
    pub fn issue_with(
        &mut self,
        now: u64,
        group: u64,
        write: Write<S>,
        latency: u64,
        failed: bool,
    ) -> WriteId {
        let kind = u8::from(matches!(write, Write::Superblock(_)));
        let last = self.last_completion.entry((group, kind)).or_insert(0);
        let complete_at = (now + latency).max(*last);
        *last = complete_at;
        let id = self.next_id;
        self.next_id += 1;
        self.stats.issued += 1;
        self.pending.push_back(Pending {
            id,
            group,
            write,
            complete_at,
            void: false,
            failed,
        });
        id
    }

    /// Completes every write due at `now`: applies it to the durable state and returns it, in
    /// issue order. The caller turns each into the replica's completion input.
    pub fn complete_due(&mut self, now: u64) -> Vec<Pending<S>> {
        let mut done = Vec::new();
        let mut keep = VecDeque::with_capacity(self.pending.len());
        for p in self.pending.drain(..) {
            if p.complete_at <= now {
                done.push(p);
            } else {
                keep.push_back(p);
            }
        }
        self.pending = keep;
        for p in &done {
            if !p.void && !p.failed {
                Self::apply(self.groups.entry(p.group).or_default(), &p.write);
            }
            self.stats.completed += 1;
        }
        done
    }

    fn apply(disk: &mut GroupDisk<S>, write: &Write<S>) {
        match write {
            Write::Append { op, frame } => {
                disk.journal.insert(*op, frame.clone());
                disk.sums.insert(*op, crate::storage::sum(frame));
            }
            Write::Truncate { from_op } => {
                disk.journal.split_off(from_op);
                disk.sums.split_off(from_op);
            }
            Write::Superblock(s) => disk.superblock = Some(s.clone()),
        }
    }

    /// The durable state of a group.
    pub fn group(&self, group: u64) -> Option<&GroupDisk<S>> {
        self.groups.get(&group)
    }

    /// Every group with durable state.
    pub fn groups(&self) -> impl Iterator<Item = (&u64, &GroupDisk<S>)> {
        self.groups.iter()
    }

    /// Issued writes not yet completed.
    pub fn pending(&self) -> impl Iterator<Item = &Pending<S>> {
        self.pending.iter()
    }

    /// A crash. Per group, an in-order prefix of the unreported journal writes may land (the
    /// disk had written them but the completion never reached the replica); when `may_tear`, the
    /// last landed append may be torn. Unreported superblock writes land or not, atomically.
    /// Everything else pending is forgotten.
    pub fn crash(&mut self, prng: &mut Prng, may_tear: bool) {
        let pending: Vec<Pending<S>> = self.pending.drain(..).collect();
        self.last_completion.clear();
        let groups: std::collections::BTreeSet<u64> = pending.iter().map(|p| p.group).collect();
        for group in groups {
            let writes: Vec<&Pending<S>> = pending.iter().filter(|p| p.group == group).collect();
            let journal: Vec<&Pending<S>> = writes
                .iter()
                .copied()
                .filter(|p| !matches!(p.write, Write::Superblock(_)))
                .collect();
            let land = prng.range_inclusive(0, journal.len() as u64) as usize;
            let disk = self.groups.entry(group).or_default();
            for (i, p) in journal.iter().enumerate() {
                if i >= land || p.void || p.failed {
                    self.stats.lost_in_crash += 1;
                    continue;
                }
                self.stats.landed_in_crash += 1;
                Self::apply(disk, &p.write);
                if i + 1 == land
                    && may_tear
                    && prng.chance_ppm(500_000)
                    && let Write::Append { op, frame } = &p.write
                {
                    // Tear at a 512-byte sector boundary, or flip a byte if the frame is
                    // shorter than two sectors (a torn header).
                    let torn = tear(prng, frame);
                    disk.journal.insert(*op, torn);
                    self.stats.torn += 1;
                }
            }
            for p in writes
                .iter()
                .filter(|p| matches!(p.write, Write::Superblock(_)))
            {
                if prng.chance_ppm(500_000) {
                    self.stats.landed_in_crash += 1;
                    Self::apply(disk, &p.write);
                } else {
                    self.stats.lost_in_crash += 1;
                }
            }
        }
    }

    /// Truncates `group`'s journal from `from_op` at once, and voids issued appends at or above
    /// it (they still complete, but write nothing): the journal executes a truncate in emission
    /// order, after the appends issued before it.
    pub fn truncate_now(&mut self, group: u64, from_op: u64) {
        if let Some(disk) = self.groups.get_mut(&group) {
            disk.journal.split_off(&from_op);
            disk.sums.split_off(&from_op);
        }
        for p in self.pending.iter_mut() {
            if p.group == group && matches!(p.write, Write::Append { op, .. } if op >= from_op) {
                p.void = true;
            }
        }
    }

    /// Drops `group`'s journal entries at or below `op` (a checkpoint superseded them).
    pub fn truncate_below(&mut self, group: u64, op: u64) {
        if let Some(disk) = self.groups.get_mut(&group) {
            // G4: the entry at the checkpoint op itself is kept.
            disk.journal = disk.journal.split_off(&op);
            disk.sums = disk.sums.split_off(&op);
        }
    }

    /// Flips one bit of a random durable journal entry of `group` that is not the last one
    /// (damage followed by a complete entry: recovery must refuse boot rather than truncate
    /// acknowledged entries, journal.md G3). Returns the op hit.
    pub fn corrupt_interior(&mut self, prng: &mut Prng, group: u64) -> Option<u64> {
        let disk = self.groups.get_mut(&group)?;
        let ops: Vec<u64> = disk.journal.keys().copied().collect();
        if ops.len() < 2 {
            return None;
        }
        let op = ops[prng.below(ops.len() as u64 - 1) as usize];
        let frame = disk.journal.get_mut(&op).expect("picked");
        let byte = prng.below(frame.len() as u64) as usize;
        frame[byte] ^= 1 << prng.below(8);
        self.stats.corrupted += 1;
        Some(op)
    }

    /// Removes a durable entry as a lying fsync would. This breaks the durability contract the
    /// protocol relies on (an acked op disappears), so schedules use it only when asked to.
    pub fn lose_entry(&mut self, prng: &mut Prng, group: u64) -> Option<u64> {
        let disk = self.groups.get_mut(&group)?;
        let ops: Vec<u64> = disk.journal.keys().copied().collect();
        if ops.is_empty() {
            return None;
        }
        let op = *prng.pick(&ops);
        disk.journal.remove(&op);
        disk.sums.remove(&op);
        self.stats.corrupted += 1;
        Some(op)
    }
}

fn tear(prng: &mut Prng, frame: &[u8]) -> Vec<u8> {
    let sectors = frame.len() / 512;
    if sectors >= 2 {
        let keep = prng.range_inclusive(1, sectors as u64 - 1) as usize * 512;
        frame[..keep].to_vec()
    } else {
        let mut torn = frame.to_vec();
        if !torn.is_empty() {
            let at = prng.below(torn.len() as u64) as usize;
            torn[at] ^= 0xFF;
        }
        torn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::Stream;

    #[test]
    fn durable_only_after_completion() {
        let mut d: Disk<u32> = Disk::default();
        d.issue(
            0,
            1,
            Write::Append {
                op: 1,
                frame: vec![1; 300],
            },
            3,
        );
        d.issue(0, 1, Write::Superblock(7), 1);
        assert!(d.group(1).is_none());
        let done = d.complete_due(1);
        assert_eq!(done.len(), 1);
        assert_eq!(d.group(1).unwrap().superblock, Some(7));
        assert!(d.group(1).unwrap().journal.is_empty());
        d.complete_due(3);
        assert_eq!(d.group(1).unwrap().journal.len(), 1);
    }

    #[test]
    fn crash_keeps_a_prefix() {
        for seed in 0..50 {
            let mut prng = Prng::new(seed, Stream::Storage);
            let mut d: Disk<u32> = Disk::default();
            for op in 1..=5 {
                d.issue(
                    0,
                    9,
                    Write::Append {
                        op,
                        frame: vec![op as u8; 256],
                    },
                    10,
                );
            }
            d.crash(&mut prng, false);
            let ops: Vec<u64> = d
                .group(9)
                .map(|g| g.journal.keys().copied().collect())
                .unwrap_or_default();
            assert_eq!(ops, (1..=ops.len() as u64).collect::<Vec<_>>());
            assert_eq!(d.pending().count(), 0);
        }
    }
}
