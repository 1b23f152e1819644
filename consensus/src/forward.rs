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
