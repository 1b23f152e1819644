//! identity.json, cluster.json and groups.json.

use serde_json::Value;
use wire::group::{PACKED_MAX, PartitionKey};
use wire::integrity::{body_digest, prepare_identity, xxh3};
use wire::{
    Command, GroupId, GroupKind, HEADER_SIZE, Layout, MAX_MESSAGE_SIZE_DEFAULT, Message,
    decode_replica,
};

use crate::common::*;

fn checksum_of(header: &[u8; HEADER_SIZE]) -> u128 {
    u128::from_le_bytes(header[..16].try_into().unwrap())
}

/// Decodes a prepare frame through the receive pipeline and returns its header bytes.
fn accepted_prepare(frame: &[u8], command: Command) -> [u8; HEADER_SIZE] {
    let message = decode_replica(frame, MAX_MESSAGE_SIZE_DEFAULT)
        .unwrap_or_else(|e| panic!("prepare refused: {e}"));
    assert_eq!(message.command(), command);
    assert!(matches!(
        message,
        Message::Prepare { .. } | Message::RepairPrepare { .. }
    ));
    header_of(frame)
}

pub fn check_identity(v: &Value) {
    expect_sections(
        v,
        &["view_pairs", "chains", "body_coverage", "repair_prepare"],
    );
    for pair in arr(v, "view_pairs") {
        let a = accepted_prepare(&hex(pair, "a_frame_hex"), Command::Prepare);
        let b = accepted_prepare(&hex(pair, "b_frame_hex"), Command::Prepare);
        let identity = uint(pair, "identity");
        assert_eq!(prepare_identity(&a), identity, "{}", name(pair));
        assert_eq!(prepare_identity(&b), identity, "{}", name(pair));
        assert_eq!(hex(pair, "identity_hex_le"), identity.to_le_bytes());
        assert_eq!(checksum_of(&a), uint(pair, "checksum_field_a"));
        assert_eq!(checksum_of(&b), uint(pair, "checksum_field_b"));
        assert_eq!(
            u128::from(u32::from_le_bytes(a[52..56].try_into().unwrap())),
            uint(pair, "view_a")
        );
        assert_eq!(
            u128::from(u32::from_le_bytes(b[52..56].try_into().unwrap())),
            uint(pair, "view_b")
        );
        assert_ne!(
            a[52..56],
            b[52..56],
            "{}: the pair differs in view",
            name(pair)
        );
    }
    for chain in arr(v, "chains") {
        let mut parent = uint(chain, "genesis_parent");
        for prepare in arr(chain, "prepares") {
            let frame = hex(prepare, "frame_hex");
            let header = accepted_prepare(&frame, Command::Prepare);
            let view = wire::header::PrepareHeader::view(&header).unwrap();
            assert_eq!(view.op.get() as u128, uint(prepare, "op"));
            assert_eq!(
                view.parent.get(),
                parent,
                "{} op {}: parent",
                name(chain),
                view.op
            );
            assert_eq!(uint(prepare, "parent"), parent);
            let identity = prepare_identity(&header);
            assert_eq!(identity, uint(prepare, "identity"));
            let checksum_body = view.frame.checksum_body.get();
            assert_eq!(checksum_body, uint(prepare, "checksum_body"));
            if checksum_body != 0 {
                assert_eq!(checksum_body, body_digest(&frame[HEADER_SIZE..]));
            }
            parent = identity;
        }
    }
    let coverage = arr(v, "body_coverage");
    let mut seen: Vec<([u8; HEADER_SIZE], Vec<u8>, u128)> = Vec::new();
    for entry in coverage {
        let frame = hex(entry, "frame_hex");
        let header = accepted_prepare(&frame, Command::Prepare);
        let identity = prepare_identity(&header);
        assert_eq!(identity, uint(entry, "identity"), "{}", name(entry));
        let checksum_body = u128::from_le_bytes(header[16..32].try_into().unwrap());
        assert_eq!(checksum_body, uint(entry, "checksum_body"));
        let body = frame[HEADER_SIZE..].to_vec();
        for (other_header, other_body, other_identity) in &seen {
            // The identity is a function of the header alone; the body reaches it only through
            // checksum_body.
            let mut a = header;
            let mut b = *other_header;
            a[..16].fill(0);
            b[..16].fill(0);
            a[52..56].fill(0);
            b[52..56].fill(0);
            assert_eq!(a == b, identity == *other_identity, "{}", name(entry));
            if a == b && body != *other_body {
                assert_eq!(
                    checksum_body,
                    0,
                    "{}: same header, different body, yet a body digest",
                    name(entry)
                );
            }
        }
        seen.push((header, body, identity));
    }
    for repair in arr(v, "repair_prepare") {
        let repair_frame = hex(repair, "repair_frame_hex");
        let header = accepted_prepare(&repair_frame, Command::RepairPrepare);
        let identity = uint(repair, "identity");
        assert_eq!(checksum_of(&header), identity);
        assert_eq!(prepare_identity(&header), identity);
        let mut restored = repair_frame.clone();
        restored[60] = Command::Prepare.byte();
        assert_eq!(restored, hex(repair, "restored_prepare_frame_hex"));
        let mut unrestored = header;
        unrestored[..16].fill(0);
        unrestored[52..56].fill(0);
        let wrong = u128::from(xxh3(&unrestored));
        assert_eq!(wrong, uint(repair, "hash_if_command_not_restored"));
        assert_ne!(wrong, identity);
    }
}

pub fn check_cluster(v: &Value) {
    expect_sections(v, &["cluster_ids"]);
    let ids = arr(v, "cluster_ids");
    assert!(!ids.is_empty());
    for entry in ids {
        let name = string(entry, "name_utf8");
        assert_eq!(name.as_bytes(), hex(entry, "name_hex"));
        assert_eq!(
            blake3::hash(name.as_bytes()).as_bytes().as_slice(),
            hex(entry, "blake3_hex")
        );
        let id = wire::cluster_id(name);
        assert_eq!(id, uint(entry, "cluster_id"), "{name:?}");
        assert_eq!(id.to_le_bytes().as_slice(), hex(entry, "cluster_id_le_hex"));
    }
}

fn key(entry: &Value) -> PartitionKey {
    PartitionKey {
        stream: uint(entry, "stream") as u32,
        topic: uint(entry, "topic") as u32,
        partition: uint(entry, "partition") as u32,
    }
}

pub fn check_groups(v: &Value) {
    expect_sections(
        v,
        &[
            "metadata_group",
            "packed_namespace_max",
            "pack",
            "pack_rejected",
            "unpack",
        ],
    );
    assert_eq!(u128::from(GroupId::METADATA.0), uint(v, "metadata_group"));
    assert_eq!(u128::from(PACKED_MAX), uint(v, "packed_namespace_max"));
    for entry in arr(v, "pack") {
        let group = GroupId::partition(key(entry)).unwrap_or_else(|e| panic!("{entry}: {e}"));
        assert_eq!(u128::from(group.0), uint(entry, "group"));
        assert_eq!(
            u128::from(group.0),
            u128::from_str_radix(string(entry, "group_hex").trim_start_matches("0x"), 16).unwrap()
        );
        assert_eq!(group.kind(), GroupKind::Partition(key(entry)));
    }
    for entry in arr(v, "pack_rejected") {
        assert!(GroupId::partition(key(entry)).is_err(), "{entry} packs");
    }
    for entry in arr(v, "unpack") {
        let group = GroupId(uint(entry, "group") as u64);
        let fields = group.fields();
        assert_eq!(u128::from(fields.stream), uint(entry, "stream_field"));
        assert_eq!(u128::from(fields.topic), uint(entry, "topic_field"));
        assert_eq!(u128::from(fields.partition), uint(entry, "partition_field"));
        assert_eq!(group.is_packable(), boolean(entry, "is_packable"));
    }
}
