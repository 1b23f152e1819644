//! Journal repair (§10): RequestPrepares / RepairPrepare / RepairDone / RangeEvicted.
//!
//! Requester: one session per group. Every repaired body is verified before it is journaled:
//! against the view's headers, through the hash chain from the verified op above (holes are
//! requested top-down, a chunk at a time, and buffered until their successor is known), or as
//! the next op on top of the head (a same-view late joiner). Server: serves journaled prepares
//! up to `repair_chunk_max` and about [`REPAIR_WINDOW_BYTES_MAX`] per request (decision 517),
//! reading evicted bodies back through the journal.

use std::collections::BTreeMap;

use wire::Command;
use wire::header::{
    FrameHeader, Layout, PrepareHeader, RepairRangeReplyHeader, RequestPreparesHeader,
};

use crate::constants::{PREPARE_SIZE_ROUND, REPAIR_WINDOW_BYTES_MAX};
use crate::frames;
use crate::ignored::Ignored;
use crate::io::{Effect, Outbox};
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{Frame, Now, Plane, ReplicaId, Status};

/// Repair state of one group: the requester's session and the server's pending reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Repair {
    pub session: Option<RepairSession>,
    /// Repaired frames that cannot be verified yet (their successor is not journaled).
    pub pending: BTreeMap<u64, Frame>,
    /// Server side: chunks waiting for journal reads of evicted bodies.
    pub serves: Vec<Serve>,
    /// Server side: reads in flight, by op (each op read once).
    pub reads: BTreeMap<u64, u128>,
}

/// A served chunk waiting for reads: frames `from..from + frames.len()`.
#[derive(Debug, Clone)]
pub(crate) struct Serve {
    pub peer: ReplicaId,
    pub nonce: u128,
    pub from: u64,
    pub frames: Vec<Option<Frame>>,
}

/// The largest prepare among the newest ops seen (decision 517): ops fall in rounds of
/// [`PREPARE_SIZE_ROUND`] by number, and the estimate is the largest size seen in the newest
/// round and the one before it. Kept by op, not by arrival, so a prepare seen twice (taken in,
/// then journaled) counts once; ops older than both rounds (a rewind, a hole filled below)
/// change nothing. Constant space and time, the same on every run of the same inputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecentMax {
    round: u64,
    current: u32,
    previous: u32,
}

impl RecentMax {
    pub(crate) fn observe(&mut self, op: u64, size: u32) {
        let round = op / u64::from(PREPARE_SIZE_ROUND);
        if round > self.round {
            self.previous = if round == self.round + 1 {
                self.current
            } else {
                0
            };
            self.current = 0;
            self.round = round;
        }
        if round == self.round {
            self.current = self.current.max(size);
        } else if round + 1 == self.round {
            self.previous = self.previous.max(size);
        }
    }

    pub(crate) fn get(&self) -> u32 {
        self.current.max(self.previous)
    }
}

/// Concurrent chunks a server keeps waiting for reads; more requests are dropped (the
/// requester's retry timer asks again).
const SERVES_MAX: usize = 8;

#[derive(Debug, Clone)]
pub(crate) struct RepairSession {
    pub nonce: u128,
    pub peer: ReplicaId,
    /// The window last requested.
    pub from_op: u64,
    pub to_op: u64,
    /// Progress marker: ops journaled by this session.
    pub progress: u64,
    /// `progress` when the last request left.
    pub progress_at_request: u64,
    pub idle_ticks: u64,
}

impl<S: StateMachine> Replica<S> {
    /// The highest op this replica must hold: its head, the commit point, or a decided log.
    fn repair_target(&self) -> u64 {
        let decided = self.vc.decided.as_ref().map_or(0, |m| m.op_head);
        self.op.max(self.commit_max).max(decided)
    }

    /// The next window to ask for, or `None` when nothing is missing.
    fn repair_window(&self) -> Option<(u64, u64)> {
        let chunk = self.repair_window_ops();
        // Nothing above the journal's room is asked for (decision 34): the replica commits and
        // checkpoints what it can hold first, and asks again once `Checkpointed` made room.
        let room = self.journal_op_max();
        if room <= self.commit_min {
            // A transfer installed above the room: its checkpoint must land first.
            return None;
        }
        let head = self
            .op
            .max(self.vc.decided.as_ref().map_or(0, |m| m.op_head))
            .min(room);
        // Holes at or below the head: the highest one first (top-down verification).
        let missing =
            |op: u64| self.journal.get(op).is_none() && !self.repair.pending.contains_key(&op);
        if head.saturating_sub(self.commit_min) > crate::constants::SCAN_MAX {
            // Far behind: ask from the bottom; the server answers RangeEvicted when it no
            // longer holds those ops, which starts a state transfer.
            let from = self.commit_min + 1;
            return Some((from, head.min(from + chunk - 1)));
        }
        let mut op = head;
        while op > self.commit_min {
            if missing(op) {
                // The run of holes ending at `op`, at most one chunk long.
                let floor = op.saturating_sub(chunk - 1).max(self.commit_min + 1);
                let mut from = op;
                while from > floor && missing(from - 1) {
                    from -= 1;
                }
                return Some((from, op));
            }
            op -= 1;
        }
        let target = self.repair_target().min(room);
        if target > head {
            return Some((head + 1, target.min(head + chunk)));
        }
        None
    }

    /// Ops per repair window: `repair_chunk_max`, or fewer when the largest of the prepares
    /// this replica saw last says a whole chunk would bring more than
    /// [`REPAIR_WINDOW_BYTES_MAX`] (decisions 506 and 517), or more than the driver's room
    /// for it (decision 518). At least one. An estimate: the server ends a chunk at the
    /// window's bytes by the frames' real sizes.
    pub(crate) fn repair_window_ops(&self) -> u64 {
        let largest = u64::from(self.prepare_size_recent.get()).max(wire::HEADER_SIZE as u64);
        let bytes = REPAIR_WINDOW_BYTES_MAX.min(self.storage_room);
        (bytes / largest).clamp(1, u64::from(self.config.repair_chunk_max))
    }

    /// Opens (or re-targets) the repair session toward `peer` and asks for the next window.
    pub(crate) fn start_repair(&mut self, peer: ReplicaId, out: &mut Outbox) {
        if peer == self.id || self.transfer.is_active() {
            return;
        }
        if self.repair.session.is_none() {
            let nonce = self.prng.nonce();
            self.repair.session = Some(RepairSession {
                nonce,
                peer,
                from_op: 0,
                to_op: 0,
                progress: 0,
                progress_at_request: 0,
                idle_ticks: 0,
            });
            self.timers.repair.start(self.config.repair_retry_ticks);
        } else {
            // A session is open: its RepairDone or retry timer asks for the next window; asking
            // again here on every trigger would ping-pong with the server.
            return;
        }
        self.request_prepares(out);
    }

    fn request_prepares(&mut self, out: &mut Outbox) {
        let Some((from_op, to_op)) = self.repair_window() else {
            self.repair.session = None;
            self.repair.pending.clear();
            self.timers.repair.stop();
            return;
        };
        if self.is_appending_behind() {
            // Repaired prepares would only add to a backlog the disk cannot keep up with
            // (decision 504): the session stays open and its retry timer asks again.
            return;
        }
        let Some(session) = self.repair.session.as_mut() else {
            return;
        };
        session.from_op = from_op;
        session.to_op = to_op;
        session.progress_at_request = session.progress;
        session.idle_ticks = 0;
        let (nonce, peer) = (session.nonce, session.peer);
        let mut h = RequestPreparesHeader::zeroed();
        h.frame = FrameHeader::new(Command::RequestPrepares, self.sender());
        h.nonce.set(nonce);
        h.from_op.set(from_op);
        h.to_op.set(to_op);
        h.group.set(self.group.0);
        let frame = frames::finish(h, &[]);
        self.send(out, peer, frame);
    }

    /// Called after local progress (commit walk): note it for the stall detector.
    pub(crate) fn repair_progress(&mut self) {
        if let Some(session) = self.repair.session.as_mut() {
            session.progress += 1;
        }
    }

    pub(crate) fn on_repair_timeout(&mut self, out: &mut Outbox) {
        let Some(session) = self.repair.session.as_ref() else {
            return;
        };
        self.timers.repair.start(self.config.repair_retry_ticks);
        let mut peer = session.peer;
        // Stalled: re-request the remaining window, from the current primary when Normal.
        if self.status == Status::Normal && !self.is_primary() {
            peer = self.primary_index(self.view);
        } else if self.status == Status::ViewChange
            && let Some(p) = self
                .repair_window()
                .and_then(|(_, to)| self.repair_source_for(to))
        {
            peer = p;
        }
        if let Some(session) = self.repair.session.as_mut() {
            session.peer = peer;
        }
        self.request_prepares(out);
    }

    fn repair_source_for(&self, op: u64) -> Option<ReplicaId> {
        let merged = self.vc.decided.as_ref()?;
        let mask = merged.sources.get(&op).copied().unwrap_or(0);
        let peers: Vec<u8> = (0..self.n as u8)
            .filter(|r| *r != self.id.0 && (mask == 0 || mask & (1 << r) != 0))
            .collect();
        if peers.is_empty() {
            return None;
        }
        let pick = self.prng.clone().up_to(peers.len() as u64 - 1) as usize;
        Some(ReplicaId(peers[pick]))
    }

    // ---- requester: ingest (§10.4) ----------------------------------------------------------

    pub(crate) fn on_repair_prepare(
        &mut self,
        now: Now,
        from: ReplicaId,
        header: &PrepareHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if self.repair.session.is_none() {
            return Err(Ignored::Nonce);
        }
        if self.transfer.is_active() || self.status == Status::Recovering {
            return Err(Ignored::Status);
        }
        let op = header.op.get();
        if op <= self.commit_min || op > self.repair_target() {
            return Err(Ignored::Scope);
        }
        if op > self.journal_op_max() {
            // Not even buffered: it could only be journaled after a checkpoint, and the
            // window is asked for again then (decision 34).
            return Err(Ignored::JournalFull);
        }
        let operation = wire::Operation::from_byte(header.operation).ok_or(Ignored::Malformed)?;
        let in_plane = match self.plane() {
            Plane::Metadata => operation.is_metadata_plane(),
            Plane::Partition => operation.is_partition(),
        };
        if !in_plane {
            return Err(Ignored::Plane);
        }
        if let Some(held) = self.journal.get(op) {
            let checksum = header.frame.checksum.get();
            if held.verified || self.expected_checksum(op) != Some(checksum) {
                return Err(Ignored::Duplicate);
            }
            if held.checksum() == checksum {
                // Our unverified entry is the view's: verify it and what chains below it.
                self.journal.get_mut(op).expect("held").verified = true;
                self.verify_below_op(op, out);
                return Ok(());
            }
            // Proven stale: cut it (and the unverified run it belongs to), then journal.
            self.cut_stale_run(op, out);
        }
        self.check_stamp(header, body, false)?;
        let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
        bytes.extend_from_slice(header.bytes());
        bytes.extend_from_slice(body);
        bytes[60] = Command::Prepare.byte();
        let frame = Frame::new(bytes);
        let checksum = header.frame.checksum.get();
        let verified = match self.expected_checksum(op) {
            Some(expected) => expected == checksum,
            None => {
                let anchored = header.parent.get() == self.last_checksum
                    || (self.transfer.anchor_unknown
                        && self.status == Status::Normal
                        && from == self.primary_index(self.view)
                        && self.repair.session.as_ref().is_some_and(|s| s.peer == from));
                op == self.op + 1 && anchored && self.vc.decided.is_none()
            }
        };
        if !verified {
            if self.expected_checksum(op).is_some() {
                return Err(Ignored::Diverged);
            }
            // Not verifiable yet: keep it (bounded) until its successor is journaled.
            if self.repair.pending.len() >= 2 * self.config.repair_chunk_max as usize {
                return Err(Ignored::QueueFull);
            }
            self.repair.pending.insert(op, frame);
            return Ok(());
        }
        self.journal_repaired(now, frame, out);
        Ok(())
    }

    /// Journals a verified repaired frame, then cascades through buffered frames that the new
    /// entry verifies (downward by `parent`, upward along the head).
    fn journal_repaired(&mut self, now: Now, frame: Frame, out: &mut Outbox) {
        let mut next = Some(frame);
        while let Some(frame) = next.take() {
            let header = *frame.prepare_header().expect("a prepare");
            let op = header.op.get();
            if !self.journal_prepare(now, frame, out) {
                break;
            }
            self.repair_progress();
            if let Some(below) = self.repair.pending.remove(&(op - 1)) {
                let ok = below
                    .prepare_header()
                    .is_some_and(|h| h.frame.checksum.get() == header.parent.get());
                if ok && op - 1 > self.commit_min && self.journal.get(op - 1).is_none() {
                    next = Some(below);
                    continue;
                }
            }
            if let Some(above) = self.repair.pending.remove(&(self.op + 1)) {
                let ok = above
                    .prepare_header()
                    .is_some_and(|h| h.parent.get() == self.last_checksum);
                if ok && self.vc.decided.is_none() {
                    next = Some(above);
                }
            }
        }
        self.repair.pending.retain(|op, _| *op > self.commit_min);
    }

    pub(crate) fn on_repair_done(
        &mut self,
        now: Now,
        header: &RepairRangeReplyHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let Some(session) = self.repair.session.as_ref() else {
            return Err(Ignored::Nonce);
        };
        if session.nonce != header.nonce.get() {
            return Err(Ignored::Nonce);
        }
        let progressed = session.progress > session.progress_at_request;
        if self.status == Status::Normal {
            self.commit_journal(now, out);
        } else if self.status == Status::ViewChange {
            self.try_start_pending_view(now, out);
        }
        if self.repair.session.is_none() {
            return Ok(());
        }
        if self.repair_window().is_none() {
            self.repair.session = None;
            self.repair.pending.clear();
            self.timers.repair.stop();
        } else if progressed {
            self.request_prepares(out);
        }
        Ok(())
    }

    pub(crate) fn on_range_evicted(
        &mut self,
        header: &RepairRangeReplyHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let Some(session) = self.repair.session.as_ref() else {
            return Err(Ignored::Nonce);
        };
        if session.nonce != header.nonce.get() {
            return Err(Ignored::Nonce);
        }
        let peer = session.peer;
        // The ops we need are gone from the peer's journal (on the partition plane the peer
        // asked its WAL first, decision 71): only state transfer can help, and only for ops
        // below its retained floor that we have not applied.
        if header.op.get() > self.commit_min + 1 && self.status == Status::Normal {
            self.repair.session = None;
            self.repair.pending.clear();
            self.timers.repair.stop();
            self.start_state_transfer(peer, out);
        }
        Ok(())
    }

    // ---- server (§10.3) -----------------------------------------------------------------------

    fn repair_reply(&self, command: Command, nonce: u128, op: u64) -> Frame {
        let mut h = RepairRangeReplyHeader::zeroed();
        h.frame = FrameHeader::new(command, self.sender());
        h.nonce.set(nonce);
        h.op.set(op);
        h.group.set(self.group.0);
        frames::finish(h, &[])
    }

    pub(crate) fn on_request_prepares(
        &mut self,
        header: &RequestPreparesHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        // [design] both planes serve in Normal and ViewChange: the requester verifies every
        // body, and a primary-elect of either plane needs bodies from peers mid view change.
        if self.status == Status::Recovering {
            return Err(Ignored::Status);
        }
        if self.transfer.is_active() {
            return Err(Ignored::Transferring);
        }
        let peer = ReplicaId(header.frame.replica);
        let nonce = header.nonce.get();
        let from_op = header.from_op.get();
        let ceiling = header.to_op.get().min(self.commit_max.max(self.op));
        // What the in-memory index holds. Below it the metadata journal's slots are reused, but
        // a partition WAL may still retain committed ops below the checkpoint: the partition
        // plane asks the journal, which alone knows (the repair floor, decision 71), and answers
        // RangeEvicted only for what the journal really no longer holds.
        let indexed = self.journal.base().max(self.snapshot_op + 1);
        let floor = match self.plane() {
            Plane::Partition => 1,
            Plane::Metadata => indexed,
        };
        let start = from_op.max(floor);
        if start > ceiling {
            // Nothing in range is retained (or the range is empty after clamping, §17.10).
            if from_op <= ceiling || from_op < floor {
                self.send(
                    out,
                    peer,
                    self.repair_reply(Command::RangeEvicted, nonce, floor),
                );
            }
            self.send(
                out,
                peer,
                self.repair_reply(Command::RepairDone, nonce, from_op - 1),
            );
            return Ok(());
        }
        if start > from_op {
            self.send(
                out,
                peer,
                self.repair_reply(Command::RangeEvicted, nonce, start),
            );
        }
        let end = ceiling.min(start + u64::from(self.config.repair_chunk_max) - 1);
        // The chunk ends once its frames reach the window's bytes (decision 517), by the
        // journaled headers' sizes; a size this replica cannot know before the read is taken
        // as the largest it saw last, and the chunk is cut to its real sizes before it leaves
        // (`serve_read`).
        let estimate = u64::from(self.prepare_size_recent.get());
        let fits = chunk_within_bytes((start..=end).map(|op| {
            self.journal
                .get(op)
                .map_or(estimate, |e| u64::from(e.header.frame.size.get()))
        }));
        let end = start + fits as u64 - 1;
        let mut frames_out: Vec<Option<Frame>> = Vec::new();
        let mut reads = Vec::new();
        for op in start..=end {
            let Some(entry) = self.journal.get(op) else {
                if op < indexed {
                    // Partition, below the index: the identity is unknown here (0); the read
                    // checks the frame is this group's prepare at `op`, the requester verifies
                    // it against its own log as it does every repaired body.
                    if !self.repair.reads.contains_key(&op) {
                        reads.push((op, 0));
                    }
                    frames_out.push(None);
                    continue;
                }
                break;
            };
            if entry.frame.is_none() && !self.repair.reads.contains_key(&op) {
                reads.push((op, entry.checksum()));
            }
            frames_out.push(entry.frame.clone());
        }
        if frames_out.iter().all(Option::is_some) {
            let last = start - 1 + frames_out.len() as u64;
            for frame in frames_out.into_iter().flatten() {
                self.send(out, peer, frames::as_repair(&frame));
            }
            self.send(
                out,
                peer,
                self.repair_reply(Command::RepairDone, nonce, last),
            );
            return Ok(());
        }
        // Evicted from memory: read the bodies back, then serve the chunk in order.
        if self.repair.serves.len() >= SERVES_MAX {
            return Err(Ignored::QueueFull);
        }
        for (op, checksum) in reads {
            self.repair.reads.insert(op, checksum);
            out.push(Effect::Read { op, checksum });
        }
        self.repair.serves.push(Serve {
            peer,
            nonce,
            from: start,
            frames: frames_out,
        });
        Ok(())
    }

    /// A journal read completed: fill the chunks waiting for it and send the complete ones.
    pub(crate) fn serve_read(
        &mut self,
        op: u64,
        frame: Option<Frame>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let checksum = self
            .repair
            .reads
            .remove(&op)
            .ok_or(Ignored::StaleCompletion)?;
        let frame = frame.filter(|f| {
            f.prepare_header().is_some_and(|h| {
                h.op.get() == op
                    && if checksum == 0 {
                        // Read below the index (decision 71): any intact prepare of this
                        // group at `op`.
                        h.group.get() == self.group.0
                            && wire::integrity::verify_prepare_identity(h.bytes())
                    } else {
                        h.frame.checksum.get() == checksum
                    }
            })
        });
        let serves = std::mem::take(&mut self.repair.serves);
        for mut serve in serves {
            let Some(index) = op
                .checked_sub(serve.from)
                .map(|i| i as usize)
                .filter(|i| *i < serve.frames.len())
            else {
                self.repair.serves.push(serve);
                continue;
            };
            match &frame {
                Some(f) => serve.frames[index] = Some(f.clone()),
                // The journal lost it: serve what precedes it (or report the eviction).
                None => serve.frames.truncate(index),
            }
            if serve.frames.iter().any(Option::is_none) {
                self.repair.serves.push(serve);
                continue;
            }
            if serve.frames.is_empty() {
                let evicted = self.repair_reply(Command::RangeEvicted, serve.nonce, op + 1);
                self.send(out, serve.peer, evicted);
            }
            let fits = chunk_within_bytes(serve.frames.iter().flatten().map(|f| f.len() as u64));
            serve.frames.truncate(fits);
            let last = serve.from - 1 + serve.frames.len() as u64;
            for f in serve.frames.iter().flatten() {
                self.send(out, serve.peer, frames::as_repair(f));
            }
            let done = self.repair_reply(Command::RepairDone, serve.nonce, last);
            self.send(out, serve.peer, done);
        }
        Ok(())
    }
}

/// How many of a chunk's leading frames, of these sizes, one reply carries: as many as fit
/// in [`REPAIR_WINDOW_BYTES_MAX`], and at least one so that repair always progresses
/// (decision 517). The one rule for both the chunk a server plans and the chunk it sends.
fn chunk_within_bytes(sizes: impl Iterator<Item = u64>) -> usize {
    let mut bytes = 0u64;
    let mut count = 0;
    for size in sizes {
        bytes += size;
        if count > 0 && bytes > REPAIR_WINDOW_BYTES_MAX {
            break;
        }
        count += 1;
    }
    count
}

#[cfg(test)]
#[path = "repair_tests.rs"]
mod tests;
