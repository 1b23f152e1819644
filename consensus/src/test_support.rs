//! Helpers for the handler unit tests: replicas in a given state and frames built exactly as a
//! peer would build them.

use wire::header::{FrameHeader, Layout, PrepareHeader, StartViewChangeHeader};
use wire::{Command, GroupId, Operation, Sender};

use crate::config::RawConfig;
use crate::frames;
use crate::io::{Effect, Input, Outbox, Recovered};
use crate::replica::Replica;
use crate::state_machine::DigestStateMachine;
use crate::types::{Frame, Now, ReplicaId};

pub const CLUSTER: u128 = 0xC1;
pub const NOW: Now = Now {
    tick: 1,
    realtime_us: 5_000_000,
};

pub type R = Replica<DigestStateMachine>;

pub fn raw(n: u8, r: u8) -> RawConfig {
    RawConfig::new(CLUSTER, ReplicaId(r), n, GroupId::METADATA)
}

/// A fresh replica `r` of `n` on the metadata group, its first superblock written.
pub fn fresh(n: u8, r: u8) -> R {
    boot(raw(n, r))
}

/// A fresh replica from `raw`, its first superblock written; boot effects discarded.
pub fn boot(raw: RawConfig) -> R {
    let mut out = Outbox::new();
    let mut r = Replica::new(
        raw.validate().unwrap(),
        Recovered::fresh(7),
        DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(
        out.drain().collect::<Vec<_>>(),
        vec![Effect::PersistVsrState(crate::VsrState::default())],
        "a fresh group writes its superblock first"
    );
    persisted(&mut r);
    r
}

/// A replica `r` of `n` that lost its state (`Recovered::wiped`), its superblock written.
pub fn wiped(n: u8, r: u8, incarnation: u128) -> R {
    let mut out = Outbox::new();
    let mut b = Replica::new(
        raw(n, r).validate().unwrap(),
        Recovered::wiped(incarnation),
        DigestStateMachine::default(),
        &mut out,
    );
    persisted(&mut b);
    b
}

pub fn sender(r: u8, view: u32) -> Sender {
    Sender {
        cluster: CLUSTER,
        replica: r,
        view,
    }
}

/// A metadata prepare built by `primary` in `view`.
pub fn prepare(view: u32, primary: u8, op: u64, parent: u128, commit: u64, body: &[u8]) -> Frame {
    let mut h = PrepareHeader::zeroed();
    h.frame = FrameHeader::new(Command::Prepare, sender(primary, view));
    h.client.set(0x77);
    h.parent.set(parent);
    h.op.set(op);
    h.commit.set(commit);
    h.timestamp.set(1_000 + op);
    h.request.set(op);
    h.operation = Operation::CreateStream.byte();
    h.group.set(GroupId::METADATA.0);
    frames::finish(h, body)
}

/// A chain of `len` prepares from op 1 in `view` by `primary`.
pub fn chain(view: u32, primary: u8, len: u64) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for op in 1..=len {
        let parent = out.last().map_or(0, checksum);
        out.push(prepare(view, primary, op, parent, 0, &[op as u8]));
    }
    out
}

/// The prepare headers of `frames`, in order (what a superblock write records as view
/// headers, decision 50).
pub fn headers_of(frames: &[Frame]) -> Vec<wire::header::PrepareHeader> {
    frames
        .iter()
        .map(|f| *f.prepare_header().expect("a prepare"))
        .collect()
}

pub fn checksum(frame: &Frame) -> u128 {
    frame.prepare_header().unwrap().frame.checksum.get()
}

pub fn prepare_ok(view: u32, from: u8, prepare: &Frame, commit: u64) -> Frame {
    frames::prepare_ok(
        sender(from, view),
        prepare.prepare_header().unwrap(),
        commit,
    )
}

pub fn commit_frame(view: u32, from: u8, commit: u64, counter: u64) -> Frame {
    frames::commit(sender(from, view), GroupId::METADATA.0, commit, counter)
}

pub fn svc(view: u32, from: u8) -> Frame {
    let mut h = StartViewChangeHeader::zeroed();
    h.frame = FrameHeader::new(Command::StartViewChange, sender(from, view));
    h.group.set(GroupId::METADATA.0);
    frames::finish(h, &[])
}

/// Feeds `frame` from `from` and returns the result and the effects.
pub fn feed(r: &mut R, from: u8, frame: &Frame) -> (Result<(), crate::Ignored>, Vec<Effect>) {
    let mut out = Outbox::new();
    let result = r.step(
        NOW,
        Input::Frame {
            from: ReplicaId(from),
            frame,
        },
        &mut out,
    );
    (result, out.drain().collect())
}

pub fn input(r: &mut R, input: Input<'_>) -> (Result<(), crate::Ignored>, Vec<Effect>) {
    let mut out = Outbox::new();
    let result = r.step(NOW, input, &mut out);
    (result, out.drain().collect())
}

pub fn send(to: u8, frame: Frame) -> Effect {
    Effect::Send {
        to: ReplicaId(to),
        frame,
    }
}

/// Sends to every replica of `n` except `from`.
pub fn broadcast(n: u8, from: u8, frame: &Frame) -> Vec<Effect> {
    (0..n)
        .filter(|r| *r != from)
        .map(|r| send(r, frame.clone()))
        .collect()
}

/// A StartView from `from` with the given prepares as its suffix (given in any order).
pub fn start_view(view: u32, from: u8, op: u64, commit: u64, suffix: &[Frame]) -> Frame {
    use wire::header::StartViewHeader;
    let mut headers: Vec<PrepareHeader> = suffix
        .iter()
        .map(|f| *f.prepare_header().unwrap())
        .collect();
    headers.sort_by_key(|h| std::cmp::Reverse(h.op.get()));
    let mut body = Vec::new();
    wire::suffix::encode(headers.iter(), &mut body);
    let mut h = StartViewHeader::zeroed();
    h.frame = FrameHeader::new(Command::StartView, sender(from, view));
    h.op.set(op);
    h.commit.set(commit);
    h.group.set(GroupId::METADATA.0);
    frames::finish(h, &body)
}

/// Completes the replica's outstanding superblock write (if any) and returns the effects.
pub fn persisted(r: &mut R) -> Vec<Effect> {
    use crate::io::Completion;
    input(
        r,
        Input::Done(Completion::VsrStatePersisted {
            view: r.view(),
            log_view: r.log_view(),
        }),
    )
    .1
}

/// Journals `frames` on a backup in view 0 (fed from the primary, appends completed).
pub fn journal(r: &mut R, frames: &[Frame]) {
    use crate::io::Completion;
    for f in frames {
        let _ = feed(r, 0, f);
        let h = f.prepare_header().unwrap();
        let _ = input(
            r,
            Input::Done(Completion::Appended {
                op: h.op.get(),
                checksum: h.frame.checksum.get(),
            }),
        );
    }
}

/// Ticks until the replica emits something (at most `max` ticks).
pub fn tick_until_effects(r: &mut R, max: u64) -> Vec<Effect> {
    for _ in 0..max {
        let (_, effects) = input(r, Input::Tick);
        if !effects.is_empty() {
            return effects;
        }
    }
    vec![]
}

/// A RequestPrepares from `from`.
pub fn request_prepares(from: u8, nonce: u128, from_op: u64, to_op: u64) -> Frame {
    use wire::header::RequestPreparesHeader;
    let mut h = RequestPreparesHeader::zeroed();
    h.frame = FrameHeader::new(Command::RequestPrepares, sender(from, 0));
    h.nonce.set(nonce);
    h.from_op.set(from_op);
    h.to_op.set(to_op);
    h.group.set(GroupId::METADATA.0);
    frames::finish(h, &[])
}

/// A RepairDone / RangeEvicted from `from`.
pub fn repair_reply(command: Command, from: u8, nonce: u128, op: u64) -> Frame {
    use wire::header::RepairRangeReplyHeader;
    let mut h = RepairRangeReplyHeader::zeroed();
    h.frame = FrameHeader::new(command, sender(from, 0));
    h.nonce.set(nonce);
    h.op.set(op);
    h.group.set(GroupId::METADATA.0);
    frames::finish(h, &[])
}

/// A RequestStartView from `from` stamped with `view`.
pub fn request_start_view(from: u8, view: u32, incarnation: u128) -> Frame {
    use wire::header::RequestStartViewHeader;
    let mut h = RequestStartViewHeader::zeroed();
    h.frame = FrameHeader::new(Command::RequestStartView, sender(from, view));
    h.group.set(GroupId::METADATA.0);
    h.incarnation.set(incarnation);
    frames::finish(h, &[])
}

/// A replica restarted with `frames` journaled and a superblock at `view`.
pub fn restarted(n: u8, r: u8, view: u32, frames: &[Frame], incarnation: u128) -> R {
    let mut out = Outbox::new();
    Replica::new(
        raw(n, r).validate().unwrap(),
        Recovered {
            superblock: Some(crate::VsrState {
                view,
                log_view: view,
                commit_max: 0,
                lost_state: false,
                ..Default::default()
            }),
            frames: frames.to_vec(),
            incarnation,
            ..Recovered::default()
        },
        DigestStateMachine::default(),
        &mut out,
    )
}

/// The completion of the append of `frame`.
pub fn appended(frame: &Frame) -> Input<'static> {
    let h = frame.prepare_header().unwrap();
    Input::Done(crate::io::Completion::Appended {
        op: h.op.get(),
        checksum: h.frame.checksum.get(),
    })
}

/// The effect that journals `frame`.
pub fn append(frame: &Frame) -> Effect {
    Effect::Append {
        op: frame.prepare_header().unwrap().op.get(),
        frame: frame.clone(),
    }
}

/// The frame of a single `Send` effect.
pub fn sent(effect: &Effect) -> (u8, &Frame) {
    match effect {
        Effect::Send { to, frame } => (to.0, frame),
        other => panic!("not a send: {other:?}"),
    }
}
