//! The receive pipeline on arbitrary frames. The first byte picks how the input is shaped: as
//! given, or with `size` patched to the input's length and a command byte below 30 so that the
//! fuzzer spends its time past framing, in the per-command checks, seals and suffix decode.
//! Properties: no panic; whatever is accepted re-encodes to the same header through `finish`
//! (so the decoder never accepts a frame the encoder would not produce), and a refusal at
//! framing happens only for a bad size or command byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::decode::{self, Message, Stage};
use wire::{Command, HEADER_SIZE};

const MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut frame = rest.to_vec();
    if mode & 1 == 1 && frame.len() >= HEADER_SIZE {
        let size = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        frame[48..52].copy_from_slice(&size.to_le_bytes());
        frame[60] %= Command::MAX + 1;
    }
    let _ = decode::decode_request(&frame, MAX);
    let _ = decode::decode_reply(&frame, MAX);
    let _ = decode::decode_eviction(&frame, MAX);
    match decode::decode_replica(&frame, MAX) {
        Ok(message) => check_accepted(&message, &frame),
        Err(error) if error.stage() == Stage::Framing => {
            assert!(mode & 1 == 0 || frame.len() < HEADER_SIZE, "patched frame refused at framing: {error}");
        }
        Err(_) => {}
    }
});

fn check_accepted(message: &Message<'_>, frame: &[u8]) {
    let header = message.header_bytes();
    assert_eq!(header.as_slice(), &frame[..HEADER_SIZE]);
    assert_eq!(message.command().byte(), header[60]);
    let body = &frame[HEADER_SIZE..];
    let mut rebuilt = *header;
    wire::finish(&mut rebuilt, body).expect("accepted command");
    let legacy_unsealed_prepare = matches!(message, Message::Prepare { .. } | Message::RepairPrepare { .. })
        && header[..16] == [0; 16];
    let unchecked_body_digest = match message {
        // Receivers verify a prepare's body digest only when it is non-zero, and ignore the
        // field of an empty DoViewChange/StartView body and of every other command.
        Message::Prepare { .. } | Message::RepairPrepare { .. } => header[16..32] == [0; 16],
        Message::DoViewChange { .. } | Message::StartView { .. } => body.is_empty(),
        _ => true,
    };
    if !legacy_unsealed_prepare && !unchecked_body_digest {
        assert_eq!(&rebuilt[..], &header[..], "accepted frame is not what the encoder builds");
    }
}
