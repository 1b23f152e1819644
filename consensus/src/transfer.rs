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
}

impl<S: StateMachine> Replica<S> {
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
