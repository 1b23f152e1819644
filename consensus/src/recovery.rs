//! Recovery after restart (§9): Recovering status, RequestStartView probes, incarnation guard,
//! probe-exhausted election fallback.

use wire::header::RequestStartViewHeader;

use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::Status;

impl<S: StateMachine> Replica<S> {
    /// Enters Recovering: quorum-invisible, probing on the RequestStartView timer (§9.1).
    pub(crate) fn enter_recovering(&mut self) {
        self.status = Status::Recovering;
        self.probe_attempts = 0;
        self.timers.normal_heartbeat.stop();
        self.timers.commit_message.stop();
        self.timers.prepare.stop();
        self.timers
            .request_start_view
            .start(self.config.request_start_view_ticks);
    }

    pub(crate) fn on_request_start_view(
        &mut self,
        header: &RequestStartViewHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }
}
