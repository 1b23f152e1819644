//! Golden vectors of binary protocol 0.11.0, checked in both directions.
//!
//! Reads every file of the directory named by `STRAND_VECTORS` (default: `shared/vectors` beside
//! the workspace root) and fails when the directory is missing, when it holds a file this test
//! does not know, or when an entry has a section or enum value the test does not understand.
//! Every expectation comes from the files; nothing is copied out of them into code.

mod common;
mod frames;
mod handshake;
mod manifests;
mod small;

use common::Vectors;

#[test]
fn every_file_is_understood() {
    let vectors = Vectors::open();
    let known = [
        "README.md",
        "frames.json",
        "negatives.json",
        "identity.json",
        "cluster.json",
        "groups.json",
        "manifests.json",
        "handshake.json",
    ];
    for name in vectors.file_names() {
        assert!(
            known.contains(&name.as_str()),
            "unknown vector file {name}: the test has fallen behind"
        );
    }
    for name in known.iter().filter(|n| n.ends_with(".json")) {
        assert!(
            vectors.has(name),
            "vector file {name} is missing from {}",
            vectors.dir.display()
        );
    }
}

#[test]
fn frames() {
    frames::check_frames(&Vectors::open().json("frames.json"));
}

#[test]
fn negatives() {
    frames::check_negatives(&Vectors::open().json("negatives.json"));
}

#[test]
fn identity() {
    small::check_identity(&Vectors::open().json("identity.json"));
}

#[test]
fn cluster() {
    small::check_cluster(&Vectors::open().json("cluster.json"));
}

#[test]
fn groups() {
    small::check_groups(&Vectors::open().json("groups.json"));
}

#[test]
fn manifests() {
    manifests::check(&Vectors::open().json("manifests.json"));
}

#[test]
fn handshake() {
    let vectors = Vectors::open();
    handshake::check(&vectors.json("handshake.json"));
    handshake::check_frames(
        &vectors.json("frames.json"),
        &vectors.json("handshake.json"),
    );
}
