//! Why an input was dropped. Network input never panics: every refusal is one of these.

use thiserror::Error;

/// Why [`crate::Replica::step`] dropped an input (counted and logged at debug by the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Ignored {
    /// The raw frame failed `wire::decode_replica`.
    #[error("decode: {0}")]
    Decode(wire::DecodeError),
    /// The frame failed `wire::decode::check_sender`.
    #[error("sender: {0}")]
    Sender(wire::decode::SenderError),
    /// The frame's cluster id is not ours.
    #[error("foreign cluster")]
    Cluster,
    /// The frame addresses another group.
    #[error("frame for another group")]
    Group,
    /// A prepare's operation belongs to the other plane (§15).
    #[error("operation of the other plane")]
    Plane,
    /// A command this core never handles on the replica port (Request, §16.1).
    #[error("command not handled on the replica port")]
    Command,
    /// Our status does not handle this frame.
    #[error("status does not accept this frame")]
    Status,
    /// The frame's view is older than ours.
    #[error("older view")]
    ViewOld,
    /// The frame's view is newer than ours (recorded in `observed_newer_view` where relevant).
    #[error("newer view")]
    ViewNew,
    /// Only the primary handles this frame.
    #[error("not primary")]
    NotPrimary,
    /// Only a backup handles this frame.
    #[error("not a backup")]
    NotBackup,
    /// The sender is not who this frame must come from.
    #[error("unexpected sender")]
    WrongSender,
    /// We are transferring state.
    #[error("state transfer in progress")]
    Transferring,
    /// The op is already committed/applied here.
    #[error("op already committed")]
    Committed,
    /// The op is not the next one (gap).
    #[error("gap: op is not the next one")]
    Gap,
    /// A different prepare is journaled at this op.
    #[error("a different prepare is journaled at this op")]
    Diverged,
    /// The parent hash chain does not link.
    #[error("hash chain break")]
    ChainBreak,
    /// Partition SendMessages stamp or batch failed re-derivation (§5.6).
    #[error("send-messages batch or stamp mismatch")]
    Stamp,
    /// The pipeline holds no matching entry (stale or foreign ack).
    #[error("no matching pipeline entry")]
    UnknownPrepare,
    /// A duplicate of something already recorded.
    #[error("duplicate")]
    Duplicate,
    /// A heartbeat that is not fresh in this view.
    #[error("stale heartbeat")]
    StaleHeartbeat,
    /// A StartView rejected by the acceptance rules of §8.8.
    #[error("start view not acceptable")]
    StartViewRejected,
    /// A lost-state replica has not learned the current view from a quorum of peers yet, or
    /// the StartView is of a view below the one it learned (decision 61).
    #[error("view not learned from a quorum")]
    ViewUnlearned,
    /// A repair/transfer reply whose nonce matches no live session.
    #[error("no session with this nonce")]
    Nonce,
    /// A repair or transfer frame out of scope for the session.
    #[error("out of scope for the session")]
    Scope,
    /// A completion that matches nothing outstanding (stale after truncation or restart).
    #[error("stale completion")]
    StaleCompletion,
    /// A client request refused (the refusal, if any, is in the outbox as a Reply).
    #[error("client request refused")]
    Refused,
    /// The frame is malformed in a way the stateless decoder cannot see.
    #[error("malformed")]
    Malformed,
    /// The op is above what the local journal can hold until a checkpoint raises its floor
    /// (decision 34); the sender retransmits or repair asks again later.
    #[error("journal full above the durable checkpoint")]
    JournalFull,
    /// This backup's appends that have not completed reach `appending_bytes_max` (decision
    /// 504): a live prepare is forwarded, neither journaled nor acked; repair fetches it once
    /// the appends caught up.
    #[error("appends behind: the journal holds its bound of incomplete appends")]
    AppendingBehind,
    /// A live prepare stamped further ahead of this backup's clock than
    /// `timestamp_ahead_max_us` (decision 72): forwarded, neither journaled nor acked.
    #[error("prepare timestamp ahead of the local clock beyond the window")]
    ClockAhead,
    /// A queue is full; the input was dropped and counted.
    #[error("queue full")]
    QueueFull,
    /// The state machine could not offer, read or stage a transfer artifact (its disk failed,
    /// decision 170); the peer's retry or stall timer asks again.
    #[error("state-transfer artifact io failed")]
    ArtifactIo,
    /// `take_over` refused: this replica abdicated as primary, or its last takeover did not
    /// hold, too recently (decision 171).
    #[error("primary affinity backing off")]
    Abdicated,
    /// Recognized but not implemented by this core yet.
    #[error("not implemented")]
    Unimplemented,
}
