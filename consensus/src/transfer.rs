//! State transfer (§11): RequestStateTransfer / StateTransferTarget / RequestStateChunk /
//! StateChunk, lockstep, verified against the manifest.

use wire::header::{
    RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader,
};

use crate::ignored::Ignored;
use crate::io::Outbox;
use crate::replica::Replica;
use crate::state_machine::StateMachine;

/// Receiver-side stage (§11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransferStage {
    /// No transfer.
    #[default]
    Idle,
    /// Asked for a descriptor.
    AwaitingTarget,
    /// Pulling chunks.
    Fetching,
    /// Installing the artifacts.
    Installing,
}

/// Both sides of state transfer for one group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Transfer {
    pub stage: TransferStage,
}

impl Transfer {
    pub fn is_active(&self) -> bool {
        self.stage != TransferStage::Idle
    }

    /// Drops any receiver session (probe exhaustion, §9.3).
    pub fn abandon(&mut self) {
        self.stage = TransferStage::Idle;
    }
}

impl<S: StateMachine> Replica<S> {
    /// Starts a receiver session against `peer` (§11.2). TODO: not implemented yet; without
    /// it a replica whose gap lies below every peer's retained journal stays behind.
    pub(crate) fn start_state_transfer(&mut self, peer: crate::types::ReplicaId, out: &mut Outbox) {
        let _ = (peer, out);
    }

    /// Transfer timers (stall retry, offer expiry).
    pub(crate) fn tick_transfer(&mut self, out: &mut Outbox) {
        let _ = out;
    }

    pub(crate) fn on_request_state_transfer(
        &mut self,
        header: &RequestStateTransferHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_state_transfer_target(
        &mut self,
        header: &StateTransferTargetHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, body, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_request_state_chunk(
        &mut self,
        header: &RequestStateChunkHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_state_chunk(
        &mut self,
        header: &StateChunkHeader,
        body: &[u8],
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = (header, body, out);
        Err(Ignored::Unimplemented)
    }

    pub(crate) fn on_checkpointed(&mut self, op: u64, out: &mut Outbox) -> Result<(), Ignored> {
        let _ = (op, out);
        Err(Ignored::StaleCompletion)
    }
}
