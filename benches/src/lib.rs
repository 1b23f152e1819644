//! Shared inputs for the criterion benchmarks in `benches/benches/`: one valid frame of every
//! command the replica plane accepts, built through the wire crate's own encoder.

use wire::header::{
    CommitHeader, DoViewChangeHeader, ForwardLogoutHeader, ForwardLogoutResultHeader,
    ForwardRegisterHeader, ForwardRegisterResultHeader, FrameHeader, Layout, PrepareHeader,
    PrepareOkHeader, RepairRangeReplyHeader, RequestPreparesHeader, RequestStartViewHeader,
    RequestStateChunkHeader, RequestStateTransferHeader, RoutedRequestHeader,
    StartViewChangeHeader, StartViewHeader, StateChunkHeader, StateTransferTargetHeader,
};
use wire::{Command, GroupId, Operation, Sender, finish_header};

const SENDER: Sender = Sender {
    cluster: 0x5eed,
    replica: 1,
    view: 7,
};

fn frame<H: Layout>(mut header: H, body: &[u8]) -> Vec<u8> {
    finish_header(&mut header, body).expect("valid command");
    [header.bytes().as_slice(), body].concat()
}

fn new<H: Layout>(command: Command) -> H {
    let mut header = H::zeroed();
    let common = FrameHeader::new(command, SENDER);
    header.as_mut_bytes()[..128].copy_from_slice(zerocopy::IntoBytes::as_bytes(&common));
    header
}

/// A chain of metadata prepares for ops `first..=last`, each with a small body.
pub fn prepare_chain(first: u64, last: u64) -> Vec<PrepareHeader> {
    let mut parent = 0;
    (first..=last)
        .map(|op| {
            let mut h: PrepareHeader = new(Command::Prepare);
            h.client.set(0xc1);
            h.parent.set(parent);
            h.op.set(op);
            h.commit.set(first.saturating_sub(1));
            h.timestamp.set(1_700_000_000_000_000 + op);
            h.request.set(op);
            h.operation = Operation::CreateStream.byte();
            h.group.set(GroupId::METADATA.0);
            finish_header(&mut h, &op.to_le_bytes()).expect("prepare");
            parent = h.frame.checksum.get();
            h
        })
        .collect()
}

/// One valid frame of every command the replica plane accepts, with its command.
pub fn sample_frames() -> Vec<(Command, Vec<u8>)> {
    let group = GroupId::METADATA.0;
    let mut frames = Vec::new();

    let mut request: RoutedRequestHeader = new(Command::Request);
    request.client.set(0xc1);
    request.request.set(3);
    request.session.set(2);
    request.operation = Operation::CreateStream.byte();
    request.group.set(group);
    frames.push((Command::Request, frame(request, b"stream-name")));

    let chain = prepare_chain(5, 8);
    let last = chain[3];
    frames.push((Command::Prepare, frame(last, &8u64.to_le_bytes())));
    let mut repair = last;
    repair.frame.command = Command::RepairPrepare.byte();
    frames.push((
        Command::RepairPrepare,
        [repair.bytes().as_slice(), &8u64.to_le_bytes()].concat(),
    ));

    let mut ok: PrepareOkHeader = new(Command::PrepareOk);
    ok.parent.set(last.parent.get());
    ok.prepare_checksum.set(last.frame.checksum.get());
    ok.op.set(8);
    ok.operation = last.operation;
    ok.group.set(group);
    frames.push((Command::PrepareOk, frame(ok, &[])));

    let mut commit: CommitHeader = new(Command::Commit);
    commit.timestamp_monotonic.set(12);
    commit.commit.set(8);
    commit.group.set(group);
    frames.push((Command::Commit, frame(commit, &[])));

    let mut svc: StartViewChangeHeader = new(Command::StartViewChange);
    svc.group.set(group);
    frames.push((Command::StartViewChange, frame(svc, &[])));

    let mut suffix = Vec::new();
    wire::suffix::encode(chain.iter().rev(), &mut suffix);
    let mut dvc: DoViewChangeHeader = new(Command::DoViewChange);
    dvc.op.set(8);
    dvc.commit.set(4);
    dvc.group.set(group);
    dvc.log_view.set(6);
    dvc.present_bitset.set(0b1111);
    frames.push((Command::DoViewChange, frame(dvc, &suffix)));

    let mut sv: StartViewHeader = new(Command::StartView);
    sv.op.set(8);
    sv.commit.set(4);
    sv.group.set(group);
    frames.push((Command::StartView, frame(sv, &suffix)));

    let mut rsv: RequestStartViewHeader = new(Command::RequestStartView);
    rsv.group.set(group);
    rsv.incarnation.set(77);
    frames.push((Command::RequestStartView, frame(rsv, &[])));

    let mut rp: RequestPreparesHeader = new(Command::RequestPrepares);
    rp.nonce.set(9);
    rp.from_op.set(5);
    rp.to_op.set(8);
    rp.group.set(group);
    frames.push((Command::RequestPrepares, frame(rp, &[])));

    for command in [Command::RepairDone, Command::RangeEvicted] {
        let mut reply: RepairRangeReplyHeader = new(command);
        reply.nonce.set(9);
        reply.op.set(8);
        reply.group.set(group);
        frames.push((command, frame(reply, &[])));
    }

    let mut rst: RequestStateTransferHeader = new(Command::RequestStateTransfer);
    rst.nonce.set(11);
    rst.group.set(group);
    frames.push((Command::RequestStateTransfer, frame(rst, &[])));

    let mut stt: StateTransferTargetHeader = new(Command::StateTransferTarget);
    stt.nonce.set(11);
    stt.group.set(group);
    stt.unavailable_transient = 1;
    frames.push((Command::StateTransferTarget, frame(stt, &[])));

    let mut rsc: RequestStateChunkHeader = new(Command::RequestStateChunk);
    rsc.nonce.set(11);
    rsc.group.set(group);
    rsc.len.set(4096);
    frames.push((Command::RequestStateChunk, frame(rsc, &[])));

    let mut chunk: StateChunkHeader = new(Command::StateChunk);
    chunk.nonce.set(11);
    chunk.group.set(group);
    frames.push((Command::StateChunk, frame(chunk, &[0xab; 4096])));

    let mut fr: ForwardRegisterHeader = new(Command::ForwardRegister);
    fr.client.set(0xc1);
    fr.nonce.set(13);
    fr.user_id.set(1);
    frames.push((Command::ForwardRegister, frame(fr, &[])));

    let mut frr: ForwardRegisterResultHeader = new(Command::ForwardRegisterResult);
    frr.client.set(0xc1);
    frr.nonce.set(13);
    frr.epoch.set(20);
    frames.push((Command::ForwardRegisterResult, frame(frr, &[])));

    let mut fl: ForwardLogoutHeader = new(Command::ForwardLogout);
    fl.client.set(0xc1);
    fl.nonce.set(14);
    fl.session.set(20);
    fl.request.set(4);
    frames.push((Command::ForwardLogout, frame(fl, &[])));

    let mut flr: ForwardLogoutResultHeader = new(Command::ForwardLogoutResult);
    flr.client.set(0xc1);
    flr.nonce.set(14);
    flr.commit.set(21);
    frames.push((Command::ForwardLogoutResult, frame(flr, &[])));

    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_is_accepted_as_its_command() {
        let samples = sample_frames();
        let mut accepted: Vec<Command> = samples.iter().map(|(c, _)| *c).collect();
        accepted.sort();
        let expected: Vec<Command> = Command::ALL
            .into_iter()
            .filter(|c| !matches!(c.byte(), 0..=4 | 8 | 13..=16))
            .collect();
        assert_eq!(accepted, expected);
        for (command, frame) in samples {
            let message = wire::decode_replica(&frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
                .unwrap_or_else(|e| panic!("{command}: {e}"));
            assert_eq!(message.command(), command);
        }
    }
}
