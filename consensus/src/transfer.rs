//! State transfer (§11): RequestStateTransfer / StateTransferTarget / RequestStateChunk /
//! StateChunk, pull-based and lockstep (one chunk in flight), every artifact verified against
//! the manifest (length and XXH3-64) before anything is installed.
//!
//! Artifacts come from the [`StateMachine`] (and, on the metadata plane, the core's own client
//! table, kind CLIENT_TABLE). They are streamed (decision 170): the serving side reads each
//! chunk from the state machine's frozen offer as it is asked for, the receiving side hands
//! each in-order chunk to the state machine to stage and folds it into a running XXH3-64, so
//! the core holds at most one chunk of state-machine artifact bytes at a time
//! ([`TRANSFER_BYTES_HELD_MAX`]). After an install the driver makes the state durable
//! ([`Effect::Checkpoint`]) and the core repairs the ops after `commit_op`.

use std::collections::BTreeMap;

use wire::Command;
use wire::header::{
    FrameHeader, Layout, RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader,
};
use wire::manifest::{self, ArtifactKind, ManifestEntry};

use crate::client_table::ClientTable;
use crate::constants::{
    OFFER_EXPIRY_RETRIES, OFFER_EXPIRY_RETRIES_DONE, PARTITION_OFFSETS_ARTIFACT_LEN_MAX,
    PARTITION_TRANSFER_LEN_MAX, STATE_CHUNK_LEN_MAX, STATE_TRANSFER_STALLS_MAX,
    TRANSFER_BYTES_HELD_MAX,
};
use crate::frames;
use crate::ignored::Ignored;
use crate::io::{Effect, Outbox};
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{Frame, Now, Plane, ReplicaId, Status};

/// The metadata plane's per-artifact cap (1 GiB) and total cap (4 GiB), §11.2 step 3. The
/// partition plane's are `transfer_artifact_bytes_max` for its SEGMENT_LOG (a partition's
/// whole log),
/// [`PARTITION_OFFSETS_ARTIFACT_LEN_MAX`] for its offsets and [`PARTITION_TRANSFER_LEN_MAX`]
/// in all (state-transfer.md §3, decision 507).
const METADATA_ARTIFACT_LEN_MAX: u64 = 1 << 30;
const METADATA_TRANSFER_LEN_MAX: u64 = 4 << 30;
/// Install failures tolerated per offered generation before giving up (§11.2 step 6).
const INSTALL_FAILURES_MAX: u32 = 5;

/// Receiver-side stage (§11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransferStage {
    /// No transfer.
    #[default]
    Idle,
    /// Asked for a descriptor.
    AwaitingTarget,
    /// Pulling chunks.
    Fetching,
    /// Installing the artifacts.
    Installing,
}

impl TransferStage {
    /// The legal transitions (STYLE.md §5).
    fn can_move(self, to: TransferStage) -> bool {
        use TransferStage::*;
        matches!(
            (self, to),
            (Idle, AwaitingTarget)
                | (AwaitingTarget, Fetching)
                | (AwaitingTarget, Idle)
                | (AwaitingTarget, AwaitingTarget)
                | (Fetching, Installing)
                | (Fetching, AwaitingTarget)
                | (Fetching, Idle)
                | (Installing, Idle)
                | (Installing, AwaitingTarget)
        )
    }
}

/// XXH3-64 folded over an artifact's chunks as they arrive.
#[derive(Clone)]
pub(crate) struct RunningChecksum(xxhash_rust::xxh3::Xxh3Default);

impl RunningChecksum {
    fn new() -> RunningChecksum {
        RunningChecksum(xxhash_rust::xxh3::Xxh3Default::new())
    }
}

impl std::fmt::Debug for RunningChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunningChecksum({:#x})", self.0.digest())
    }
}

/// A receiver session.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub nonce: u128,
    pub peer: ReplicaId,
    pub commit_op: u64,
    pub entries: Vec<ManifestEntry>,
    /// Bytes received (and staged) per manifest entry.
    pub received: Vec<u64>,
    /// Checksum of the first incomplete artifact's bytes so far.
    pub running: RunningChecksum,
    /// Manifest index -> index among the state machine's staged artifacts (`None`: the
    /// CLIENT_TABLE, which the core keeps itself).
    pub staged_index: Vec<Option<usize>>,
    /// The CLIENT_TABLE's bytes (metadata plane): the core's own state, decoded at install.
    pub client_table: Vec<u8>,
    pub idle_ticks: u64,
    pub stalls: u32,
    pub failures: u32,
    /// The view of the server's offer (0 until the target arrives).
    pub view: u32,
    /// Leading artifacts whose length and checksum were verified.
    pub verified: usize,
}

impl Session {
    /// The artifact the next chunk belongs to.
    fn first_incomplete(&self) -> Option<usize> {
        (0..self.entries.len()).find(|i| self.received[*i] < self.entries[*i].len)
    }

    /// The next artifact to verify, if it is complete.
    fn verified_upto(&self) -> Option<usize> {
        let i = self.verified;
        (i < self.entries.len() && self.received[i] == self.entries[i].len).then_some(i)
    }
}

/// An offer cached by the server for one requester: the manifest only; the bytes stay with
/// the state machine's frozen image (and, for the CLIENT_TABLE, here).
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    pub nonce: u128,
    pub commit_op: u64,
    pub manifest: Vec<u8>,
    /// Artifact lengths in manifest order.
    pub lens: Vec<u64>,
    /// Manifest index of the CLIENT_TABLE and its encoding as of the offer (metadata plane).
    pub client_table: Option<(usize, Vec<u8>)>,
    pub idle_ticks: u64,
    pub done: bool,
}

/// Both sides of state transfer for one group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Transfer {
    pub stage: TransferStage,
    pub session: Option<Session>,
    /// Server: offers by requester.
    pub offers: BTreeMap<u8, Offer>,
    /// After an install left the head at `commit_op` without its identity: the next op is
    /// accepted from the current primary's journal without a parent check.
    pub anchor_unknown: bool,
    /// Most state-machine artifact bytes the core held at once for this group (observability:
    /// the simulator's report, the memory-bound test).
    pub held_peak: usize,
}

impl Transfer {
    fn held(&mut self, bytes: usize) {
        debug_assert!(bytes <= TRANSFER_BYTES_HELD_MAX, "transfer memory bound");
        self.held_peak = self.held_peak.max(bytes);
    }

    pub fn is_active(&self) -> bool {
        self.stage != TransferStage::Idle
    }

    fn move_to(&mut self, to: TransferStage) {
        assert!(self.stage.can_move(to), "illegal transfer transition");
        self.stage = to;
    }

    /// Drops any receiver session (probe exhaustion, §9.3).
    pub fn abandon(&mut self) {
        self.stage = TransferStage::Idle;
        self.session = None;
    }
}

fn chunk_len_max(max_message_size: usize) -> u32 {
    manifest::chunk_len_max(max_message_size).min(STATE_CHUNK_LEN_MAX)
}

impl<S: StateMachine> Replica<S> {
    // ---- receiver ---------------------------------------------------------------------------

    /// Starts a receiver session against `peer` (§11.2 step 1).
    pub(crate) fn start_state_transfer(&mut self, peer: ReplicaId, out: &mut Outbox) {
        if self.transfer.is_active() || peer == self.id {
            return;
        }
        self.repair.session = None;
        self.timers.repair.stop();
        self.transfer.move_to(TransferStage::AwaitingTarget);
        self.transfer.session = Some(Session {
            nonce: self.prng.nonce(),
            peer,
            commit_op: 0,
            entries: Vec::new(),
            received: Vec::new(),
            running: RunningChecksum::new(),
            staged_index: Vec::new(),
            client_table: Vec::new(),
            verified: 0,
            idle_ticks: 0,
            stalls: 0,
            failures: 0,
            view: 0,
        });
        self.request_state_transfer(out);
    }

    fn request_state_transfer(&self, out: &mut Outbox) {
        let Some(session) = self.transfer.session.as_ref() else {
            return;
        };
        let mut h = RequestStateTransferHeader::zeroed();
        h.frame = FrameHeader::new(Command::RequestStateTransfer, self.sender());
        h.nonce.set(session.nonce);
        h.group.set(self.group.0);
        self.send(out, session.peer, frames::finish(h, &[]));
    }

    fn request_next_chunk(&self, out: &mut Outbox) {
        let Some(session) = self.transfer.session.as_ref() else {
            return;
        };
        let Some(index) = session.first_incomplete() else {
            return;
        };
        let entry = &session.entries[index];
        let offset = session.received[index];
        let len = (entry.len - offset).min(u64::from(chunk_len_max(self.config.max_message_size)));
        let mut h = RequestStateChunkHeader::zeroed();
        h.frame = FrameHeader::new(Command::RequestStateChunk, self.sender());
        h.nonce.set(session.nonce);
        h.offset.set(offset);
        h.group.set(self.group.0);
        h.len.set(len as u32);
        h.artifact.set(index as u32);
        self.send(out, session.peer, frames::finish(h, &[]));
    }

    /// Gives up the transfer and falls back to journal repair from the current primary.
    fn fall_back_to_repair(&mut self, out: &mut Outbox) {
        self.transfer.abandon();
        if self.status == Status::Normal && !self.is_primary() {
            let primary = self.primary_index(self.view);
            self.start_repair(primary, out);
        }
    }

    pub(crate) fn on_state_transfer_target(
        &mut self,
        now: Now,
        header: &StateTransferTargetHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let session = self.transfer.session.as_ref().ok_or(Ignored::Nonce)?;
        if session.nonce != header.nonce.get() {
            return Err(Ignored::Nonce);
        }
        if self.transfer.stage != TransferStage::AwaitingTarget {
            return Err(Ignored::Duplicate);
        }
        if header.available == 0 {
            if header.unavailable_transient == 1 {
                // Momentary: the stall timer asks again.
                return Ok(());
            }
            self.fall_back_to_repair(out);
            return Ok(());
        }
        let decoded = manifest::decode(body).map_err(|_| Ignored::Malformed)?;
        let entries = decoded.to_vec();
        // The largest artifact of each kind this plane accepts (`None`: not of this plane).
        let len_max = |kind: ArtifactKind| match self.plane() {
            Plane::Metadata => (kind == ArtifactKind::METADATA_SNAPSHOT
                || kind == ArtifactKind::CLIENT_TABLE)
                .then_some(METADATA_ARTIFACT_LEN_MAX),
            Plane::Partition if kind == ArtifactKind::SEGMENT_LOG => {
                Some(self.config.transfer_artifact_bytes_max)
            }
            Plane::Partition if kind == ArtifactKind::CONSUMER_OFFSETS => {
                Some(PARTITION_OFFSETS_ARTIFACT_LEN_MAX)
            }
            Plane::Partition => None,
        };
        let total_max = match self.plane() {
            Plane::Metadata => METADATA_TRANSFER_LEN_MAX,
            Plane::Partition => PARTITION_TRANSFER_LEN_MAX,
        };
        let total: u64 = entries.iter().map(|e| e.len).fold(0, u64::saturating_add);
        let client_tables = entries
            .iter()
            .filter(|e| e.kind == ArtifactKind::CLIENT_TABLE)
            .count();
        if entries
            .iter()
            .any(|e| len_max(e.kind).is_none_or(|max| e.len > max))
            || total > total_max
            || client_tables > 1
        {
            return Err(Ignored::Malformed);
        }
        let commit_op = header.commit_op.get();
        if self.plane() == Plane::Partition
            && (commit_op > header.commit_max.get()
                || header.frame.view.get() < self.view
                || header.commit_max.get() < self.commit_max)
        {
            // A sender behind us, or an offer beyond its own commit point (§11.2 step 3).
            self.fall_back_to_repair(out);
            return Err(Ignored::Scope);
        }
        if commit_op <= self.commit_min {
            // Nothing to gain: journal repair covers the rest.
            self.fall_back_to_repair(out);
            return Ok(());
        }
        let mut staged = Vec::new();
        let mut staged_index = Vec::with_capacity(entries.len());
        for e in &entries {
            if e.kind == ArtifactKind::CLIENT_TABLE {
                staged_index.push(None);
            } else {
                staged_index.push(Some(staged.len()));
                staged.push(*e);
            }
        }
        let session = self.transfer.session.as_mut().expect("checked");
        session.commit_op = commit_op;
        session.view = header.frame.view.get();
        session.received = vec![0; entries.len()];
        session.running = RunningChecksum::new();
        session.staged_index = staged_index;
        session.client_table = Vec::new();
        session.verified = 0;
        session.entries = entries;
        session.idle_ticks = 0;
        session.stalls = 0;
        self.transfer.move_to(TransferStage::Fetching);
        if self.sm.stage_begin(&staged).is_err() {
            self.fail_transfer(out);
            return Ok(());
        }
        self.after_chunk(now, out);
        Ok(())
    }

    pub(crate) fn on_state_chunk(
        &mut self,
        now: Now,
        header: &StateChunkHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let session = self.transfer.session.as_mut().ok_or(Ignored::Nonce)?;
        if session.nonce != header.nonce.get() {
            return Err(Ignored::Nonce);
        }
        if self.transfer.stage != TransferStage::Fetching {
            return Err(Ignored::Status);
        }
        let index = header.artifact.get() as usize;
        if session.first_incomplete() != Some(index)
            || header.offset.get() != session.received[index]
            || body.is_empty()
            || header
                .offset
                .get()
                .checked_add(body.len() as u64)
                .is_none_or(|end| end > session.entries[index].len)
        {
            return Err(Ignored::Scope);
        }
        let offset = session.received[index];
        session.running.0.update(body);
        let staged = match session.staged_index[index] {
            Some(staged) => self.sm.stage_chunk(staged, offset, body).is_ok(),
            None => {
                session.client_table.extend_from_slice(body);
                true
            }
        };
        session.received[index] += body.len() as u64;
        session.idle_ticks = 0;
        session.stalls = 0;
        if !staged {
            self.fail_transfer(out);
            return Ok(());
        }
        self.after_chunk(now, out);
        Ok(())
    }

    /// After a descriptor or a chunk: verifies every artifact that just became complete
    /// (zero-length ones included) against its manifest checksum, then asks for the next chunk
    /// or installs. A mismatch discards the session (§11.2 step 6).
    fn after_chunk(&mut self, now: Now, out: &mut Outbox) {
        let session = self.transfer.session.as_mut().expect("a session");
        let mut intact = true;
        while let Some(index) = session.verified_upto() {
            // `index` is complete and not yet verified: the running checksum covers it whole.
            let entry = &session.entries[index];
            intact &= session.received[index] == entry.len
                && session.running.0.digest() == entry.checksum;
            session.running = RunningChecksum::new();
            session.verified += 1;
        }
        if !intact {
            self.fail_transfer(out);
        } else if session.first_incomplete().is_none() {
            self.install_transfer(now, out);
        } else {
            self.request_next_chunk(out);
        }
    }

    /// Discards the session (a checksum mismatch, a staging failure, or an install the state
    /// machine refused) and re-arms a new one with a fresh nonce, within the failure budget
    /// (§11.2 step 6); beyond it, falls back to journal repair.
    fn fail_transfer(&mut self, out: &mut Outbox) {
        let session = self.transfer.session.take().expect("a session");
        let failures = session.failures + 1;
        if failures > INSTALL_FAILURES_MAX {
            self.transfer.move_to(TransferStage::Idle);
            self.fall_back_to_repair(out);
            return;
        }
        self.transfer.move_to(TransferStage::AwaitingTarget);
        self.transfer.session = Some(Session {
            nonce: self.prng.nonce(),
            failures,
            commit_op: 0,
            entries: Vec::new(),
            received: Vec::new(),
            running: RunningChecksum::new(),
            staged_index: Vec::new(),
            client_table: Vec::new(),
            verified: 0,
            idle_ticks: 0,
            stalls: 0,
            peer: session.peer,
            view: 0,
        });
        self.request_state_transfer(out);
    }

    /// Installs the staged, verified artifacts (§11.2 step 6, §11.3).
    fn install_transfer(&mut self, now: Now, out: &mut Outbox) {
        self.transfer.move_to(TransferStage::Installing);
        let session = self.transfer.session.as_ref().expect("a session");
        debug_assert_eq!(
            session.verified,
            session.entries.len(),
            "installs only verified data"
        );
        let table = if self.plane() == Plane::Metadata {
            ClientTable::decode(&session.client_table, self.config.clients_table_max)
        } else {
            None
        };
        let table_ok = self.plane() == Plane::Partition || table.is_some();
        let commit_op = session.commit_op;
        let installed =
            table_ok && commit_op > self.commit_min && self.sm.install_staged(commit_op).is_ok();
        if !installed {
            // Restart from scratch with a fresh nonce, within the failure budget.
            self.fail_transfer(out);
            return;
        }
        let session = self.transfer.session.take().expect("a session");
        if let Some(table) = table {
            self.clients = table;
        }
        // Floor jump: ops at or below commit_op are now in the installed state.
        self.commit_min = commit_op;
        self.commit_max = self.commit_max.max(commit_op);
        self.snapshot_op = commit_op;
        self.snapshot_checksum = 0;
        self.snapshot_timestamp = 0;
        self.durable_prefix = self.durable_prefix.max(commit_op);
        // Our head at `commit_op`, known from the offer's own view, is the committed prepare
        // there: keep its identity across the trim (decision 32).
        let same_view = self.status == Status::Normal
            && session.view == self.view
            && self.log_view == self.view
            && self.op == commit_op
            && !self.transfer.anchor_unknown;
        if same_view
            && let Some(entry) = self.journal.get(commit_op)
            && entry.verified
            && entry.checksum() == self.last_checksum
        {
            self.head_header = Some(entry.header);
        }
        let keep_anchor = same_view && self.described_head_at_trim(commit_op);
        self.journal.trim_below(commit_op + 1);
        self.repair.pending.retain(|op, _| *op > commit_op);
        self.view_headers.retain(|op, _| *op > commit_op);
        if self.op < commit_op || (self.op == commit_op && !keep_anchor) {
            self.op = commit_op;
            // The identity at commit_op is not in the manifest: the next op is anchored by the
            // view's headers if we hold them, else by the current primary's journal (§10).
            self.last_checksum = 0;
            self.transfer.anchor_unknown = true;
        }
        if self.plane() == Plane::Partition {
            let end = self.sm.next_offset();
            self.applied_offset_end = self.applied_offset_end.max(end);
            self.next_offset = self.next_offset.max(end);
        }
        // The checkpoint is emitted at the end of this step, at `commit_min` (>= commit_op:
        // the journal above commit_op may be applied below), when the state machine is there.
        self.checkpoint_forced = true;
        self.transfers_installed += 1;
        self.transfer.move_to(TransferStage::Idle);
        self.commit_journal(now, out);
        if self.status == Status::Normal && !self.is_primary() {
            let primary = self.primary_index(self.view);
            if self.commit_min < self.commit_max || self.has_holes() {
                self.start_repair(primary, out);
            }
        }
    }

    /// End of every step: emit `Effect::Checkpoint` at `commit_min` after a transfer install,
    /// or periodically once `commit_min` is `checkpoint_interval_ops` above the snapshot floor
    /// (consensus.md §11, decision 31). One periodic checkpoint in flight at a time; only
    /// once every op up to `commit_min` is durably journaled and its identity is known.
    pub(crate) fn maybe_checkpoint(&mut self, out: &mut Outbox) {
        let op = self.commit_min;
        if self.checkpoint_forced {
            self.checkpoint_forced = false;
            self.checkpoint_pending = Some(self.checkpoint_pending.map_or(op, |p| p.max(op)));
            out.push(Effect::Checkpoint { op });
            return;
        }
        let interval = self.config.checkpoint_interval_ops;
        if interval == 0
            || self.checkpoint_pending.is_some()
            || self.transfer.is_active()
            || self.status == Status::Recovering
            || op < self.snapshot_op.saturating_add(interval)
            || self.durable_prefix < op
            || self.checkpoint_durable < self.snapshot_op
            || self.journal.get(op).is_none()
        {
            return;
        }
        self.checkpoint_pending = Some(op);
        out.push(Effect::Checkpoint { op });
    }

    /// The driver made the snapshot at `op` durable and compacted its journal below `op`
    /// (keeping the entry at `op`). A periodic checkpoint raises the snapshot floor: repair
    /// serving answers RangeEvicted at or below it, and the index forgets what lies below.
    pub(crate) fn on_checkpointed(
        &mut self,
        now: Now,
        op: u64,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if op > self.commit_min || (op > self.snapshot_op && self.checkpoint_pending.is_none()) {
            return Err(Ignored::StaleCompletion);
        }
        if self.checkpoint_pending.is_some_and(|p| p <= op) {
            self.checkpoint_pending = None;
        }
        if op > self.snapshot_op {
            let (checksum, timestamp) = self.snapshot_identity(op);
            self.snapshot_op = op;
            self.snapshot_checksum = checksum;
            self.snapshot_timestamp = timestamp;
            self.journal.trim_below(op);
            self.repair.pending.retain(|o, _| *o > op);
            self.durable_prefix = self.durable_prefix.max(op);
        }
        let room = self.journal_op_max();
        self.checkpoint_durable = self.checkpoint_durable.max(op);
        self.advance_durable_prefix(out);
        if self.journal_op_max() > room {
            self.on_journal_room(now, out);
        }
        Ok(())
    }

    /// The journal's floor rose (decision 34): resume whatever waited for room. The primary
    /// prepares parked requests; a backup asks for what it skipped (prepares it ignored come
    /// back by retransmission or repair); a primary-elect repairs the rest of the decided log.
    fn on_journal_room(&mut self, now: Now, out: &mut Outbox) {
        if self.transfer.is_active() {
            return;
        }
        match self.status {
            Status::Normal if self.is_primary() => self.promote_requests(now, out),
            Status::Normal => {
                if self.commit_min < self.commit_max || self.has_holes() {
                    self.start_repair(self.primary_index(self.view), out);
                }
            }
            Status::ViewChange => self.try_start_pending_view(now, out),
            Status::Recovering => {}
        }
    }

    /// Transfer timers: receiver stall retries and server offer expiry (§6).
    pub(crate) fn tick_transfer(&mut self, out: &mut Outbox) {
        let retry = self.config.repair_retry_ticks;
        for offer in self.transfer.offers.values_mut() {
            offer.idle_ticks += 1;
        }
        let expired: Vec<u8> = self
            .transfer
            .offers
            .iter()
            .filter(|(_, o)| {
                let limit = retry
                    * if o.done {
                        OFFER_EXPIRY_RETRIES_DONE
                    } else {
                        OFFER_EXPIRY_RETRIES
                    };
                o.idle_ticks >= limit
            })
            .map(|(r, _)| *r)
            .collect();
        for requester in expired {
            self.transfer.offers.remove(&requester);
            self.sm.release_offer(ReplicaId(requester));
        }
        let Some(session) = self.transfer.session.as_mut() else {
            return;
        };
        session.idle_ticks += 1;
        if session.idle_ticks < retry {
            return;
        }
        session.idle_ticks = 0;
        session.stalls += 1;
        if session.stalls > STATE_TRANSFER_STALLS_MAX {
            self.fall_back_to_repair(out);
            return;
        }
        match self.transfer.stage {
            TransferStage::AwaitingTarget => self.request_state_transfer(out),
            TransferStage::Fetching => self.request_next_chunk(out),
            TransferStage::Idle | TransferStage::Installing => {}
        }
    }

    // ---- server -----------------------------------------------------------------------------

    fn refusal(&self, nonce: u128, transient: bool) -> Frame {
        let mut h = StateTransferTargetHeader::zeroed();
        h.frame = FrameHeader::new(Command::StateTransferTarget, self.sender());
        h.nonce.set(nonce);
        h.commit_op.set(self.commit_min);
        h.group.set(self.group.0);
        h.unavailable_transient = u8::from(transient);
        h.commit_max.set(self.commit_max);
        frames::finish(h, &[])
    }

    fn descriptor(&self, offer: &Offer) -> Frame {
        let mut h = StateTransferTargetHeader::zeroed();
        h.frame = FrameHeader::new(Command::StateTransferTarget, self.sender());
        h.nonce.set(offer.nonce);
        h.commit_op.set(offer.commit_op);
        h.group.set(self.group.0);
        h.available = 1;
        h.commit_max.set(self.commit_max);
        frames::finish(h, &offer.manifest)
    }

    pub(crate) fn on_request_state_transfer(
        &mut self,
        header: &RequestStateTransferHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let requester = ReplicaId(header.frame.replica);
        let nonce = header.nonce.get();
        if let Some(offer) = self
            .transfer
            .offers
            .get_mut(&requester.0)
            .filter(|o| o.nonce == nonce)
        {
            // A retry with the same nonce gets the same offer (first wins).
            offer.idle_ticks = 0;
            let frame = self.descriptor(&self.transfer.offers[&requester.0]);
            self.send(out, requester, frame);
            return Ok(());
        }
        if !self.can_serve_transfer() {
            self.send(out, requester, self.refusal(nonce, true));
            return Err(Ignored::NotPrimary);
        }
        let commit_op = self.commit_min;
        // A new nonce replaces the requester's previous offer (the state machine's `offer`
        // replaces its image under the same key).
        self.transfer.offers.remove(&requester.0);
        let Ok(mut entries) = self.sm.offer(requester, commit_op) else {
            self.sm.release_offer(requester);
            self.send(out, requester, self.refusal(nonce, true));
            return Err(Ignored::ArtifactIo);
        };
        let mut client_table = None;
        if self.plane() == Plane::Metadata {
            let bytes = self.clients.encode();
            entries.push(ManifestEntry {
                kind: ArtifactKind::CLIENT_TABLE,
                frontier: commit_op,
                len: bytes.len() as u64,
                checksum: manifest::artifact_checksum(&bytes),
            });
            client_table = Some((entries.len() - 1, bytes));
        }
        let mut manifest_bytes = Vec::new();
        if manifest::encode(&entries, &mut manifest_bytes).is_err() {
            self.sm.release_offer(requester);
            self.send(out, requester, self.refusal(nonce, false));
            return Err(Ignored::Malformed);
        }
        let offer = Offer {
            nonce,
            commit_op,
            manifest: manifest_bytes,
            lens: entries.iter().map(|e| e.len).collect(),
            client_table,
            idle_ticks: 0,
            done: false,
        };
        let frame = self.descriptor(&offer);
        self.transfer.offers.insert(requester.0, offer);
        self.send(out, requester, frame);
        Ok(())
    }

    pub(crate) fn on_request_state_chunk(
        &mut self,
        header: &RequestStateChunkHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let requester = ReplicaId(header.frame.replica);
        let nonce = header.nonce.get();
        let Some(offer) = self
            .transfer
            .offers
            .get_mut(&requester.0)
            .filter(|o| o.nonce == nonce)
        else {
            let frame = self.refusal(nonce, true);
            self.send(out, requester, frame);
            return Err(Ignored::Nonce);
        };
        let index = header.artifact.get() as usize;
        let Some(&len_total) = offer.lens.get(index) else {
            return Err(Ignored::Scope);
        };
        let offset = header.offset.get();
        if offset >= len_total {
            return Err(Ignored::Scope);
        }
        let cap = u64::from(chunk_len_max(self.config.max_message_size));
        let len = u64::from(header.len.get()).min(cap).min(len_total - offset);
        offer.idle_ticks = 0;
        if index + 1 == offer.lens.len() && offset + len == len_total {
            offer.done = true;
        }
        // The chunk is read straight into the frame that carries it: one chunk held, no copy.
        let mut frame = Vec::with_capacity(wire::HEADER_SIZE + len as usize);
        frame.resize(wire::HEADER_SIZE, 0);
        match offer.client_table.as_ref().filter(|(i, _)| *i == index) {
            Some((_, bytes)) => {
                frame.extend_from_slice(&bytes[offset as usize..(offset + len) as usize]);
            }
            None => {
                if self
                    .sm
                    .read_chunk(requester, index, offset, len as usize, &mut frame)
                    .is_err()
                    || frame.len() != wire::HEADER_SIZE + len as usize
                {
                    // The requester's stall timer asks again; a persistent failure ends in
                    // its fallback to journal repair.
                    return Err(Ignored::ArtifactIo);
                }
            }
        }
        self.transfer.held(frame.capacity());
        let mut h = StateChunkHeader::zeroed();
        h.frame = FrameHeader::new(Command::StateChunk, self.sender());
        h.nonce.set(nonce);
        h.offset.set(offset);
        h.group.set(self.group.0);
        h.artifact.set(index as u32);
        let frame = frames::finish_in_place(h, frame);
        self.send(out, requester, frame);
        Ok(())
    }
}

#[cfg(test)]
#[path = "transfer_tests.rs"]
mod tests;
