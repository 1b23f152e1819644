//! Normal operation (§5): admission, prepares, chain replication, PrepareOk, commit, apply,
//! reply, Commit heartbeats and prepare retransmission.

use wire::Operation;
use wire::decode::EvictionReason;
use wire::header::{CommitHeader, FrameHeader, Layout, PrepareHeader, PrepareOkHeader};

use crate::client_table::Verdict;
use crate::constants::PREPARE_RETRANSMIT_BACKOFF_EXPONENT_MAX;
use crate::frames::{self, codes};
use crate::ignored::Ignored;
use crate::io::{ClientRequest, Effect, FatalReason, Outbox};
use crate::journal::Entry;
use crate::partition;
use crate::quorum;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{ClientId, Frame, Now, Plane, ReplicaId, Status};

impl<S: StateMachine> Replica<S> {
    pub(crate) fn on_tick(&mut self, now: Now, out: &mut Outbox) {
        if self.is_primary() && !self.pipeline.is_empty() {
            self.pipeline_stalled_ticks += 1;
            if self.pipeline_stalled_ticks == self.config.heartbeat_timeout_ticks + 1 {
                // The abdication below starts now: primary affinity backs off (decision 171).
                self.affinity_setback(now);
                self.takeover_view = None;
            }
        } else {
            self.pipeline_stalled_ticks = 0;
        }
        // Count every timer down first, then fire the expired ones: a handler that starts a
        // timer is not charged this tick for it.
        self.timers.tick();
        if self.timers.prepare.fire() {
            self.on_prepare_timeout(now, out);
        }
        if self.timers.commit_message.fire() {
            self.on_commit_message_timeout(out);
        }
        if self.timers.normal_heartbeat.fire() {
            self.on_normal_heartbeat_timeout(now, out);
        }
        self.tick_view_change(now, out);
        if self.timers.request_start_view.fire() {
            self.on_request_start_view_timeout(now, out);
        }
        if self.timers.repair.fire() {
            self.on_repair_timeout(out);
        }
        if self.timers.persist_retry.fire() {
            self.persist_vsr_state(out);
        }
        self.tick_transfer(out);
        self.tick_forwards(now, out);
    }

    // ---- admission (§5.1) -------------------------------------------------------------------

    /// Whether this primary may admit new client requests: caught up (§5.1) and with its view
    /// durable (§8.10).
    pub(crate) fn is_caught_up_primary(&self) -> bool {
        self.is_primary()
            && !self.transfer.is_active()
            && !self.transfer.anchor_unknown
            && self.commit_min == self.commit_max
            && self.commit_max >= self.recovery_barrier
            && self.is_vsr_durable_strict()
    }

    /// Whether this primary may serve a state transfer (§11.2, decision 60): everything
    /// `is_caught_up_primary` asks except the recovery barrier. An offer carries only applied
    /// state (`commit_min`), which is committed whatever the barrier says; the barrier holds back
    /// *new* requests until the recovered suffix re-commits, and that suffix can only re-commit
    /// once the backups that are transferring have installed and can ack it.
    pub(crate) fn can_serve_transfer(&self) -> bool {
        self.is_primary()
            && !self.transfer.is_active()
            && !self.transfer.anchor_unknown
            && self.commit_min == self.commit_max
            && self.is_vsr_durable_strict()
    }

    fn deny(&self, request: &ClientRequest, code: u32, out: &mut Outbox) {
        let client = ClientId(request.header.client.get());
        let frame = match self.plane() {
            Plane::Metadata => frames::reply_denied_result(&request.header, self.commit_max, code),
            Plane::Partition => {
                frames::reply_denied_status(self.sender(), &request.header, self.commit_max, code)
            }
        };
        out.push(Effect::Reply { client, frame });
    }

    pub(crate) fn on_request(
        &mut self,
        now: Now,
        request: ClientRequest,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let operation = Operation::from_byte(request.header.operation).ok_or(Ignored::Malformed)?;
        if request.header.client.get() == 0 {
            return Err(Ignored::Malformed);
        }
        let in_plane = match self.plane() {
            Plane::Metadata => operation.is_metadata_plane() && !operation.is_internal(),
            Plane::Partition => operation.is_partition(),
        };
        if !in_plane {
            return Err(Ignored::Plane);
        }
        if !self.is_primary() || self.transfer.is_active() {
            if self.plane() == Plane::Metadata
                && matches!(operation, Operation::Register | Operation::Logout)
                && self.status == Status::Normal
                && !self.is_primary()
            {
                return self.forward_session(now, request, out);
            }
            self.deny(&request, codes::TRANSIENT_NOT_ACCEPTED, out);
            return Err(Ignored::NotPrimary);
        }
        match self.plane() {
            Plane::Metadata => self.preflight_metadata(operation, &request, out)?,
            Plane::Partition => {
                if !self.is_vsr_durable_strict() || self.transfer.anchor_unknown {
                    self.deny(&request, codes::TRANSIENT_NOT_ACCEPTED, out);
                    return Err(Ignored::Refused);
                }
                if operation == Operation::SendMessages {
                    let batch =
                        partition::batch_of_request(&request.body).ok_or(Ignored::Malformed)?;
                    if let Err(error) = partition::check(batch) {
                        let code = match error {
                            partition::BatchError::Shape => codes::INVALID_MESSAGES_COUNT,
                            partition::BatchError::MessageChecksum => {
                                codes::INVALID_MESSAGE_CHECKSUM
                            }
                            partition::BatchError::BatchChecksum => codes::INVALID_BATCH_CHECKSUM,
                        };
                        self.deny(&request, code, out);
                        return Err(Ignored::Refused);
                    }
                }
            }
        }
        if let Err(code) = self.sm.preflight(operation, &request.body) {
            self.deny(&request, code, out);
            return Err(Ignored::Refused);
        }
        self.admit(now, request, out)
    }

    /// Metadata preflight, in the order of §5.1: in-flight dedup, catch-up gate, table check.
    fn preflight_metadata(
        &mut self,
        operation: Operation,
        request: &ClientRequest,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let client = request.header.client.get();
        let in_flight = self
            .pipeline
            .iter()
            .any(|p| p.header.client.get() == client)
            || self
                .requests
                .iter()
                .any(|r| r.header.client.get() == client);
        if in_flight || !self.is_caught_up_primary() {
            self.deny(request, codes::TRANSIENT_NOT_COMMITTED, out);
            return Err(Ignored::Refused);
        }
        if operation == Operation::Register {
            let user = request.header.user_id.get();
            if self
                .clients
                .owner(client)
                .is_some_and(|owner| owner != user)
            {
                self.deny(request, codes::CLIENT_ID_OWNED_BY_ANOTHER_USER, out);
                return Err(Ignored::Refused);
            }
            return Ok(());
        }
        let verdict = self.clients.check(
            client,
            request.header.session.get(),
            request.header.request.get(),
            request.header.request_checksum.get(),
        );
        match verdict {
            Verdict::New => Ok(()),
            Verdict::Replay(frame) => {
                out.push(Effect::Reply {
                    client: ClientId(client),
                    frame: Frame::new(frame),
                });
                Err(Ignored::Duplicate)
            }
            Verdict::AlreadyApplied => {
                self.deny(request, codes::REQUEST_ALREADY_APPLIED, out);
                Err(Ignored::Refused)
            }
            Verdict::NoSession | Verdict::Fenced => {
                let reason = if verdict == Verdict::NoSession {
                    EvictionReason::NoSession
                } else {
                    EvictionReason::SessionTooLow
                };
                out.push(Effect::Reply {
                    client: ClientId(client),
                    frame: frames::eviction(self.sender(), client, reason),
                });
                Err(Ignored::Refused)
            }
            Verdict::Drop => Err(Ignored::Refused),
        }
    }

    /// Two-queue admission (§5.1 step 3).
    fn admit(&mut self, now: Now, request: ClientRequest, out: &mut Outbox) -> Result<(), Ignored> {
        if self.requests.is_empty() && self.has_prepare_room() {
            self.propose(now, request, out);
            Ok(())
        } else if self.requests.len() < self.config.request_queue_depth {
            self.requests.push_back(request);
            Ok(())
        } else {
            Err(Ignored::QueueFull)
        }
    }

    /// Whether the primary may prepare the next op now: a free pipeline slot, and journal room
    /// for `op + 1` (decision 34). Otherwise requests wait in the request queue (backpressure)
    /// until a commit frees the pipeline or a durable checkpoint raises the journal's floor.
    pub(crate) fn has_prepare_room(&self) -> bool {
        self.pipeline.len() < self.config.prepare_queue_depth
            && self.op < self.journal_op_max()
            && !self.is_appending_behind()
    }

    /// Whether this replica's requested appends that have not completed reach
    /// `appending_bytes_max` (decision 504), or any are incomplete while the driver reports
    /// storage pressure (decision 505): its disk is behind the group's stream.
    pub(crate) fn is_appending_behind(&self) -> bool {
        let appending = self.journal.appending_bytes();
        (self.storage_pressure && appending > 0)
            || (self.config.appending_bytes_max != 0
                && appending >= self.config.appending_bytes_max)
    }

    /// Promotes parked requests into free prepare slots, re-running the preflight (§5.8).
    pub(crate) fn promote_requests(&mut self, now: Now, out: &mut Outbox) {
        while self.has_prepare_room() {
            let Some(request) = self.requests.pop_front() else {
                break;
            };
            if !self.is_primary() {
                self.requests.clear();
                break;
            }
            let forwarded = self
                .forwards
                .proposals
                .contains_key(&request.header.client.get());
            if self.plane() == Plane::Metadata && !forwarded {
                let operation = Operation::from_byte(request.header.operation)
                    .expect("admitted requests carry a valid operation");
                let client = request.header.client.get();
                // The in-flight check must not count the request itself (it left the queue).
                if self
                    .pipeline
                    .iter()
                    .any(|p| p.header.client.get() == client)
                    || !self.is_caught_up_primary()
                {
                    self.deny(&request, codes::TRANSIENT_NOT_COMMITTED, out);
                    continue;
                }
                if operation != Operation::Register {
                    let verdict = self.clients.check(
                        client,
                        request.header.session.get(),
                        request.header.request.get(),
                        request.header.request_checksum.get(),
                    );
                    if verdict != Verdict::New {
                        self.deny(&request, codes::TRANSIENT_NOT_COMMITTED, out);
                        continue;
                    }
                }
            }
            self.propose(now, request, out);
        }
    }

    // ---- projection (§5.2, §5.3) ------------------------------------------------------------

    pub(crate) fn propose(&mut self, now: Now, request: ClientRequest, out: &mut Outbox) {
        debug_assert!(self.is_primary());
        let operation = Operation::from_byte(request.header.operation)
            .expect("admitted requests carry a valid operation");
        let op = self.op + 1;
        assert!(
            op <= self.journal_op_max(),
            "prepare beyond the journal's room"
        );
        let timestamp = now.realtime_us.max(self.last_timestamp + 1);
        // The frame's bytes: the header's room, then the body, in one buffer that becomes the
        // frame without another copy (decision 261).
        let (operation, frame_bytes) = match self.plane() {
            Plane::Metadata if operation == Operation::Register => {
                // The session's origin: the backup that forwarded it, else this replica.
                let origin = self
                    .forwards
                    .proposals
                    .get(&request.header.client.get())
                    .map_or(self.id, |(origin, _, _)| *origin);
                let body = self.sm.project_register(origin, &request.body);
                (operation, frames::with_header_room(&body))
            }
            Plane::Metadata if operation == Operation::Logout => {
                (operation, frames::with_header_room(&request.body))
            }
            Plane::Metadata => {
                let projection = self.sm.project(operation, &request.body);
                (
                    projection.operation,
                    frames::with_header_room(&projection.body),
                )
            }
            Plane::Partition if operation == Operation::SendMessages => {
                let start = partition::batch_start(&request.body).expect("checked at admission");
                // The request's own buffer becomes the prepare (decision 460).
                let mut bytes = frames::into_header_room(request.body, start);
                let partition_id = u64::from(self.group.fields().partition);
                // Admission verified every message and the batch checksum; the stamp rewrites
                // header fields and the batch checksum only, so the count needs no re-check.
                let count = partition::stamp(
                    &mut bytes[wire::HEADER_SIZE..],
                    partition_id,
                    self.next_offset,
                    timestamp,
                );
                self.next_offset += u64::from(count);
                (operation, bytes)
            }
            Plane::Partition => (operation, frames::with_header_room(&request.body)),
        };
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(wire::Command::Prepare, self.sender());
        header.client = request.header.client;
        header.parent.set(self.last_checksum);
        header.request_checksum = request.header.request_checksum;
        header.op.set(op);
        header.commit.set(self.commit_max);
        header.timestamp.set(timestamp);
        header.request = request.header.request;
        header.operation = operation.byte();
        header.group.set(self.group.0);
        header.user_id = request.header.user_id;
        let frame = frames::finish_in_place(header, frame_bytes);
        let header = *frame.prepare_header().expect("a prepare");

        // Pre-advance, atomically (§5.2).
        self.journal.insert(Entry {
            header,
            frame: Some(frame.clone()),
            durable: false,
            verified: true,
        });
        self.pipeline.push(header);
        self.op = op;
        self.last_checksum = header.frame.checksum.get();
        self.last_timestamp = timestamp;
        if !self.timers.prepare.is_running() {
            self.start_prepare_timer();
        }
        if self.config.memory_ack {
            // Ack level "memory" (decision 73): the primary holds it; its append still runs.
            let _ = self.record_ack(op, header.frame.checksum.get(), self.id, now, out);
        }
        // Forward first, append in parallel; only the PrepareOk claims durability (§5.3).
        if let Some(next) = self.next_hop(self.view) {
            self.send(out, next, frame.clone());
        }
        out.push(Effect::Append { op, frame });
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.ack_before_append {
            let _ = self.record_ack(op, header.frame.checksum.get(), self.id, now, out);
        }
    }

    /// Chain replication next hop (§5.4): skip disconnected peers, stop before the primary.
    pub(crate) fn next_hop(&self, prepare_view: u32) -> Option<ReplicaId> {
        let primary = self.primary_index(prepare_view);
        for k in 1..self.n {
            let candidate = ReplicaId(((self.id.0 as usize + k) % self.n) as u8);
            if candidate == primary {
                return None;
            }
            if self.is_connected(candidate) {
                return Some(candidate);
            }
        }
        None
    }

    // ---- backup: Prepare (§5.5) -------------------------------------------------------------

    pub(crate) fn ignore_prepare(&mut self, header: &PrepareHeader) -> Result<(), Ignored> {
        let operation = Operation::from_byte(header.operation).ok_or(Ignored::Malformed)?;
        let in_plane = match self.plane() {
            Plane::Metadata => operation.is_metadata_plane(),
            Plane::Partition => operation.is_partition(),
        };
        if !in_plane {
            return Err(Ignored::Plane);
        }
        if self.transfer.is_active() {
            return Err(Ignored::Transferring);
        }
        if self.status != Status::Normal {
            return Err(Ignored::Status);
        }
        let view = header.frame.view.get();
        if view > self.view {
            self.observed_newer_view = self.observed_newer_view.max(view);
            return Err(Ignored::ViewNew);
        }
        if view < self.view {
            return Err(Ignored::ViewOld);
        }
        if self.primary_index(self.view) == self.id {
            return Err(Ignored::NotBackup);
        }
        Ok(())
    }

    pub(crate) fn on_prepare(
        &mut self,
        now: Now,
        header: &PrepareHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if let Err(reason) = self.ignore_prepare(header) {
            if reason == Ignored::Transferring
                && self.status == Status::Normal
                && header.frame.view.get() == self.view
                && self.primary_index(self.view) != self.id
            {
                // A transfer installs only below the stream: the replicas after this one
                // still need its prepares (decision 504).
                self.forward_down_chain(header, |r| r.incoming_or_whole(header, body), out);
            }
            return Err(reason);
        }
        self.commit_max = self.commit_max.max(header.commit.get());
        self.prepare_size_recent
            .observe(header.op.get(), header.frame.size.get());
        let commit_min = self.commit_min;
        let result = self.accept_prepare(now, header, body, out);
        self.commit_journal(now, out);
        // A prepare whose commit point let us execute ops was acted on, whatever its op.
        if self.commit_min > commit_min {
            return Ok(());
        }
        result
    }

    fn accept_prepare(
        &mut self,
        now: Now,
        header: &PrepareHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let op = header.op.get();
        let checksum = header.frame.checksum.get();
        if op <= self.commit_min {
            // Already executed here: never forwarded, but re-acked, because a new primary may
            // have started its view with a commit point below ours and needs our ack to
            // commit the op again.
            if self.journal.has(op, checksum) {
                self.send_prepare_ok(op, out);
                return Ok(());
            }
            return Err(Ignored::Committed);
        }
        if let Some(entry) = self.journal.get(op) {
            if entry.checksum() != checksum {
                return Err(Ignored::Diverged);
            }
            if self.plane() == Plane::Partition
                && entry.frame.as_ref().is_some_and(|f| f.body() != body)
            {
                return Err(Ignored::Diverged);
            }
            // The same prepare again: re-forward with the current view, re-ack this op only.
            if let Some(frame) = entry.frame.clone()
                && let Some(next) = self.next_hop(self.view)
            {
                self.send(out, next, frames::restamp(&frame, self.view));
            }
            self.send_prepare_ok(op, out);
            return Ok(());
        }
        if op <= self.op {
            // A hole below the head (after a StartView): fill it only with the view's prepare.
            if self.expected_checksum(op) != Some(checksum) {
                return Err(Ignored::Gap);
            }
            if op > self.journal_op_max() {
                return Err(Ignored::JournalFull);
            }
            if self.is_appending_behind() {
                self.prepares_skipped_behind += 1;
                return Err(Ignored::AppendingBehind);
            }
            self.check_stamp(header, body, false)?;
            let frame = self.incoming_or_whole(header, body);
            if self.journal_prepare(now, frame, out) && self.config.memory_ack {
                self.send_prepare_ok(op, out);
            }
            return Ok(());
        }
        if op != self.op + 1 {
            // Ops below it are missing here (skipped while this backup's appends were behind,
            // or lost): the replicas after this one may hold them, so the chain goes on
            // through this hop (decision 504); repair fills the gap here.
            if op > self.op + 1 {
                self.forward_down_chain(header, |r| r.incoming_or_whole(header, body), out);
            }
            return Err(Ignored::Gap);
        }
        // After a state-transfer install the head's identity is unknown; a prepare of our
        // current view (the primary's own log) anchors it.
        if header.parent.get() != self.last_checksum && !self.transfer.anchor_unknown {
            return Err(Ignored::ChainBreak);
        }
        self.check_stamp(header, body, true)?;
        let frame = self.incoming_or_whole(header, body);
        self.forward_down_chain(header, |_| frame.clone(), out);
        // Primary timestamp window (decision 72): a prepare stamped further ahead of our own
        // clock than the window is forwarded (the next hop judges by its own clock) but neither
        // journaled nor acked, so a primary whose clock runs ahead cannot commit its future
        // without a quorum whose clocks agree. Holes the view describes are filled above.
        if header.timestamp.get()
            > now
                .realtime_us
                .saturating_add(self.config.timestamp_ahead_max_us)
        {
            return Err(Ignored::ClockAhead);
        }
        // Forwarded all the same (the next hop may have room), but neither journaled nor
        // acked: the primary retransmits, or repair fetches it once a checkpoint made room.
        if op > self.journal_op_max() {
            return Err(Ignored::JournalFull);
        }
        // The same for a backup whose disk is behind the stream (decision 504): its backlog
        // stays bounded, and repair fetches the skipped ops once its appends caught up.
        if self.is_appending_behind() {
            self.prepares_skipped_behind += 1;
            return Err(Ignored::AppendingBehind);
        }
        if self.journal_prepare(now, frame, out) && self.config.memory_ack {
            self.send_prepare_ok(op, out);
        }
        Ok(())
    }

    /// Sends a prepare this backup took in to the next hop of the chain (§5.4), whether or not
    /// it journals it: a prepare above a gap, during a transfer or while the appends are
    /// behind goes on too, so the replicas after this one are not cut off from the stream
    /// (decision 504); they judge it against their own logs. The frame is made only when
    /// there is a next hop (a copy unless the step's input is shared).
    fn forward_down_chain(
        &mut self,
        header: &PrepareHeader,
        frame: impl FnOnce(&Self) -> Frame,
        out: &mut Outbox,
    ) {
        if header.op.get() <= self.commit_min {
            return;
        }
        if let Some(next) = self.next_hop(header.frame.view.get()) {
            let frame = frame(self);
            self.send(out, next, frame);
        }
    }

    /// The frame of `header` and `body`: the step's shared incoming frame when they are its
    /// very bytes (same address and length: no copy), else a copy of them.
    fn incoming_or_whole(&self, header: &PrepareHeader, body: &[u8]) -> Frame {
        match &self.incoming {
            Some(frame)
                if frame.len() == wire::HEADER_SIZE + body.len()
                    && frame.body().as_ptr() == body.as_ptr()
                    && frame.header_bytes() == Some(header.bytes()) =>
            {
                frame.clone()
            }
            _ => frames::whole(header, body),
        }
    }

    /// Partition SendMessages re-derivation (§5.6). `live`: the prepare extends the head, so
    /// its stamp must equal our counter; repaired/filled ones carry their embedded stamp.
    pub(crate) fn check_stamp(
        &self,
        header: &PrepareHeader,
        body: &[u8],
        live: bool,
    ) -> Result<(), Ignored> {
        if self.plane() != Plane::Partition || header.operation != Operation::SendMessages.byte() {
            return Ok(());
        }
        let batch = partition::check(body).map_err(|_| Ignored::Stamp)?;
        if batch.partition_id != u64::from(self.group.fields().partition)
            || batch.base_timestamp != header.timestamp.get()
            || (live && batch.base_offset != self.next_offset)
        {
            return Err(Ignored::Stamp);
        }
        Ok(())
    }

    /// Journals a verified prepare (append requested, not yet durable) and advances the head
    /// along the contiguous frontier (§5.5 steps 10-12, §10.4). Returns `false` (nothing done)
    /// when the op does not fit the index or the journal's room (decision 34).
    pub(crate) fn journal_prepare(&mut self, now: Now, frame: Frame, out: &mut Outbox) -> bool {
        let header = *frame.prepare_header().expect("a prepare");
        let op = header.op.get();
        if !self.journal.fits(op) {
            // Too far above the index: only a state transfer (moving the base) can help.
            return false;
        }
        // The journal would refuse it (fatal): callers filter first, this is the backstop.
        debug_assert!(op <= self.journal_op_max(), "journaling beyond the room");
        if op > self.journal_op_max() {
            return false;
        }
        self.view_headers.remove(&op);
        self.prepare_size_recent
            .observe(op, header.frame.size.get());
        if self.plane() == Plane::Partition
            && header.operation == Operation::SendMessages.byte()
            && let Some(batch) = partition::checked(frame.body())
        {
            self.next_offset = self
                .next_offset
                .max(batch.base_offset + u64::from(batch.message_count));
        }
        self.journal.insert(Entry {
            header,
            frame: Some(frame.clone()),
            durable: false,
            verified: true,
        });
        if op == self.op + 1 {
            self.op = op;
            self.last_checksum = header.frame.checksum.get();
            self.transfer.anchor_unknown = false;
        }
        self.last_timestamp = self.last_timestamp.max(header.timestamp.get());
        let learns_anchor =
            self.snapshot_op > 0 && op == self.snapshot_op + 1 && self.snapshot_checksum == 0;
        if learns_anchor {
            // A transferred snapshot's identity, named by the prepare above it (the current
            // primary's log chains onto the committed op): recorded with the checkpoint
            // (decision 52).
            self.snapshot_checksum = header.parent.get();
            self.persist_vsr_state_barrier(out);
        }
        out.push(Effect::Append { op, frame });
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.ack_before_append {
            self.send_prepare_ok_unchecked(op, out);
        }
        let _ = now;
        self.verify_below_op(op, out);
        true
    }

    /// A verified op names its predecessor: verify the unverified entries below it along the
    /// chain; a proven-stale entry is cut together with the unverified run it belongs to.
    pub(crate) fn verify_below_op(&mut self, op: u64, out: &mut Outbox) {
        let Some(mut expected) = self.journal.get(op).map(|e| e.header.parent.get()) else {
            return;
        };
        let mut below = op - 1;
        while below > self.commit_min {
            match self.journal.get_mut(below) {
                Some(e) if e.verified => return,
                Some(e) if e.checksum() == expected => {
                    e.verified = true;
                    expected = e.header.parent.get();
                    below -= 1;
                }
                Some(_) => {
                    self.cut_stale_run(below, out);
                    return;
                }
                None => return,
            }
        }
    }

    /// Cuts the proven-stale entry at `op` together with the unverified run below it that it
    /// belongs to (down to, not including, `commit_min` or the first verified entry).
    pub(crate) fn cut_stale_run(&mut self, op: u64, out: &mut Outbox) {
        let mut from = op;
        while from - 1 > self.commit_min && self.journal.get(from - 1).is_some_and(|e| !e.verified)
        {
            from -= 1;
        }
        self.cut_journal(from, out);
    }

    /// Truncates the journal from `from_op`; ops of the view's log that were journaled there
    /// stay described (no nack in a later DVC) and are repaired again.
    pub(crate) fn cut_journal(&mut self, from_op: u64, out: &mut Outbox) {
        self.truncate_journal(from_op, true, out);
        self.recompute_next_offset();
    }

    /// Truncates the journal from `from_op` (> 0) and keeps what depends on it in step: with
    /// `describe`, the verified ops of the view's log it held stay described (repaired again,
    /// never nacked; a reconcile against a new view's headers describes the new log instead),
    /// the completions of their in-flight appends prove nothing, and the durable prefix ends
    /// below the cut. The raised `held_ceiling` and the described headers are written to the
    /// superblock before the truncation takes effect (the driver orders the `Truncate` after
    /// that write is durable, decision 51), so no later life nacks an op this one acked.
    pub(crate) fn truncate_journal(&mut self, from_op: u64, describe: bool, out: &mut Outbox) {
        let described: Vec<PrepareHeader> = self
            .journal
            .iter_from(from_op)
            .filter(|e| describe && e.verified && e.header.op.get() > self.commit_min)
            .map(|e| e.header)
            .collect();
        self.held_ceiling = self.held_ceiling.max(self.journal.head());
        let stale = self.journal.truncate_from(from_op);
        self.stale_appends.extend(stale);
        self.durable_prefix = self.durable_prefix.min(from_op - 1);
        for header in described {
            self.view_headers.insert(header.op.get(), header);
        }
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.volatile_truncation_ceiling {
            out.push(Effect::Truncate { from_op });
            return;
        }
        self.persist_vsr_state_barrier(out);
        out.push(Effect::Truncate { from_op });
    }

    /// PrepareOk for journaled `op` to the primary of our view, gated by durability of the op
    /// and of `(view, log_view)` (§5.5 step 13, §8.10).
    pub(crate) fn send_prepare_ok(&mut self, op: u64, out: &mut Outbox) {
        if self.status != Status::Normal
            || self.transfer.is_active()
            || self.primary_index(self.view) == self.id
            || !self.is_vsr_durable()
        {
            return;
        }
        // Ack level "memory" (decision 73): holding the prepare is enough.
        if !self
            .journal
            .get(op)
            .is_some_and(|e| e.durable || self.config.memory_ack)
        {
            return;
        }
        self.send_prepare_ok_unchecked(op, out);
    }

    fn send_prepare_ok_unchecked(&mut self, op: u64, out: &mut Outbox) {
        let Some(entry) = self.journal.get(op) else {
            return;
        };
        // Server decision 395: with `acks_carry_applied` the field says how far this replica
        // has applied, which the metadata primary reads; the core never does.
        let commit = if self.config.acks_carry_applied {
            self.commit_min
        } else {
            self.commit_max
        };
        let frame = frames::prepare_ok(self.sender(), &entry.header, commit);
        let primary = self.primary_index(self.view);
        if primary != self.id {
            self.send(out, primary, frame);
        }
    }

    // ---- completions ------------------------------------------------------------------------

    pub(crate) fn on_appended(
        &mut self,
        now: Now,
        op: u64,
        checksum: u128,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        // The completion of an append whose entry a truncation removed: storage executes in
        // order, so it precedes the completion of any re-append of the same prepare.
        if self.take_stale_append(op, checksum) {
            return Err(Ignored::StaleCompletion);
        }
        let entry = self.journal.get(op).ok_or(Ignored::StaleCompletion)?;
        if entry.checksum() != checksum {
            return Err(Ignored::StaleCompletion);
        }
        if !self.journal.set_durable(op) {
            return Err(Ignored::Duplicate);
        }
        self.advance_durable_prefix(out);
        if self.is_primary() {
            if self
                .pipeline
                .get(op)
                .is_some_and(|p| p.checksum() == checksum)
            {
                let _ = self.record_ack(op, checksum, self.id, now, out);
            }
            if self.status == Status::Normal && !self.requests.is_empty() {
                // Requests may have waited for this primary's own appends (decision 504).
                self.promote_requests(now, out);
            }
        } else if self.status == Status::Normal {
            // A memory-ack backup acked when it journaled the prepare (decision 73).
            if op > self.commit_min && !self.config.memory_ack {
                self.send_prepare_ok(op, out);
            }
            self.commit_journal(now, out);
        } else if self.status == Status::ViewChange {
            self.try_start_pending_view(now, out);
        }
        Ok(())
    }

    /// Uses up the record of a truncated entry's append in flight (`stale_appends`) that
    /// this completion, success or failure, belongs to: whether there was one.
    fn take_stale_append(&mut self, op: u64, checksum: u128) -> bool {
        let Some(i) = self.stale_appends.iter().position(|s| *s == (op, checksum)) else {
            return false;
        };
        self.stale_appends.swap_remove(i);
        true
    }

    pub(crate) fn on_append_failed(
        &mut self,
        op: u64,
        checksum: u128,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        // A truncated append's failure is as stale as its success would be: it must use up
        // its record, or the completion of a re-append of the same prepare is taken for it
        // and the entry never turns durable (its bytes then count as appending for good,
        // decision 504; seed 5441238230993581732 stalled so).
        if self.take_stale_append(op, checksum) {
            return Err(Ignored::StaleCompletion);
        }
        if !self.journal.has(op, checksum) {
            return Err(Ignored::StaleCompletion);
        }
        // [design] Always fail-stop. The rollback of §5.2 assumes persist-before-forward;
        // Strand forwards first (§5.3), so a backup may already hold this prepare and reusing
        // the op for another request would fork the log.
        out.push(Effect::Fatal(FatalReason::AppendFailed { op }));
        Ok(())
    }

    pub(crate) fn on_vsr_persisted(
        &mut self,
        now: Now,
        view: u32,
        log_view: u32,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let Some(write) = self.take_write(view, log_view) else {
            return Err(Ignored::StaleCompletion);
        };
        if (view, log_view) < self.durable {
            return Err(Ignored::StaleCompletion);
        }
        self.durable = (view, log_view);
        self.lost_state_durable = write.2;
        self.superblock_written = true;
        self.persist_failures = 0;
        self.timers.persist_retry.stop();
        if self.persisting == Some(write) {
            self.persisting = None;
        }
        if (self.durable, self.lost_state_durable) != ((self.view, self.log_view), self.lost_state)
        {
            // An older write landed; the newer one is (or will be) in flight.
            self.persist_vsr_state(out);
            return Ok(());
        }
        self.send_gated(now, out);
        Ok(())
    }

    // ---- primary: PrepareOk and commit (§5.7) -----------------------------------------------

    pub(crate) fn on_prepare_ok(
        &mut self,
        now: Now,
        header: &PrepareOkHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if !self.is_primary() || self.transfer.is_active() {
            return Err(Ignored::NotPrimary);
        }
        let view = header.frame.view.get();
        if view < self.view {
            return Err(Ignored::ViewOld);
        }
        if view > self.view {
            self.observed_newer_view = self.observed_newer_view.max(view);
            return Err(Ignored::ViewNew);
        }
        let replica = ReplicaId(header.frame.replica);
        if replica == self.id {
            return Err(Ignored::WrongSender);
        }
        let op = header.op.get();
        let checksum = header.prepare_checksum.get();
        if self
            .pipeline
            .get(op)
            .is_none_or(|p| p.checksum() != checksum)
        {
            return Err(Ignored::UnknownPrepare);
        }
        self.record_ack(op, checksum, replica, now, out)
    }

    /// Records an ack; commits the quorum-reached prefix and applies it (§5.7 steps 4-7).
    pub(crate) fn record_ack(
        &mut self,
        op: u64,
        checksum: u128,
        replica: ReplicaId,
        now: Now,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let q = quorum::replication(self.n);
        let entry = self.pipeline.get_mut(op).ok_or(Ignored::UnknownPrepare)?;
        debug_assert_eq!(entry.checksum(), checksum);
        let bit = 1u32 << replica.0;
        if entry.acks & bit != 0 {
            return Err(Ignored::Duplicate);
        }
        entry.acks |= bit;
        if entry.acks.count_ones() as usize >= q {
            entry.quorum = true;
        }
        let before = self.commit_max;
        let mut commit = self.commit_max;
        for p in self.pipeline.iter() {
            if p.op() <= commit {
                continue;
            }
            if p.op() == commit + 1 && p.quorum {
                commit = p.op();
            } else {
                break;
            }
        }
        if commit > before {
            self.commit_max = commit;
            self.pipeline_stalled_ticks = 0;
            self.commit_pipeline(now, out);
        }
        Ok(())
    }

    /// Primary: apply every pipeline head with `op <= commit_max`, reply, promote (§5.8).
    pub(crate) fn commit_pipeline(&mut self, now: Now, out: &mut Outbox) {
        self.apply_pipeline(out);
        self.promote_requests(now, out);
    }

    /// Applies the committed pipeline prefix up to `commit_max`.
    fn apply_pipeline(&mut self, out: &mut Outbox) {
        let mut popped = false;
        while self.commit_min < self.commit_max {
            let op = self.commit_min + 1;
            if self
                .journal
                .get(op)
                .and_then(|e| e.frame.as_ref())
                .is_none()
            {
                out.push(Effect::Fatal(FatalReason::CommittedOpMissing { op }));
                return;
            }
            self.apply_op(op, true, out);
            if self.pipeline.head().is_some_and(|p| p.op() == op) {
                self.pipeline.pop_head();
                popped = true;
            }
        }
        if self.pipeline.is_empty() {
            self.timers.prepare.stop();
        } else if popped {
            self.start_prepare_timer();
        }
        self.trim_frame_cache();
    }

    /// Backup commit walk (§5.8): apply in order up to `commit_max`, stopping at a gap.
    pub(crate) fn commit_journal(&mut self, now: Now, out: &mut Outbox) {
        if self.transfer.is_active() || self.status == Status::Recovering {
            return;
        }
        if self.is_primary() {
            self.commit_pipeline(now, out);
            return;
        }
        let mut progressed = false;
        while self.commit_min < self.commit_max {
            let op = self.commit_min + 1;
            if !self
                .journal
                .get(op)
                .is_some_and(|e| e.verified && e.frame.is_some())
            {
                break;
            }
            self.apply_op(op, false, out);
            progressed = true;
        }
        if progressed {
            self.trim_frame_cache();
            self.repair_progress();
        }
    }

    /// Applies committed `op` (`commit_min + 1`, frame cached) to the client table or the state
    /// machine; the primary replies (§5.8).
    pub(crate) fn apply_op(&mut self, op: u64, reply: bool, out: &mut Outbox) {
        assert_eq!(
            op,
            self.commit_min + 1,
            "commit_min advances one op at a time"
        );
        let entry = self.journal.get(op).expect("applied ops are journaled");
        let header = entry.header;
        let frame = entry.frame.clone().expect("applied ops are cached");
        let body = frame.body();
        let operation = Operation::from_byte(header.operation).unwrap_or(Operation::Reserved);
        let client = header.client.get();
        self.reply_buf.clear();
        match (self.plane(), operation) {
            (Plane::Metadata, Operation::Register) => {
                // A Register ends the client's previous session (a rebind) and, when the
                // table is full, its least recent one's: what the machine keys by them goes.
                if let Some(evicted) = self.clients.register(client, header.user_id.get(), op) {
                    self.sm.end_session(evicted);
                }
                self.sm.end_session(client);
                self.sm.begin_session(&header, body);
                // Success body: [0] user_id, session, protocol version, server version.
                self.reply_buf.extend_from_slice(&0u32.to_le_bytes());
                self.reply_buf
                    .extend_from_slice(&header.user_id.get().to_le_bytes());
                self.reply_buf.extend_from_slice(&op.to_le_bytes());
                self.reply_buf.extend_from_slice(&0x2C00u32.to_le_bytes());
                self.reply_buf.push(6);
                self.reply_buf.extend_from_slice(b"0.11.0");
            }
            (Plane::Metadata, Operation::Logout) => {
                self.clients.logout(client);
                self.sm.end_session(client);
            }
            (_, Operation::Reserved) => {}
            (Plane::Partition, Operation::SendMessages) => {
                if let Some(batch) = partition::checked(body) {
                    self.applied_offset_end = self
                        .applied_offset_end
                        .max(batch.base_offset + u64::from(batch.message_count));
                }
                self.sm.apply_frame(&header, &frame, &mut self.reply_buf);
            }
            _ => {
                self.sm.apply_frame(&header, &frame, &mut self.reply_buf);
            }
        }
        self.commit_min = op;
        let frame_out = (client != 0).then(|| frames::reply_committed(&header, &self.reply_buf));
        if let Some(reply_frame) = frame_out {
            if self.plane() == Plane::Metadata
                && !matches!(operation, Operation::Register | Operation::Logout)
            {
                self.clients.commit(
                    client,
                    header.request.get(),
                    header.request_checksum.get(),
                    op,
                    reply_frame.bytes(),
                );
            }
            if reply && !self.complete_forward(client, op, out) {
                out.push(Effect::Reply {
                    client: ClientId(client),
                    frame: reply_frame,
                });
            }
        }
    }

    // ---- heartbeats and retransmission (§5.9, §6) --------------------------------------------

    /// (Re)starts the prepare timer at its base with `attempts = 0`.
    pub(crate) fn start_prepare_timer(&mut self) {
        self.prepare_attempts = 0;
        self.timers
            .prepare
            .start(self.config.prepare_retransmit_ticks);
    }

    fn on_prepare_timeout(&mut self, now: Now, out: &mut Outbox) {
        if !self.is_primary() || self.pipeline.is_empty() {
            return;
        }
        self.prepare_attempts += 1;
        let base = self.config.prepare_retransmit_ticks;
        let exponent = self
            .prepare_attempts
            .min(PREPARE_RETRANSMIT_BACKOFF_EXPONENT_MAX);
        let delay = (base << exponent).min(16 * base);
        let wait = delay + self.prng.up_to(delay);
        self.timers.prepare.start(wait);

        let view = self.view;
        let mut self_acks = Vec::new();
        for entry in self.pipeline.iter() {
            if entry.quorum || entry.op() <= self.commit_max {
                continue;
            }
            let Some(journaled) = self.journal.get(entry.op()) else {
                continue;
            };
            if entry.acks & (1 << self.id.0) == 0 && journaled.durable {
                self_acks.push((entry.op(), entry.checksum()));
            }
            let Some(frame) = journaled.frame.as_ref() else {
                continue;
            };
            let frame = frames::restamp(frame, view);
            for r in 0..self.n as u8 {
                if r != self.id.0 && entry.acks & (1 << r) == 0 {
                    self.send(out, ReplicaId(r), frame.clone());
                }
            }
        }
        for (op, checksum) in self_acks {
            let _ = self.record_ack(op, checksum, self.id, now, out);
        }
    }

    fn on_commit_message_timeout(&mut self, out: &mut Outbox) {
        if self.primary_index(self.view) != self.id || self.status != Status::Normal {
            return;
        }
        if self.observed_newer_view > self.view {
            self.enter_recovering();
            return;
        }
        self.timers
            .commit_message
            .start(self.config.commit_broadcast_ticks);
        if self.ceded || !self.is_vsr_durable() {
            return;
        }
        // [design] Abdication (TigerBeetle-like, not in the reference): a primary whose
        // pipeline head has waited a whole heartbeat timeout for a quorum stops heartbeating,
        // so backups that can no longer reach it through acks elect a new primary instead of
        // following a primary that cannot commit (a primary that sends but never receives).
        if self.pipeline_stalled_ticks > self.config.heartbeat_timeout_ticks {
            return;
        }
        self.heartbeat_counter += 1;
        let frame = frames::commit(
            self.sender(),
            self.group.0,
            self.commit_min,
            self.heartbeat_counter,
        );
        self.broadcast(out, &frame);
    }

    /// Asks every backup to show how far it has applied (server decision 395): a fresh Commit
    /// heartbeat with this primary's commit point (a backup that holds the ops applies them),
    /// then the prepare at `commit_min` restamped to the view, which a backup holding it
    /// re-acks (§5.5, the re-ack of an executed or held op); with `acks_carry_applied` the
    /// ack's `commit` is the backup's `commit_min`. Only while this replica is a primary in
    /// normal status that would heartbeat now (not ceded, not abdicating, durable); no timer
    /// moves. The node's metadata pump calls it while a reply waits; the simulator never does.
    pub fn solicit_applied(&mut self, out: &mut Outbox) {
        if !self.is_primary()
            || self.transfer.is_active()
            || !self.is_vsr_durable()
            || self.pipeline_stalled_ticks > self.config.heartbeat_timeout_ticks
        {
            return;
        }
        self.heartbeat_counter += 1;
        let commit = frames::commit(
            self.sender(),
            self.group.0,
            self.commit_min,
            self.heartbeat_counter,
        );
        self.broadcast(out, &commit);
        let Some(prepare) = self
            .journal
            .get(self.commit_min)
            .and_then(|e| e.frame.clone())
        else {
            return;
        };
        self.broadcast(out, &frames::restamp(&prepare, self.view));
    }

    fn on_normal_heartbeat_timeout(&mut self, now: Now, out: &mut Outbox) {
        if self.status != Status::Normal || self.is_primary() {
            return;
        }
        if self.observed_newer_view > self.view {
            self.enter_recovering();
            return;
        }
        self.start_view_change_to(now, self.view + 1, out);
    }

    pub(crate) fn on_commit(
        &mut self,
        now: Now,
        header: &CommitHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let view = header.frame.view.get();
        let sender = ReplicaId(header.frame.replica);
        if view > self.view {
            self.observed_newer_view = self.observed_newer_view.max(view);
            return Err(Ignored::ViewNew);
        }
        if self.status != Status::Normal {
            return Err(Ignored::Status);
        }
        if self.primary_index(self.view) == self.id {
            if view < self.view && !self.ceded {
                // A primary of an older view missed our view change: correct it (§5.9).
                self.send_start_view_to(Some(sender), 0, out);
                return Ok(());
            }
            return Err(Ignored::NotBackup);
        }
        if view < self.view {
            return Err(Ignored::ViewOld);
        }
        if sender != self.primary_index(view) {
            return Err(Ignored::WrongSender);
        }
        let counter = header.timestamp_monotonic.get();
        let fresh = (view, counter) > self.heartbeat_accepted;
        if fresh {
            self.heartbeat_accepted = (view, counter);
            self.heartbeat_counter = self.heartbeat_counter.max(counter);
            self.timers
                .normal_heartbeat
                .start(self.config.heartbeat_timeout_ticks);
        }
        if self.transfer.is_active() {
            // It still hears its primary (a transfer outlasting the heartbeat timeout must not
            // start view changes against a healthy group), but neither commits nor repairs
            // until the install.
            return Err(Ignored::Transferring);
        }
        let commit = header.commit.get();
        let advanced = commit > self.commit_max;
        if advanced {
            self.commit_max = commit;
            self.commit_journal(now, out);
        }
        // Behind (the commit point may have come from a prepare): repair from the primary.
        // An open session keeps its own pace.
        if self.commit_min < self.commit_max {
            self.start_repair(self.primary_index(self.view), out);
        }
        // A stale heartbeat that still carried a newer commit point was acted on.
        if fresh || advanced {
            Ok(())
        } else {
            Err(Ignored::StaleHeartbeat)
        }
    }

    /// A solo replica, a fresh group's view-0 primary, or a recovered primary-by-index of a
    /// solo cluster starts leading at boot: re-pipeline the uncommitted suffix (§9.5).
    pub(crate) fn start_view_as_recovered_primary(&mut self, out: &mut Outbox) {
        let _ = out;
        self.pipeline.clear();
        for op in self.commit_min + 1..=self.op {
            if let Some(entry) = self.journal.get(op) {
                let header = entry.header;
                self.pipeline.push(header);
                let p = self.pipeline.get_mut(op).expect("just pushed");
                p.acks |= 1 << self.id.0;
                p.quorum = quorum::replication(self.n) <= 1;
            }
        }
        if !self.pipeline.is_empty() {
            self.start_prepare_timer();
        }
        self.timers
            .commit_message
            .start(self.config.commit_broadcast_ticks);
        if self.n == 1 {
            // At boot nothing is parked, so nothing is proposed (and no time is needed).
            debug_assert!(self.requests.is_empty(), "called at boot only");
            self.commit_max = self.op;
            self.apply_pipeline(out);
        }
    }

    /// Advances the durable prefix and clears `lost_state` once the log of the adopted view is
    /// durably held (decision 28).
    pub(crate) fn advance_durable_prefix(&mut self, out: &mut Outbox) {
        while self
            .journal
            .get(self.durable_prefix + 1)
            .is_some_and(|e| e.durable)
        {
            self.durable_prefix += 1;
        }
        if self.lost_state
            && self.lost_until > 0
            && self.durable_prefix >= self.lost_until
            && self.checkpoint_durable >= self.snapshot_op
        {
            self.lost_state = false;
            self.persist_vsr_state(out);
        }
    }

    /// Partition plane: raise `next_offset` over a recovered SendMessages batch (journal.md §6).
    pub(crate) fn note_recovered_offsets(&mut self, header: &PrepareHeader, body: &[u8]) {
        if header.operation == Operation::SendMessages.byte()
            && let Ok(batch) = partition::check(body)
        {
            self.next_offset = self
                .next_offset
                .max(batch.base_offset + u64::from(batch.message_count));
        }
    }

    /// Answer to an `Effect::Read`: serve pending repair requests with the frame.
    pub(crate) fn on_read(
        &mut self,
        op: u64,
        frame: Option<Frame>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        self.serve_read(op, frame, out)
    }
}

#[cfg(test)]
#[path = "normal_tests.rs"]
mod tests;
