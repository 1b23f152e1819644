//! View change (§8): StartViewChange, DoViewChange, the primary-elect's merge and repair, and
//! StartView installation, behind the durable-before-send gate (§8.10).

use std::collections::BTreeMap;

use wire::Command;
use wire::header::{
    DoViewChangeHeader, FrameHeader, Layout, PrepareHeader, StartViewChangeHeader, StartViewHeader,
};
use wire::suffix::{Suffix, SuffixEntry, blank_entry};

use crate::constants::SUFFIX_ENTRIES_MAX;
use crate::frames;
use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::merge::{self, Dvc, Merged, Outcome, Slot};
use crate::quorum;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{Frame, Now, ReplicaId, Status};

/// View-change bookkeeping, cleared on every view transition.
#[derive(Debug, Clone, Default)]
pub(crate) struct ViewChangeState {
    /// Bit `r`: StartViewChange for the current view recorded from `r` (own included).
    pub svc_from: u32,
    /// DoViewChanges received by the primary-elect, first one per sender wins.
    pub dvcs: BTreeMap<u8, Dvc>,
    /// Own DoViewChange sent (or recorded, as primary-elect) for this view.
    pub sent_dvc: bool,
    /// The decided log while the primary-elect repairs toward it (§8.7).
    pub decided: Option<Merged>,
}

impl<S: StateMachine> Replica<S> {
    // ---- entering and escalating (§8.2) -----------------------------------------------------

    /// Enters (or escalates to) a view change for `new_view`.
    pub(crate) fn start_view_change_to(&mut self, now: Now, new_view: u32, out: &mut Outbox) {
        assert!(new_view > self.view, "views never regress");
        self.view = new_view;
        self.set_status(Status::ViewChange);
        self.vc = ViewChangeState::default();
        self.vc.svc_from = 1 << self.id.0;
        self.drop_role_work();
        self.persist_vsr_state(out);
        if self.is_vsr_durable() {
            self.broadcast_start_view_change(out);
        }
        self.maybe_send_do_view_change(now, out);
    }

    fn broadcast_start_view_change(&self, out: &mut Outbox) {
        let mut h = StartViewChangeHeader::zeroed();
        h.frame = FrameHeader::new(Command::StartViewChange, self.sender());
        h.group.set(self.group.0);
        let frame = frames::finish(h, &[]);
        self.broadcast(out, &frame);
    }

    /// View-change timers (§6): SVC/DVC retransmit and status escalation.
    pub(crate) fn tick_view_change(&mut self, now: Now, out: &mut Outbox) {
        if self.status != Status::ViewChange {
            self.timers.start_view_change.stop();
            self.timers.do_view_change.stop();
            self.timers.view_change_status.stop();
            return;
        }
        if self.timers.start_view_change.fire() {
            self.timers
                .start_view_change
                .start(self.config.view_change_retransmit_ticks);
            if self.is_vsr_durable() {
                self.broadcast_start_view_change(out);
            }
        }
        if self.timers.do_view_change.fire() {
            self.timers
                .do_view_change
                .start(self.config.view_change_retransmit_ticks);
            if self.vc.sent_dvc && self.vc.decided.is_none() && self.is_vsr_durable() {
                let (frame, _) = self.build_do_view_change();
                self.broadcast(out, &frame);
            }
        }
        if self.timers.view_change_status.fire() {
            self.start_view_change_to(now, self.view + 1, out);
        }
        if self.vc.decided.is_some() {
            self.try_start_pending_view(now, out);
        }
    }

    // ---- StartViewChange (§8.3) -------------------------------------------------------------

    /// What a replica abandons whenever its role ends (entering a view change or Recovering, or
    /// adopting a view): parked client requests, forwarded-session waiters and the repair
    /// session.
    pub(crate) fn drop_role_work(&mut self) {
        self.requests.clear();
        self.cancel_forwards();
        self.repair.session = None;
    }

    /// The filter shared by StartViewChange and DoViewChange (§8.3, §16.2): a Recovering replica
    /// is quorum-invisible; a view below ours, or ours while Normal (a late retransmit), is old;
    /// a newer view is joined before the frame is recorded.
    fn join_view_change(&mut self, now: Now, view: u32, out: &mut Outbox) -> Result<(), Ignored> {
        if self.status == Status::Recovering {
            return Err(Ignored::Status);
        }
        if view < self.view || (view == self.view && self.status == Status::Normal) {
            return Err(Ignored::ViewOld);
        }
        if view > self.view {
            self.start_view_change_to(now, view, out);
        }
        Ok(())
    }

    pub(crate) fn on_start_view_change(
        &mut self,
        now: Now,
        header: &StartViewChangeHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        self.join_view_change(now, header.frame.view.get(), out)?;
        self.vc.svc_from |= 1 << header.frame.replica;
        self.maybe_send_do_view_change(now, out);
        Ok(())
    }

    /// Sends own DVC once SVCs from a view-change quorum (own included) are recorded (the
    /// `Q_vc` rule of §4), evaluated after every change of the SVC set or the view.
    fn maybe_send_do_view_change(&mut self, now: Now, out: &mut Outbox) {
        // A replica that lost acknowledged state never votes (decision 28).
        if self.lost_state
            || self.status != Status::ViewChange
            || self.vc.sent_dvc
            || (self.vc.svc_from.count_ones() as usize) < quorum::view_change(self.n)
            || !self.is_vsr_durable()
        {
            return;
        }
        let (frame, dvc) = self.build_do_view_change();
        self.vc.sent_dvc = true;
        self.broadcast(out, &frame);
        self.timers
            .do_view_change
            .start(self.config.view_change_retransmit_ticks);
        if self.primary_index(self.view) == self.id {
            self.vc.dvcs.entry(self.id.0).or_insert(dvc);
            self.try_merge(now, out);
        }
    }

    /// Own DVC: suffix `max(commit,1) ..= op`, highest first, ≤ 128 entries (§8.4).
    pub(crate) fn build_do_view_change(&self) -> (Frame, Dvc) {
        let op = self.op;
        let commit = self.commit_max.min(op);
        let mut body = Vec::new();
        let mut nack = 0u128;
        let mut present = 0u128;
        let mut slots = BTreeMap::new();
        if op > 0 {
            for (i, o) in (commit.max(1)..=op)
                .rev()
                .take(SUFFIX_ENTRIES_MAX)
                .enumerate()
            {
                if let Some(entry) = self.journal.get(o) {
                    // Present even if unverified: we can serve exactly this prepare, and the
                    // merge counts it only as a copy of the identity it carries.
                    body.extend_from_slice(entry.header.bytes());
                    present |= 1 << i;
                    slots.insert(
                        o,
                        Slot::Held {
                            header: entry.header,
                            present: true,
                        },
                    );
                } else if let Some(header) = self.view_headers.get(&o).copied() {
                    // Described by the view, body not held. Never journaled here (above the
                    // commit point and `held_ceiling`): never acknowledged, so the header
                    // goes with a nack (decision 33).
                    body.extend_from_slice(header.bytes());
                    if o > commit && o > self.held_ceiling {
                        nack |= 1 << i;
                        slots.insert(o, Slot::HeldNack { header });
                    } else {
                        slots.insert(
                            o,
                            Slot::Held {
                                header,
                                present: false,
                            },
                        );
                    }
                } else if let Some(header) = self.described_head().filter(|h| h.op.get() == o) {
                    body.extend_from_slice(header.bytes());
                    slots.insert(
                        o,
                        Slot::Held {
                            header,
                            present: false,
                        },
                    );
                } else {
                    body.extend_from_slice(blank_entry(o).bytes());
                    let nacked = o > commit;
                    if nacked {
                        nack |= 1 << i;
                    }
                    slots.insert(o, Slot::Blank { nack: nacked });
                }
            }
        }
        let mut h = DoViewChangeHeader::zeroed();
        h.frame = FrameHeader::new(Command::DoViewChange, self.sender());
        h.op.set(op);
        h.commit.set(commit);
        h.group.set(self.group.0);
        h.log_view.set(self.log_view);
        h.nack_bitset.set(nack);
        h.present_bitset.set(present);
        let frame = frames::finish(h, &body);
        let dvc = Dvc {
            replica: self.id.0,
            log_view: self.log_view,
            op,
            commit,
            slots,
        };
        (frame, dvc)
    }

    // ---- DoViewChange (§8.5) ----------------------------------------------------------------

    pub(crate) fn on_do_view_change(
        &mut self,
        now: Now,
        header: &DoViewChangeHeader,
        suffix: &Suffix<'_>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        self.join_view_change(now, header.frame.view.get(), out)?;
        if self.primary_index(self.view) != self.id {
            return Ok(());
        }
        if self.vc.decided.is_some() {
            return Err(Ignored::Duplicate);
        }
        let replica = header.frame.replica;
        if self.vc.dvcs.contains_key(&replica) {
            return Err(Ignored::Duplicate);
        }
        let nack = header.nack_bitset.get();
        let present = header.present_bitset.get();
        let mut slots = BTreeMap::new();
        for (i, entry) in suffix.entries().enumerate() {
            let slot = match entry {
                SuffixEntry::Held(h) if nack & (1 << i) != 0 && present & (1 << i) == 0 => {
                    Slot::HeldNack { header: *h }
                }
                SuffixEntry::Held(h) => Slot::Held {
                    header: *h,
                    present: present & (1 << i) != 0,
                },
                SuffixEntry::Blank { .. } => Slot::Blank {
                    nack: nack & (1 << i) != 0,
                },
            };
            slots.insert(entry.op(), slot);
        }
        self.vc.dvcs.insert(
            replica,
            Dvc {
                replica,
                log_view: header.log_view.get(),
                op: header.op.get(),
                commit: header.commit.get(),
                slots,
            },
        );
        if !self.vc.dvcs.contains_key(&self.id.0) && !self.lost_state {
            // Record our own DVC (without broadcasting it if the trigger has not fired).
            let (_, dvc) = self.build_do_view_change();
            self.vc.dvcs.insert(self.id.0, dvc);
        }
        self.try_merge(now, out);
        Ok(())
    }

    fn nack_quorum(&self) -> usize {
        let q = quorum::nack(self.n);
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.loosen_nack_quorum {
            return (q - 1).max(1);
        }
        q
    }

    fn try_merge(&mut self, now: Now, out: &mut Outbox) {
        if self.vc.decided.is_some() || self.vc.dvcs.len() < quorum::view_change(self.n) {
            return;
        }
        let dvcs: Vec<Dvc> = self.vc.dvcs.values().cloned().collect();
        match merge::merge(&dvcs, self.n, self.nack_quorum()) {
            Outcome::Ready(merged) => {
                if merged.op_head - merged.commit_max > self.config.prepare_queue_depth as u64 {
                    return;
                }
                self.on_merged(now, merged, out);
            }
            Outcome::AwaitingRepair | Outcome::Deadlocked => {}
        }
    }

    /// §8.7 steps 1-4: latch, reconcile, then repair or start.
    fn on_merged(&mut self, now: Now, merged: Merged, out: &mut Outbox) {
        self.commit_max = self.commit_max.max(merged.commit_max);
        self.pipeline.clear();
        // The merged log is this view's log (decisions 50, 51): a cut it proves is made durable
        // under `log_view = view` with the merged headers. With the old log_view, a crash
        // before the view starts would leave the old view's log_view vouching for a log that
        // lost an op acknowledged in that view (fresh seed 6294941059973890987, n = 2).
        self.log_view = self.view;
        self.view_headers = merged
            .headers
            .range(self.commit_min + 1..)
            .map(|(op, h)| (*op, *h))
            .collect();
        self.reconcile(&merged.headers, merged.op_head, out);
        self.view_headers = merged
            .headers
            .iter()
            .filter(|(op, _)| **op > self.commit_min && self.journal.get(**op).is_none())
            .map(|(op, h)| (*op, *h))
            .collect();
        self.op = merged.op_head;
        if let Some(head) = merged.headers.get(&merged.op_head) {
            self.last_checksum = head.frame.checksum.get();
            self.head_header = Some(*head);
        } else if let Some(checksum) = self.checksum_at(merged.op_head) {
            self.last_checksum = checksum;
        }
        self.persist_vsr_state(out);
        self.vc.decided = Some(merged);
        self.timers.do_view_change.stop();
        self.try_start_pending_view(now, out);
    }

    /// The first op in `(commit_min, op_head]` the journal lacks durably, if any.
    fn first_uncovered(&self, op_head: u64) -> Option<u64> {
        if op_head.saturating_sub(self.commit_min) > crate::constants::SCAN_MAX {
            return Some(self.commit_min + 1);
        }
        (self.commit_min + 1..=op_head).find(|op| {
            !self
                .journal
                .get(*op)
                .is_some_and(|e| e.durable && e.verified)
        })
    }

    /// Starts the decided view once every op is journaled durably, else (re)drives repair.
    pub(crate) fn try_start_pending_view(&mut self, now: Now, out: &mut Outbox) {
        let Some(merged) = self.vc.decided.as_ref() else {
            return;
        };
        if self.status != Status::ViewChange {
            return;
        }
        let op_head = merged.op_head;
        match self.first_uncovered(op_head) {
            // Beyond the journal's room (decision 34): apply what is committed so a checkpoint
            // makes room; `Checkpointed` drives this again.
            Some(op) if op > self.journal_op_max() => self.commit_journal(now, out),
            // Missing, not durable yet, or unverified (below a hole the repair window finds).
            Some(op) => {
                if let Some(peer) = self.repair_source(op) {
                    self.start_repair(peer, out);
                }
            }
            // The next prepare chains onto the head: its identity must be known.
            None if merged.headers.contains_key(&op_head)
                || self.checksum_at(op_head).is_some() =>
            {
                self.start_pending_view(now, out)
            }
            None => {}
        }
    }

    /// A peer whose DVC offered the body of `op`, highest log_view first; else the peer with
    /// the highest reported commit.
    fn repair_source(&self, op: u64) -> Option<ReplicaId> {
        let merged = self.vc.decided.as_ref()?;
        let mut candidates: Vec<&Dvc> = self
            .vc
            .dvcs
            .values()
            .filter(|d| d.replica != self.id.0)
            .collect();
        candidates.sort_by_key(|d| (std::cmp::Reverse(d.log_view), std::cmp::Reverse(d.commit)));
        if let Some(mask) = merged.sources.get(&op)
            && let Some(d) = candidates.iter().find(|d| mask & (1 << d.replica) != 0)
        {
            return Some(ReplicaId(d.replica));
        }
        candidates
            .iter()
            .max_by_key(|d| (d.commit, d.log_view))
            .map(|d| ReplicaId(d.replica))
    }

    /// §8.7 step 5.
    fn start_pending_view(&mut self, now: Now, out: &mut Outbox) {
        let merged = self.vc.decided.take().expect("a decided log");
        self.set_status(Status::Normal);
        self.ceded = false;
        self.log_view = self.view;
        self.op = merged.op_head;
        // Known: `try_start_pending_view` checked it.
        if let Some(checksum) = merged
            .headers
            .get(&self.op)
            .map(|h| h.frame.checksum.get())
            .or_else(|| self.checksum_at(self.op))
        {
            self.last_checksum = checksum;
            self.transfer.anchor_unknown = false;
        }
        if let Some(head) = merged.headers.get(&self.op) {
            self.head_header = Some(*head);
        }
        if let Some(head) = self.journal.get(self.op) {
            self.last_timestamp = self.last_timestamp.max(head.header.timestamp.get());
        }
        self.view_headers.clear();
        self.vc = ViewChangeState::default();
        self.repair.session = None;
        self.timers.normal_heartbeat.stop();
        self.timers
            .commit_message
            .start(self.config.commit_broadcast_ticks);
        // Local actions first: rebuild the pipeline (pre-acked by self) and commit.
        self.pipeline.clear();
        for op in self.commit_max + 1..=self.op {
            let Some(entry) = self.journal.get(op) else {
                break;
            };
            let header = entry.header;
            self.pipeline.push(header);
            let p = self.pipeline.get_mut(op).expect("just pushed");
            p.acks |= 1 << self.id.0;
            p.quorum = quorum::replication(self.n) <= 1;
        }
        if !self.pipeline.is_empty() {
            self.start_prepare_timer();
        }
        self.commit_pipeline(now, out);
        self.persist_vsr_state(out);
        if self.is_vsr_durable() {
            self.send_start_view_to(None, 0, out);
        }
    }

    /// StartView from a Normal primary whose view is durable: to `to`, or broadcast.
    /// Strand always carries the suffix `max(commit_max,1) ..= op` (≤ 128, highest first), so
    /// every adopter can verify its log (a \[design\] choice; the wire allows an empty body).
    pub(crate) fn send_start_view_to(
        &mut self,
        to: Option<ReplicaId>,
        incarnation: u128,
        out: &mut Outbox,
    ) {
        if !self.is_primary() || !self.is_vsr_durable() || self.log_view != self.view {
            self.persist_vsr_state(out);
            return;
        }
        let mut body = Vec::new();
        let low = self.commit_max.max(1);
        if self.op >= low {
            for o in (low..=self.op).rev().take(SUFFIX_ENTRIES_MAX) {
                match self.journal.get(o) {
                    Some(entry) => body.extend_from_slice(entry.header.bytes()),
                    // The head is committed and not journaled here: its view-described
                    // header still lets a lagging replica adopt the view (decision 32).
                    None => match self.described_head().filter(|h| h.op.get() == o) {
                        Some(h) => body.extend_from_slice(h.bytes()),
                        None => break,
                    },
                }
            }
        }
        let mut h = StartViewHeader::zeroed();
        h.frame = FrameHeader::new(Command::StartView, self.sender());
        h.op.set(self.op);
        h.commit.set(self.commit_max);
        h.group.set(self.group.0);
        h.incarnation.set(incarnation);
        let frame = frames::finish(h, &body);
        match to {
            Some(to) => self.send(out, to, frame),
            None => self.broadcast(out, &frame),
        }
    }

    // ---- StartView (§8.8) -------------------------------------------------------------------

    pub(crate) fn ignore_start_view(
        &self,
        header: &StartViewHeader,
        suffix: Option<&Suffix<'_>>,
    ) -> Result<(), Ignored> {
        let view = header.frame.view.get();
        let op = header.op.get();
        let sender = ReplicaId(header.frame.replica);
        if sender != self.primary_index(view) || sender == self.id {
            return Err(Ignored::WrongSender);
        }
        if view < self.view {
            return Err(Ignored::ViewOld);
        }
        let incarnation = header.incarnation.get();
        if self.status == Status::Recovering
            && self.incarnation != 0
            && incarnation != 0
            && incarnation != self.incarnation
            && view <= self.view
            && op < self.op
        {
            return Err(Ignored::StartViewRejected);
        }
        if view == self.log_view && op < self.commit_min {
            return Err(Ignored::StartViewRejected);
        }
        // Never truncate or un-acknowledge what we acked in the current log_view (§17.11), in
        // any status: every prepare of that view came from its primary, so an announcement of
        // the same view with a lower head is an old one (delayed broadcast or probe answer).
        if view == self.log_view && op < self.op {
            return Err(Ignored::StartViewRejected);
        }
        let empty = suffix.is_none_or(|s| s.is_empty());
        if empty && op > self.commit_min {
            // Strand primaries always carry the suffix; without it our log cannot be verified.
            return Err(Ignored::StartViewRejected);
        }
        if let Some(s) = suffix {
            if !s.is_empty() && s.head_op() != op {
                return Err(Ignored::Malformed);
            }
            // The head must be described so the next prepare can chain onto it.
            if !s.is_empty() && !matches!(s.entries().next(), Some(SuffixEntry::Held(_))) {
                return Err(Ignored::Malformed);
            }
        }
        // A lost-state replica may have voted for a newer view in a life it forgot: it adopts
        // only a view at least as new as what a quorum of peers reports (decision 61). Checked
        // last, so an otherwise rejected answer over a committed log still starts a transfer
        // (committed state is the same in every view; installing it acknowledges nothing).
        if self.lost_state && self.learned_view().is_none_or(|learned| view < learned) {
            return Err(Ignored::ViewUnlearned);
        }
        Ok(())
    }

    /// A Recovering replica behind a primary whose journal no longer holds its own head (the
    /// primary's state came by transfer, or its journal was compacted) gets a StartView with no
    /// suffix: nothing in it can be verified, so it is rejected. When the whole announced log
    /// is committed (`op <= commit`), the replica catches up from below by a state transfer
    /// from that primary while staying Recovering (quorum-invisible); once installed, the
    /// next probe answer is at or below its `commit_min` and is adopted (decision 32).
    fn maybe_catch_up_by_transfer(
        &mut self,
        header: &StartViewHeader,
        suffix: Option<&Suffix<'_>>,
        rejected: Ignored,
        out: &mut Outbox,
    ) {
        let op = header.op.get();
        if rejected == Ignored::StartViewRejected
            && self.status == Status::Recovering
            && suffix.is_none_or(|s| s.is_empty())
            && op > self.commit_min
            && op <= header.commit.get()
            && header.frame.view.get() >= self.view
        {
            self.start_state_transfer(ReplicaId(header.frame.replica), out);
        }
    }

    pub(crate) fn on_start_view(
        &mut self,
        now: Now,
        header: &StartViewHeader,
        suffix: Option<&Suffix<'_>>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if let Err(e) = self.ignore_start_view(header, suffix) {
            self.maybe_catch_up_by_transfer(header, suffix, e, out);
            return Err(e);
        }
        let view = header.frame.view.get();
        let op = header.op.get();
        let primary = ReplicaId(header.frame.replica);
        let mut headers = BTreeMap::new();
        if let Some(s) = suffix {
            for entry in s.entries() {
                if let SuffixEntry::Held(h) = entry {
                    headers.insert(h.op.get(), *h);
                }
            }
        }
        self.timers.commit_message.stop();
        self.timers.prepare.stop();
        self.view = view;
        self.log_view = view;
        self.set_status(Status::Normal);
        self.ceded = false;
        self.commit_max = self.commit_max.max(header.commit.get());
        self.vc = ViewChangeState::default();
        self.pipeline.clear();
        self.drop_role_work();
        // The new view's headers before reconciling: a truncation's barrier write records them
        // with the new log_view (decision 50).
        self.view_headers = headers
            .range(self.commit_min + 1..)
            .map(|(o, h)| (*o, *h))
            .collect();
        self.reconcile(&headers, op.max(self.commit_min), out);
        if op > self.commit_min {
            self.op = op;
            self.last_checksum = headers
                .get(&op)
                .map(|h| h.frame.checksum.get())
                .expect("checked: the head is described");
            self.head_header = headers.get(&op).copied();
        } else if self.op > self.commit_min {
            // The view's log ends at or below our commit point: a head above it that only an
            // older view described (the journal holds nothing there after reconciling) is not
            // the view's (decision 33).
            self.op = self.commit_min;
            if let Some(h) = headers.get(&self.op) {
                self.last_checksum = h.frame.checksum.get();
                self.head_header = Some(*h);
            } else if let Some(checksum) = self.checksum_at(self.op) {
                self.last_checksum = checksum;
            } else {
                self.transfer.anchor_unknown = true;
            }
        }
        for h in headers.values() {
            self.last_timestamp = self.last_timestamp.max(h.timestamp.get());
        }
        self.view_headers = headers
            .into_iter()
            .filter(|(o, _)| *o > self.commit_min && self.journal.get(*o).is_none())
            .collect();
        let ticks = self.config.heartbeat_timeout_ticks;
        self.timers.normal_heartbeat.start(ticks);
        if self.lost_state {
            self.lost_until = self.lost_until.max(op);
            self.advance_durable_prefix(out);
        }
        self.persist_vsr_state(out);
        if self.is_vsr_durable() {
            self.send_gated(now, out);
        }
        self.commit_journal(now, out);
        if self.commit_min < self.commit_max || self.has_holes() {
            self.start_repair(primary, out);
        }
        Ok(())
    }

    /// Reconciles the journal against a view's headers (§8.9, strengthened): every entry in
    /// `(commit_min, ..]` must be the view's prepare at its op, verified either directly against
    /// `headers` or through the hash chain from the lowest described op downward; entries above
    /// `op_head` are relics. Everything from the lowest entry that fails is truncated (the
    /// truncated ops in the view's window stay described by `view_headers`, so a later DVC
    /// never nacks them).
    pub(crate) fn reconcile(
        &mut self,
        headers: &BTreeMap<u64, PrepareHeader>,
        op_head: u64,
        out: &mut Outbox,
    ) {
        let top = self.journal.head().max(op_head);
        let mut cut: Option<u64> = None;
        let mut expected: Option<u128> = None;
        let mut op = top;
        while op > self.commit_min {
            if op > op_head {
                if self.journal.get(op).is_some() {
                    cut = Some(op);
                }
                op -= 1;
                continue;
            }
            let described = headers.get(&op);
            let want = described.map(|h| h.frame.checksum.get()).or(expected);
            match self.journal.get_mut(op) {
                Some(e) if Some(e.checksum()) == want => {
                    e.verified = true;
                    expected = Some(e.header.parent.get());
                }
                Some(_) if want.is_some() => {
                    // Proven stale: another prepare is the view's at this op.
                    cut = Some(op);
                    expected = described.map(|h| h.parent.get());
                }
                Some(e) => {
                    // Below a hole: unknown for now, kept but never applied until the chain
                    // from above verifies it (cutting it would also cut acked entries above).
                    e.verified = false;
                    expected = None;
                }
                None => expected = described.map(|h| h.parent.get()),
            }
            op -= 1;
        }
        // Recovered ops the view discarded can never re-commit: the barrier follows the log.
        self.recovery_barrier = self.recovery_barrier.min(op_head.max(self.commit_min));
        // A held-but-faulty op above the view's log (decision 62) lives on the disk only: the
        // driver's truncation removes it there.
        if self.faulty_top > op_head.max(self.commit_min) {
            let from = op_head.max(self.commit_min) + 1;
            cut = Some(cut.map_or(from, |c| c.min(from)));
            self.faulty_top = 0;
        }
        if let Some(from_op) = cut {
            self.truncate_journal(from_op, false, out);
            if self.op >= from_op {
                self.op = self.journal.head().max(self.commit_min);
                match self.checksum_at(self.op) {
                    Some(checksum) => self.last_checksum = checksum,
                    None => self.transfer.anchor_unknown = true,
                }
            }
            self.recompute_next_offset();
        }
    }

    /// Partition plane: after a truncation, the next offset is the end of the highest journaled
    /// SendMessages batch (never below what was already applied).
    pub(crate) fn recompute_next_offset(&mut self) {
        if self.plane() != crate::types::Plane::Partition {
            return;
        }
        let mut next = self.applied_offset_end;
        for entry in self.journal.iter_from(self.commit_min + 1) {
            if entry.header.operation == wire::Operation::SendMessages.byte()
                && let Some(frame) = entry.frame.as_ref()
                && let Ok(batch) = crate::partition::check(frame.body())
            {
                next = next.max(batch.base_offset + u64::from(batch.message_count));
            }
        }
        self.next_offset = next;
    }

    /// Sends what the durable gate withheld, now that `(view, log_view)` is durable (§8.10).
    pub(crate) fn send_gated(&mut self, now: Now, out: &mut Outbox) {
        match self.status {
            Status::ViewChange => {
                self.broadcast_start_view_change(out);
                if self.vc.sent_dvc && self.vc.decided.is_none() {
                    let (frame, _) = self.build_do_view_change();
                    self.broadcast(out, &frame);
                } else {
                    self.maybe_send_do_view_change(now, out);
                }
            }
            Status::Normal if self.is_primary() => self.send_start_view_to(None, 0, out),
            Status::Normal => {
                let ops: Vec<u64> = self
                    .journal
                    .iter_from(self.commit_min + 1)
                    .map(|e| e.header.op.get())
                    .collect();
                for op in ops {
                    self.send_prepare_ok(op, out);
                }
            }
            Status::Recovering => {}
        }
    }

    /// Whether any op in `(commit_min, op]` is missing from the journal.
    pub(crate) fn has_holes(&self) -> bool {
        self.journal.contiguous_from(self.commit_min + 1) < self.op
    }

    /// The identity the current view's log has at `op`, if known: described by the view's
    /// headers, the head, or the parent of the journaled (verified) op above.
    pub(crate) fn expected_checksum(&self, op: u64) -> Option<u128> {
        if let Some(h) = self.view_headers.get(&op) {
            return Some(h.frame.checksum.get());
        }
        if op == self.op {
            return Some(self.last_checksum);
        }
        if let Some(above) = self.journal.get(op + 1).filter(|e| e.verified) {
            return Some(above.header.parent.get());
        }
        self.view_headers.get(&(op + 1)).map(|h| h.parent.get())
    }
}

#[cfg(test)]
#[path = "view_change_tests.rs"]
mod tests;
