//! View change (§8): StartViewChange, DoViewChange, the primary-elect's merge and repair, and
//! StartView installation, behind the durable-before-send gate (§8.10).

use wire::header::{DoViewChangeHeader, StartViewChangeHeader, StartViewHeader};
use wire::suffix::Suffix;

use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;

/// View-change bookkeeping, cleared on every view transition.
#[derive(Debug, Clone, Default)]
pub(crate) struct ViewChangeState {
    /// Bit `r`: StartViewChange for the current view recorded from `r` (own included).
    pub svc_from: u32,
}

impl<S: StateMachine> Replica<S> {
    pub(crate) fn on_start_view_change(
        &mut self,
        header: &StartViewChangeHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_do_view_change(
        &mut self,
        header: &DoViewChangeHeader,
        suffix: &Suffix<'_>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, suffix, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_start_view(
        &mut self,
        header: &StartViewHeader,
        suffix: Option<&Suffix<'_>>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, suffix, out);
        Err(Ignored::Unimplemented)
    }
}
