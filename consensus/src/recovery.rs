//! Recovery after restart (§9): Recovering status, RequestStartView probes, incarnation guard,
//! probe-exhausted election fallback, and catch-up instead of election (§9.4).

use wire::Command;
use wire::header::{FrameHeader, Layout, RequestPreparesHeader, RequestStartViewHeader};

use crate::frames;
use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{Now, ReplicaId, Status};

impl<S: StateMachine> Replica<S> {
    /// Enters Recovering: quorum-invisible, probing on the RequestStartView timer (§9.1, §9.4).
    /// Nothing is sent now; the first probe leaves on the first timer firing.
    pub(crate) fn enter_recovering(&mut self) {
        self.set_status(Status::Recovering);
        self.probe_attempts = 0;
        self.pipeline.clear();
        self.drop_role_work();
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.recover_without_probe {
            self.timers.request_start_view.stop();
        }
    }

    fn broadcast_request_start_view(&self, out: &mut Outbox) {
        let mut h = RequestStartViewHeader::zeroed();
        h.frame = FrameHeader::new(Command::RequestStartView, self.sender());
        h.group.set(self.group.0);
        h.incarnation.set(self.incarnation);
        let frame = frames::finish(h, &[]);
        self.broadcast(out, &frame);
    }

    /// The probe timer (§6): Recovering probes, and elects at `view_probe_attempts_max`;
    /// a ViewChange backup probes to recover a lost StartView cheaply.
    pub(crate) fn on_request_start_view_timeout(&mut self, now: Now, out: &mut Outbox) {
        match self.status {
            Status::Recovering => {
                self.probe_attempts += 1;
                // A lost-state replica never elects, except a memory-ack group's (decision 73)
                // and one whose view is above the view a quorum of peers reports (decision
                // 497): its superblock holds a view the others never reached (no primary of
                // that view answers, and the lower view's StartView is refused as old), and
                // its StartViewChange moves them past it; it still never sends a
                // DoViewChange, so it casts no vote on the log.
                let ahead = self
                    .learned_view()
                    .is_some_and(|learned| learned < self.view);
                if self.probe_attempts >= self.config.view_probe_attempts_max
                    && (!self.lost_state || self.config.memory_ack || ahead)
                {
                    self.transfer.abandon();
                    self.start_view_change_to(now, self.view + 1, out);
                    return;
                }
                self.timers
                    .request_start_view
                    .start(self.config.request_start_view_ticks);
                self.broadcast_request_start_view(out);
                if self.lost_state && self.learned_view().is_none() {
                    self.probe_peer_views(out);
                }
            }
            Status::ViewChange if self.primary_index(self.view) != self.id => {
                self.timers
                    .request_start_view
                    .start(self.config.request_start_view_ticks);
                self.broadcast_request_start_view(out);
            }
            _ => {}
        }
    }

    /// A lost-state replica that has not learned the current view (decision 61) asks every
    /// peer that has not reported one yet for a repair range beyond any log
    /// (`RequestPrepares` of op `u64::MAX` alone): a Normal or ViewChange peer answers
    /// `RepairDone` stamped with its own view, which counts as its report. Only the primary
    /// answers RequestStartView (§9.2), so in an idle group the backups would otherwise never
    /// send the lost replica anything. The answer's nonce matches no repair session.
    fn probe_peer_views(&mut self, out: &mut Outbox) {
        for r in 0..self.n as u8 {
            if r == self.id.0 || self.view_reports.contains_key(&r) {
                continue;
            }
            let mut h = RequestPreparesHeader::zeroed();
            h.frame = FrameHeader::new(Command::RequestPrepares, self.sender());
            h.nonce.set(self.prng.nonce());
            h.from_op.set(u64::MAX);
            h.to_op.set(u64::MAX);
            h.group.set(self.group.0);
            let frame = frames::finish(h, &[]);
            self.send(out, ReplicaId(r), frame);
        }
    }

    /// Responder rules of §9.2.
    pub(crate) fn on_request_start_view(
        &mut self,
        now: Now,
        header: &RequestStartViewHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        if self.status != Status::Normal {
            return Err(Ignored::Status);
        }
        let prober = ReplicaId(header.frame.replica);
        let view = header.frame.view.get();
        if prober == self.primary_index(self.view) {
            if view == self.view {
                // The primary itself lost its state or left the view: elect.
                self.start_view_change_to(now, self.view + 1, out);
                return Ok(());
            }
            return Err(Ignored::ViewOld);
        }
        if !self.is_primary() || self.log_view != self.view {
            return Err(Ignored::NotPrimary);
        }
        self.send_start_view_to(Some(prober), header.incarnation.get(), out);
        Ok(())
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
