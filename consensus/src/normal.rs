//! Normal operation (§5): admission, prepares, chain replication, PrepareOk, commit, apply,
//! reply, Commit heartbeats and prepare retransmission.

use wire::header::{CommitHeader, PrepareHeader, PrepareOkHeader};

use crate::ignored::Ignored;
use crate::io::{ClientRequest, Outbox};
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{Frame, Now};

impl<S: StateMachine> Replica<S> {
    pub(crate) fn on_tick(&mut self, now: Now, out: &mut Outbox) {
        let _ = (now, out);
    }

    pub(crate) fn on_request(
        &mut self,
        now: Now,
        request: ClientRequest,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, request, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_prepare(
        &mut self,
        now: Now,
        header: &PrepareHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, header, body, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_prepare_ok(
        &mut self,
        now: Now,
        header: &PrepareOkHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_commit(
        &mut self,
        now: Now,
        header: &CommitHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_appended(
        &mut self,
        now: Now,
        op: u64,
        checksum: u128,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, op, checksum, out);
        Err(Ignored::StaleCompletion)
    }

    pub(crate) fn on_append_failed(
        &mut self,
        op: u64,
        checksum: u128,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (op, checksum, out);
        Err(Ignored::StaleCompletion)
    }

    pub(crate) fn on_vsr_persisted(
        &mut self,
        view: u32,
        log_view: u32,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = out;
        if (view, log_view) < self.durable {
            return Err(Ignored::StaleCompletion);
        }
        self.durable = (view, log_view);
        if self.persisting == Some((view, log_view)) {
            self.persisting = None;
        }
        Ok(())
    }

    pub(crate) fn on_read(
        &mut self,
        op: u64,
        frame: Option<Frame>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (op, frame, out);
        Err(Ignored::StaleCompletion)
    }

    /// Applies committed `op` (must be `commit_min + 1` and journaled with its frame).
    pub(crate) fn apply_op(&mut self, op: u64, reply: bool, out: &mut Outbox) {
        let _ = (op, reply, out);
    }

    /// A solo replica or a fresh group's view-0 primary starts leading at boot.
    pub(crate) fn start_view_as_recovered_primary(&mut self, out: &mut Outbox) {
        let _ = out;
        self.timers
            .commit_message
            .start(self.config.commit_broadcast_ticks);
    }

    /// Partition plane: raise `next_offset` over a recovered SendMessages batch.
    pub(crate) fn note_recovered_offsets(&mut self, header: &PrepareHeader, body: &[u8]) {
        let _ = (header, body);
    }
}
