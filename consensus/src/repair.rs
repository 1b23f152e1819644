//! Journal repair (§10): RequestPrepares / RepairPrepare / RepairDone / RangeEvicted.

use wire::header::{PrepareHeader, RepairRangeReplyHeader, RequestPreparesHeader};

use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;

/// The requester's repair session (at most one per group).
#[derive(Debug, Clone, Default)]
pub(crate) struct Repair {
    pub session: Option<RepairSession>,
}

#[derive(Debug, Clone)]
pub(crate) struct RepairSession {
    pub nonce: u128,
    pub to_op: u64,
    pub peer: crate::types::ReplicaId,
    pub idle_ticks: u64,
}

impl<S: StateMachine> Replica<S> {
    pub(crate) fn on_request_prepares(
        &mut self,
        header: &RequestPreparesHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_repair_prepare(
        &mut self,
        header: &PrepareHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, body, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_repair_done(
        &mut self,
        header: &RepairRangeReplyHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_range_evicted(
        &mut self,
        header: &RepairRangeReplyHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }
}
