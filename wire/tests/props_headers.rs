//! Property tests of headers: views round-trip, finished headers never fail integrity, and no
//! input makes a decoder panic.

use proptest::prelude::*;
use wire::decode::{self, Stage};
use wire::header::{FieldKind, LAYOUTS, Layout, layout_fields};
use wire::suffix::Suffix;
use wire::{Command, HEADER_SIZE, MAX_MESSAGE_SIZE_DEFAULT, Operation};

fn header_bytes() -> impl Strategy<Value = [u8; HEADER_SIZE]> {
    prop::collection::vec(any::<u8>(), HEADER_SIZE).prop_map(|v| v.try_into().unwrap())
}

/// Writes random integers into every integer field of the command's layout, leaves byte
/// regions zero, and makes enum bytes defined.
fn fill(command: Command, values: &[u128], operation: u8) -> [u8; HEADER_SIZE] {
    let mut header = [0u8; HEADER_SIZE];
    let layout = if command == Command::Request {
        "RoutedRequestHeader"
    } else {
        command.layout_name()
    };
    for (field, value) in layout_fields(layout).unwrap().zip(values.iter().cycle()) {
        if field.kind == FieldKind::Bytes {
            continue;
        }
        let masked = if field.size == 16 {
            *value
        } else {
            value & ((1u128 << (field.size * 8)) - 1)
        };
        assert!(field.write_uint(&mut header, masked));
    }
    header[56..60].fill(0); // release
    header[60] = command.byte();
    for field in layout_fields(layout).unwrap() {
        match field.name {
            "operation" => header[field.offset] = operation,
            "outcome" => header[field.offset] = 0,
            "reason" => header[field.offset] = 1,
            "available" | "unavailable_transient" => header[field.offset] = 0,
            _ => {}
        }
    }
    header
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_layout_views_and_rewrites_any_header(bytes in header_bytes()) {
        for (name, _) in LAYOUTS {
            let mut rebuilt = [0u8; HEADER_SIZE];
            for field in layout_fields(name).unwrap() {
                match field.read_uint(&bytes) {
                    Some(value) => prop_assert!(field.write_uint(&mut rebuilt, value)),
                    None => rebuilt[field.offset..field.offset + field.size].copy_from_slice(field.bytes(&bytes)),
                }
            }
            prop_assert_eq!(rebuilt, bytes, "layout {}", name);
        }
    }

    #[test]
    fn finished_headers_never_fail_integrity(
        command in prop::sample::select(Command::ALL.to_vec()),
        values in prop::collection::vec(any::<u128>(), 1..24),
        operation in prop::sample::select(Operation::ALL.to_vec()),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut header = fill(command, &values, operation.byte());
        let body = match command {
            // A random body is not a suffix; an empty one is always well-formed.
            Command::DoViewChange | Command::StartView => Vec::new(),
            _ => body,
        };
        wire::finish(&mut header, &body).unwrap();
        let frame = [header.as_slice(), &body].concat();
        match decode::decode_replica(&frame, MAX_MESSAGE_SIZE_DEFAULT) {
            Ok(message) => {
                prop_assert_eq!(message.command(), command);
                prop_assert_eq!(message.header_bytes(), &header);
            }
            Err(error) => prop_assert!(
                matches!(error.stage(), Stage::Validate | Stage::UnsupportedCommand | Stage::ClientBound),
                "{command}: {error}"
            ),
        }
    }

    #[test]
    fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1024), head_op in any::<u64>()) {
        let _ = decode::decode_replica(&bytes, MAX_MESSAGE_SIZE_DEFAULT);
        let _ = decode::decode_request(&bytes, MAX_MESSAGE_SIZE_DEFAULT);
        let _ = decode::decode_reply(&bytes, MAX_MESSAGE_SIZE_DEFAULT);
        let _ = decode::decode_eviction(&bytes, MAX_MESSAGE_SIZE_DEFAULT);
        let _ = Suffix::decode(head_op, &bytes);
    }

    /// A request decoded from its header and body apart (decision 366) gets the verdict of the
    /// whole frame, for every size field, command and body length.
    #[test]
    fn request_parts_decode_as_the_whole_frame(mut header in header_bytes(), command in 0u8..=31, size in prop::option::of(0u32..2048), body in prop::collection::vec(any::<u8>(), 0..768)) {
        header[60] = command;
        let size = size.unwrap_or((HEADER_SIZE + body.len()) as u32);
        header[48..52].copy_from_slice(&size.to_le_bytes());
        let frame = [header.as_slice(), &body].concat();
        let whole = decode::decode_request(&frame, MAX_MESSAGE_SIZE_DEFAULT).map(|(h, _)| *h);
        let parts = decode::decode_request_parts(&header, &body, MAX_MESSAGE_SIZE_DEFAULT).copied();
        prop_assert_eq!(parts.map(|h| h.bytes().to_vec()), whole.map(|h| h.bytes().to_vec()));
    }

    /// Random headers that pass framing (size = length, command <= 29) reach deep into the
    /// per-command checks; none may panic, and every verdict names a stage.
    #[test]
    fn framed_garbage_never_panics(mut header in header_bytes(), command in 0u8..=29, body in prop::collection::vec(any::<u8>(), 0..768)) {
        header[60] = command;
        let size = (HEADER_SIZE + body.len()) as u32;
        header[48..52].copy_from_slice(&size.to_le_bytes());
        let frame = [header.as_slice(), &body].concat();
        if let Err(error) = decode::decode_replica(&frame, MAX_MESSAGE_SIZE_DEFAULT) {
            prop_assert_ne!(error.stage(), Stage::Framing);
        }
    }
}
