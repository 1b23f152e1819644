//! frames.json and negatives.json: layouts, field-by-field decode and encode, integrity, and the
//! receive verdicts of both planes.

use serde_json::Value;
use wire::decode::{self, Disposition, Stage};
use wire::header::{FieldKind, layout_fields};
use wire::{Command, DecodeError, HEADER_SIZE, Integrity, MAX_MESSAGE_SIZE_DEFAULT};

use crate::common::*;

pub fn check_frames(v: &Value) {
    expect_sections(v, &["cluster_name", "cluster_id", "layouts", "frames"]);
    assert_eq!(
        wire::cluster_id(string(v, "cluster_name")),
        uint(v, "cluster_id"),
        "cluster id of the frame set"
    );
    check_layouts(get(v, "layouts"));
    let frames = arr(v, "frames");
    assert!(!frames.is_empty(), "frames.json has no frames");
    for frame in frames {
        let name = name(frame);
        check_frame(frame).unwrap_or_else(|e| panic!("frame {name}: {e}"));
    }
}

/// Our layout tables must be exactly the file's: same fields, offsets, sizes and types.
fn check_layouts(layouts: &Value) {
    for (layout, fields) in obj(layouts) {
        let ours: Vec<_> = layout_fields(layout)
            .unwrap_or_else(|| panic!("unknown layout {layout}"))
            .collect();
        let theirs = fields.as_array().expect("layout is an array");
        assert_eq!(ours.len(), theirs.len(), "field count of {layout}");
        let mut end = 0;
        for (our, their) in ours.iter().zip(theirs) {
            assert_eq!(our.name, string(their, "name"), "{layout}");
            assert_eq!(
                our.offset as u128,
                uint(their, "offset"),
                "{layout}.{}",
                our.name
            );
            assert_eq!(
                our.size as u128,
                uint(their, "size"),
                "{layout}.{}",
                our.name
            );
            assert_eq!(
                our.kind,
                field_kind(string(their, "type")),
                "{layout}.{}",
                our.name
            );
            assert_eq!(our.offset, end, "{layout} has a gap before {}", our.name);
            end = our.offset + our.size;
        }
        assert_eq!(end, HEADER_SIZE, "{layout} does not cover the header");
    }
}

fn field_kind(name: &str) -> FieldKind {
    match name {
        "u8" => FieldKind::U8,
        "u32" => FieldKind::U32,
        "u64" => FieldKind::U64,
        "u128" => FieldKind::U128,
        "bytes" => FieldKind::Bytes,
        other => panic!("unknown field type {other:?}"),
    }
}

fn integrity(name: &str) -> Integrity {
    match name {
        "frame_seal" => Integrity::FrameSeal,
        "prepare_identity" => Integrity::PrepareIdentity,
        "none" => Integrity::None,
        "handshake_mac" => Integrity::HandshakeMac,
        other => panic!("unknown integrity {other:?}"),
    }
}

fn check_frame(frame: &Value) -> Result<(), String> {
    let header_bytes = hex(frame, "header_hex");
    let body = hex(frame, "body_hex");
    let bytes = hex(frame, "frame_hex");
    if header_bytes.len() != HEADER_SIZE || [header_bytes.as_slice(), &body].concat() != bytes {
        return Err("frame_hex is not header_hex + body_hex".into());
    }
    let header = header_of(&bytes);
    let command = Command::from_byte(uint(frame, "command") as u8).ok_or("undefined command")?;
    assert_eq!(header[60], command.byte(), "command byte");
    assert_eq!(command.name(), string(frame, "command_name"));
    assert_eq!(
        u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize,
        bytes.len(),
        "size field"
    );

    let layout = string(frame, "layout");
    let expected_layouts: &[&str] = if command == Command::Request {
        &["RequestHeader", "RoutedRequestHeader"]
    } else {
        &[command.layout_name()]
    };
    if !expected_layouts.contains(&layout) {
        return Err(format!("layout {layout} is not the layout of {command}"));
    }
    let declared_integrity = integrity(string(frame, "integrity"));
    assert_eq!(
        command.integrity(),
        declared_integrity,
        "integrity of {command}"
    );

    // Decode: every field read through our table equals the file's value.
    let fields = get(frame, "fields");
    for field in layout_fields(layout).expect("known layout") {
        let value = get(fields, field.name);
        match field.kind {
            FieldKind::Bytes => assert_eq!(
                field.bytes(&header),
                decode_hex(value.as_str().expect("hex")),
                "{}",
                field.name
            ),
            _ => assert_eq!(
                field.read_uint(&header),
                as_uint(value),
                "field {}",
                field.name
            ),
        }
    }

    // Encode: write every field but the ones the encoder derives (checksum, body digest,
    // size), then let `finish` derive them from the body by the command's rules.
    let derived = ["checksum", "checksum_body", "size"];
    let mut encoded = [0u8; HEADER_SIZE];
    for field in layout_fields(layout)
        .expect("known layout")
        .filter(|f| !derived.contains(&f.name))
    {
        let value = get(fields, field.name);
        match field.kind {
            FieldKind::Bytes => encoded[field.offset..field.offset + field.size]
                .copy_from_slice(&decode_hex(value.as_str().expect("hex"))),
            _ => assert!(
                field.write_uint(&mut encoded, as_uint(value).expect("integer")),
                "{} fits",
                field.name
            ),
        }
    }
    wire::finish(&mut encoded, &body).map_err(|e| e.to_string())?;
    if encoded != header {
        return Err(format!(
            "encoded header differs at byte {:?}",
            encoded.iter().zip(header.iter()).position(|(a, b)| a != b)
        ));
    }

    // Verdicts.
    let replica_plane = get(frame, "replica_plane");
    match replica_verdict(&bytes) {
        Ok(message) => {
            if !boolean(replica_plane, "accepted") {
                return Err(format!(
                    "accepted as {}, the reference refuses it",
                    message.name()
                ));
            }
            assert_eq!(message.name(), string(replica_plane, "classified_as"));
        }
        Err(error) => expect_refusal(replica_plane, &error, "replica plane")?,
    }
    for (key, decoder) in CLIENT_DECODERS {
        if let Some(verdict) = opt(frame, key) {
            match decoder(&bytes) {
                Ok(()) if boolean(verdict, "accepted") => {}
                Ok(()) => return Err(format!("{key}: accepted, the reference refuses it")),
                Err(error) => expect_refusal(verdict, &error, key)?,
            }
        }
    }
    for key in obj(frame)
        .keys()
        .filter(|k| k.starts_with("client_plane_as_"))
    {
        assert!(
            CLIENT_DECODERS.iter().any(|(k, _)| k == key),
            "unknown client-plane verdict {key}"
        );
    }
    Ok(())
}

type ClientDecoder = fn(&[u8]) -> Result<(), DecodeError>;

const CLIENT_DECODERS: [(&str, ClientDecoder); 3] = [
    ("client_plane_as_RequestHeader", |f| {
        let whole = decode::decode_request(f, MAX_MESSAGE_SIZE_DEFAULT).map(drop);
        // The client core reads a request as header + body (decision 366): same verdict.
        if let Some(header) = f.first_chunk::<HEADER_SIZE>() {
            let parts =
                decode::decode_request_parts(header, &f[HEADER_SIZE..], MAX_MESSAGE_SIZE_DEFAULT)
                    .map(drop);
            assert_eq!(
                parts, whole,
                "decode_request_parts disagrees with decode_request"
            );
        }
        whole
    }),
    ("client_plane_as_ReplyHeader", |f| {
        decode::decode_reply(f, MAX_MESSAGE_SIZE_DEFAULT).map(drop)
    }),
    ("client_plane_as_EvictionHeader", |f| {
        decode::decode_eviction(f, MAX_MESSAGE_SIZE_DEFAULT).map(drop)
    }),
];

/// The replica port's stateless verdict: framing on the header alone (a reader refuses a bad
/// size before any body arrives), then the whole pipeline.
fn replica_verdict(bytes: &[u8]) -> Result<Summary, DecodeError> {
    let header = header_of(bytes);
    wire::framer::frame_size(&header, MAX_MESSAGE_SIZE_DEFAULT)?;
    decode::decode_replica(bytes, MAX_MESSAGE_SIZE_DEFAULT).map(|m| Summary(m.command()))
}

struct Summary(Command);

impl Summary {
    fn name(&self) -> &'static str {
        self.0.name()
    }
}

fn stage(name: &str) -> Stage {
    match name {
        "framing" => Stage::Framing,
        "unsupported_command" => Stage::UnsupportedCommand,
        "client_bound" => Stage::ClientBound,
        "bit_pattern" => Stage::BitPattern,
        "seal" => Stage::Seal,
        "validate" => Stage::Validate,
        "prepare_integrity" => Stage::PrepareIntegrity,
        "control_body" => Stage::ControlBody,
        "suffix_decode" => Stage::SuffixDecode,
        other => panic!("unknown stage {other:?}"),
    }
}

/// The vectors' effect: `None` for `reject` (the client-plane decoder refuses the frame).
fn effect(name: &str) -> Option<Disposition> {
    match name {
        "close_connection" => Some(Disposition::CloseConnection),
        "drop_frame" => Some(Disposition::DropFrame),
        "reject" => None,
        other => panic!("unknown effect {other:?}"),
    }
}

fn expect_refusal(verdict: &Value, error: &DecodeError, plane: &str) -> Result<(), String> {
    if boolean(verdict, "accepted") {
        return Err(format!(
            "{plane}: refused ({error}), the reference accepts it"
        ));
    }
    let want_stage = stage(string(verdict, "stage"));
    if error.stage() != want_stage {
        return Err(format!(
            "{plane}: refused at {:?} ({error}), the reference at {want_stage:?}",
            error.stage()
        ));
    }
    if let Some(want) = effect(string(verdict, "effect"))
        && error.disposition() != want
    {
        return Err(format!(
            "{plane}: {:?}, the reference {want:?}",
            error.disposition()
        ));
    }
    Ok(())
}

pub fn check_negatives(v: &Value) {
    expect_sections(v, &["negatives"]);
    let negatives = arr(v, "negatives");
    assert!(!negatives.is_empty(), "negatives.json has no entries");
    for negative in negatives {
        let name = name(negative);
        let bytes = hex(negative, "frame_hex");
        assert!(bytes.len() >= HEADER_SIZE, "{name}: shorter than a header");
        assert_eq!(
            u128::from(bytes[60]),
            uint(negative, "command"),
            "{name}: command byte"
        );
        if let Some(reference) = opt(negative, "reference_result") {
            assert_eq!(
                string(reference, "stage"),
                string(negative, "stage"),
                "{name}"
            );
            assert_eq!(
                string(reference, "effect"),
                string(negative, "effect"),
                "{name}"
            );
        }
        let verdict = serde_json::json!({
            "accepted": false,
            "stage": string(negative, "stage"),
            "effect": string(negative, "effect"),
        });
        let result = match effect(string(negative, "effect")) {
            None => client_decoder(bytes[60]).unwrap_or_else(|| {
                panic!("{name}: no client-plane decoder for command {}", bytes[60])
            })(&bytes),
            Some(_) => replica_verdict(&bytes).map(drop),
        };
        match result {
            Ok(()) => panic!(
                "{name}: accepted, the reference refuses it at {}",
                string(negative, "stage")
            ),
            Err(error) => expect_refusal(&verdict, &error, "negative")
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        }
    }
}

fn client_decoder(command: u8) -> Option<ClientDecoder> {
    let key = match Command::from_byte(command)? {
        Command::Request => "client_plane_as_RequestHeader",
        Command::Reply => "client_plane_as_ReplyHeader",
        Command::Eviction => "client_plane_as_EvictionHeader",
        _ => return None,
    };
    CLIENT_DECODERS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, d)| *d)
}
