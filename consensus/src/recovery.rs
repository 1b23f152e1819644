//! Recovery after restart (§9): Recovering status, RequestStartView probes, incarnation guard,
//! probe-exhausted election fallback, and catch-up instead of election (§9.4).

use wire::Command;
use wire::header::{FrameHeader, Layout, RequestStartViewHeader};

use crate::frames;
use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{ReplicaId, Status};

impl<S: StateMachine> Replica<S> {
    /// Enters Recovering: quorum-invisible, probing on the RequestStartView timer (§9.1, §9.4).
    /// Nothing is sent now; the first probe leaves on the first timer firing.
    pub(crate) fn enter_recovering(&mut self) {
        self.status = Status::Recovering;
        self.probe_attempts = 0;
        self.pipeline.clear();
        self.leave_role();
        self.timers.start_view_change.stop();
        self.timers.do_view_change.stop();
        self.timers.view_change_status.stop();
        self.timers
            .request_start_view
            .start(self.config.request_start_view_ticks);
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
    pub(crate) fn on_request_start_view_timeout(&mut self, out: &mut Outbox) {
        match self.status {
            Status::Recovering => {
                self.probe_attempts += 1;
                if self.probe_attempts >= self.config.view_probe_attempts_max && !self.lost_state {
                    self.transfer.abandon();
                    self.start_view_change_to(self.view + 1, out);
                    return;
                }
                self.timers
                    .request_start_view
                    .start(self.config.request_start_view_ticks);
                self.broadcast_request_start_view(out);
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

    /// Responder rules of §9.2.
    pub(crate) fn on_request_start_view(
        &mut self,
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
                self.start_view_change_to(self.view + 1, out);
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

#[cfg(test)]
mod lost_state_tests {
    use crate::io::{Effect, Outbox, Recovered};
    use crate::test_support::*;
    use crate::types::Status;

    #[test]
    fn an_empty_start_view_over_a_committed_log_starts_a_transfer() {
        // Decision 32: a primary whose journal lacks its committed head answers with no suffix;
        // the wiped replica cannot verify it, stays Recovering and catches up by transfer.
        let mut out = Outbox::new();
        let mut b = crate::Replica::new(
            raw(3, 1).validate().unwrap(),
            Recovered::wiped(5),
            crate::DigestStateMachine::default(),
            &mut out,
        );
        persisted(&mut b);
        let (result, effects) = feed(&mut b, 0, &start_view(0, 0, 16, 16, &[]));
        assert_eq!(result, Err(crate::Ignored::StartViewRejected));
        assert_eq!(b.status(), Status::Recovering);
        assert!(b.lost_state);
        assert!(b.transfer.is_active());
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::Send { to, frame } if to.0 == 0
                && frame.bytes()[60] == wire::Command::RequestStateTransfer.byte()
        )));
        // An uncommitted head without a suffix is still refused, with no transfer.
        let mut out = Outbox::new();
        let mut c = crate::Replica::new(
            raw(3, 1).validate().unwrap(),
            Recovered::wiped(5),
            crate::DigestStateMachine::default(),
            &mut out,
        );
        persisted(&mut c);
        let (result, _) = feed(&mut c, 0, &start_view(0, 0, 16, 15, &[]));
        assert_eq!(result, Err(crate::Ignored::StartViewRejected));
        assert!(!c.transfer.is_active());
    }

    #[test]
    fn a_wiped_replica_probes_forever_and_never_elects() {
        let mut out = Outbox::new();
        let mut b = crate::Replica::new(
            raw(3, 1).validate().unwrap(),
            Recovered::wiped(5),
            crate::DigestStateMachine::default(),
            &mut out,
        );
        assert_eq!(b.status(), Status::Recovering);
        persisted(&mut b);
        for _ in 0..20 {
            let effects = tick_until_effects(&mut b, 100);
            assert_eq!(effects, broadcast(3, 1, &request_start_view(1, 0, 5)));
        }
        assert_eq!(b.status(), Status::Recovering);
        // Adopting a view is not enough: the flag goes once the view's log is durable here.
        let c = chain(0, 0, 1);
        let (result, _) = feed(&mut b, 0, &start_view(0, 0, 1, 0, &c));
        assert_eq!(result, Ok(()));
        assert!(b.lost_state);
        let _ = feed(&mut b, 0, &c[0]);
        let h = c[0].prepare_header().unwrap();
        let (_, effects) = input(
            &mut b,
            crate::io::Input::Done(crate::io::Completion::Appended {
                op: 1,
                checksum: h.frame.checksum.get(),
            }),
        );
        assert!(!b.lost_state);
        assert!(effects.contains(&Effect::PersistVsrState(crate::VsrState {
            view: 0,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
        })));
    }
}
