//! Session forwarding (§13): ForwardRegister / ForwardLogout and their results.

use wire::header::{
    ForwardLogoutHeader, ForwardLogoutResultHeader, ForwardRegisterHeader,
    ForwardRegisterResultHeader,
};

use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::Now;

impl<S: StateMachine> Replica<S> {
    /// Register/Logout reaching a metadata backup: forward to the primary (§13). TODO: not
    /// implemented yet; the client is told `TransientNotAccepted` and retries elsewhere.
    pub(crate) fn forward_session(
        &mut self,
        now: Now,
        request: crate::io::ClientRequest,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = now;
        let frame = crate::frames::reply_denied_result(
            &request.header,
            self.commit_max,
            crate::frames::codes::TRANSIENT_NOT_ACCEPTED,
        );
        out.push(crate::io::Effect::Reply {
            client: crate::types::ClientId(request.header.client.get()),
            frame,
        });
        Err(Ignored::NotPrimary)
    }

    /// Forward waiter timeouts.
    pub(crate) fn tick_forwards(&mut self, now: Now, out: &mut Outbox) {
        let _ = (now, out);
    }

    pub(crate) fn on_forward_register(
        &mut self,
        now: Now,
        header: &ForwardRegisterHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_forward_register_result(
        &mut self,
        header: &ForwardRegisterResultHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_forward_logout(
        &mut self,
        now: Now,
        header: &ForwardLogoutHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (now, header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_forward_logout_result(
        &mut self,
        header: &ForwardLogoutResultHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }
}
