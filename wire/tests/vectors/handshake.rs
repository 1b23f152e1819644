//! handshake.json, and the handshake frames of frames.json (handshake.md).
//!
//! Every MAC, transcript and frame is recomputed with the crate and compared with the file; the
//! behaviour tables are replayed through the crate's `Acceptor` and `Dialer`.

use serde_json::Value;
use wire::Command;
use wire::handshake::{
    ALPN, Acceptor, AcceptorConfig, Binding, DOMAIN_TAG, Dialer, DialerConfig, Direction,
    EXPORTER_LABEL, EXPORTER_LEN, Frame, KEY_CONTEXT, Keys, MAC_LEN, Mac, MacKey, NO_NONCE,
    NONCE_LEN, Nonce, Reason, Status, Step, Transcript, challenge_frame, finish_frame, hello_frame,
    mac, reject_frame,
};
use wire::header::{self, FieldKind, Layout, ReplicaChallenge, ReplicaHello};

use crate::common::{
    arr, as_uint, boolean, decode_hex, expect_sections, get, header_of, hex, name, obj, opt,
    string, uint,
};

const SECTIONS: &[&str] = &[
    "constants",
    "cases",
    "auth_disabled",
    "rejects",
    "status_decode",
    "verify",
    "acceptor_behaviour",
    "dialer_behaviour",
];

/// The acceptor nonce this test draws; any value works, the tables are nonce independent.
const OUR_NONCE_A: Nonce = [0x5a; NONCE_LEN];
/// The dialer nonce this test draws.
const OUR_NONCE_D: Nonce = [0x3c; NONCE_LEN];

pub fn check(v: &Value) {
    expect_sections(v, SECTIONS);
    check_constants(get(v, "constants"));
    for case in arr(v, "cases") {
        check_case(case);
    }
    for entry in arr(v, "auth_disabled") {
        check_auth_disabled(entry);
    }
    for entry in arr(v, "rejects") {
        check_reject(entry);
    }
    for entry in arr(v, "status_decode") {
        check_status_decode(entry);
    }
    for entry in arr(v, "verify") {
        check_verify(entry);
    }
    for entry in arr(v, "acceptor_behaviour") {
        check_acceptor_behaviour(entry);
    }
    for entry in arr(v, "dialer_behaviour") {
        check_dialer_behaviour(entry);
    }
}

// ---- reading --------------------------------------------------------------------------------

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> [u8; N] {
    bytes
        .try_into()
        .unwrap_or_else(|_| panic!("{what}: {} bytes, expected {N}", bytes.len()))
}

fn bytes32(v: &Value, key: &str) -> [u8; 32] {
    fixed(&hex(v, key), key)
}

fn byte(v: &Value, key: &str) -> u8 {
    u8::try_from(uint(v, key)).unwrap_or_else(|_| panic!("{key:?} does not fit a byte"))
}

fn frame(v: &Value, key: &str) -> Frame {
    fixed(&hex(v, key), key)
}

/// A secret given as UTF-8 text; the raw bytes are the secret (§4, no trimming).
fn secret<'a>(v: &'a Value, key: &str) -> Option<&'a [u8]> {
    opt(v, key).map(|s| s.as_str().expect("secret is a string").as_bytes())
}

fn binding(v: &Value) -> Binding {
    let binding = match string(v, "mode") {
        "plaintext" => Binding::Plaintext,
        "tls" => Binding::Tls {
            exporter: bytes32(v, "exporter_hex"),
        },
        mode => panic!("unknown binding mode {mode:?}: the test has fallen behind"),
    };
    if opt(v, "mode_byte").is_some() {
        assert_eq!(
            uint(v, "mode_byte"),
            u128::from(binding.mode_byte()),
            "mode_byte"
        );
    }
    if opt(v, "exporter_hex").is_some() {
        assert_eq!(
            bytes32(v, "exporter_hex"),
            binding.exporter(),
            "exporter_hex"
        );
    }
    binding
}

fn direction(name: &str) -> Direction {
    match name {
        "dialer" => Direction::Dialer,
        "acceptor" => Direction::Acceptor,
        other => panic!("unknown direction {other:?}: the test has fallen behind"),
    }
}

/// The spec's status names in the vectors' spelling (handshake.md §3).
fn status_label(label: &str) -> Status {
    match label {
        "ok" => Status::Ok,
        "unknown_command" => Status::UnknownCommand,
        "cluster_mismatch" => Status::ClusterMismatch,
        "directional_rule" => Status::DirectionalRule,
        "auth_required" => Status::AuthRequired,
        "mac_mismatch" => Status::MacMismatch,
        other => panic!("unknown status label {other:?}: the test has fallen behind"),
    }
}

fn transcript(v: &Value) -> Transcript {
    Transcript {
        cluster: uint(v, "cluster_id"),
        dialer_id: byte(v, "dialer_id"),
        acceptor_id: byte(v, "acceptor_id"),
        nonce_d: bytes32(v, "nonce_d_hex"),
        nonce_a: bytes32(v, "nonce_a_hex"),
        binding: binding(get(v, "binding")),
    }
}

/// `auth_enabled` plus the two secrets of a behaviour `config`.
fn auth(config: &Value) -> Option<Keys> {
    boolean(config, "auth_enabled").then(|| {
        let current = secret(config, "shared_secret_utf8").expect("auth enabled without secret");
        Keys::new(current, secret(config, "previous_shared_secret_utf8")).expect("valid secrets")
    })
}

fn nonce_of(frame: &[u8]) -> Nonce {
    ReplicaHello::view(frame).expect("whole header").nonce
}

fn mac_of(frame: &[u8]) -> Mac {
    ReplicaChallenge::view(frame).expect("whole header").mac
}

// ---- sections -------------------------------------------------------------------------------

fn check_constants(c: &Value) {
    assert_eq!(string(c, "domain_tag_utf8").as_bytes(), DOMAIN_TAG);
    assert_eq!(string(c, "key_derivation_context"), KEY_CONTEXT);
    assert_eq!(string(c, "exporter_label_utf8").as_bytes(), EXPORTER_LABEL);
    assert_eq!(string(c, "alpn").as_bytes(), ALPN);
    assert_eq!(uint(c, "exporter_len"), EXPORTER_LEN as u128);
    assert_eq!(uint(c, "dir_dialer"), u128::from(Direction::Dialer.byte()));
    assert_eq!(
        uint(c, "dir_acceptor"),
        u128::from(Direction::Acceptor.byte())
    );
    // Lengths and the status offset are also pinned by the header views the frames are built on.
    let field = |layout: &str, name: &str| {
        header::layout_fields(layout)
            .expect("layout")
            .find(|f| f.name == name)
            .copied()
            .expect("field")
    };
    assert_eq!(uint(c, "nonce_len"), NONCE_LEN as u128);
    assert_eq!(field("ReplicaHello", "nonce").size, NONCE_LEN);
    assert_eq!(uint(c, "mac_len"), MAC_LEN as u128);
    assert_eq!(field("ReplicaChallenge", "mac").size, MAC_LEN);
    assert_eq!(
        uint(c, "status_offset_in_frame"),
        field("ReplicaChallenge", "status").offset as u128
    );
}

fn check_case(case: &Value) {
    let who = name(case);
    let secret = secret(case, "shared_secret_utf8").expect("case secret");
    assert_eq!(secret, hex(case, "shared_secret_hex"), "{who}: secret hex");
    let key = MacKey::derive(secret);
    assert_eq!(
        key.as_bytes()[..],
        hex(case, "derived_key_hex"),
        "{who}: derived key"
    );
    let cluster = uint(case, "cluster_id");
    if let Some(cluster_name) = opt(case, "cluster_name").and_then(Value::as_str) {
        assert_eq!(wire::cluster_id(cluster_name), cluster, "{who}: cluster id");
    }
    let t = transcript(case);
    let (dialer_id, acceptor_id) = (t.dialer_id, t.acceptor_id);
    let pre_a = t.bytes(Direction::Acceptor);
    let pre_d = t.bytes(Direction::Dialer);
    assert_eq!(
        pre_a[..],
        hex(case, "mac_a_preimage_hex"),
        "{who}: mac_a preimage"
    );
    assert_eq!(
        pre_d[..],
        hex(case, "mac_d_preimage_hex"),
        "{who}: mac_d preimage"
    );
    let (mac_a, mac_d) = (mac(&key, &pre_a), mac(&key, &pre_d));
    assert_eq!(mac_a[..], hex(case, "mac_a_hex"), "{who}: mac_a");
    assert_eq!(mac_d[..], hex(case, "mac_d_hex"), "{who}: mac_d");

    let hello = frame(case, "hello_frame_hex");
    let challenge = frame(case, "challenge_frame_hex");
    let finish = frame(case, "finish_frame_hex");
    assert_eq!(
        hello_frame(cluster, dialer_id, &t.nonce_d, 0),
        hello,
        "{who}: hello"
    );
    assert_eq!(
        challenge_frame(cluster, acceptor_id, &t.nonce_a, &mac_a),
        challenge,
        "{who}"
    );
    assert_eq!(
        finish_frame(cluster, dialer_id, &mac_d),
        finish,
        "{who}: finish"
    );

    // The machines, given the case's nonces, write exactly these three frames.
    let keys = || Some(Keys::new(secret, None).expect("valid secret"));
    let mut dialer = Dialer::new(DialerConfig::new(
        cluster,
        dialer_id,
        acceptor_id,
        keys(),
        t.binding,
        0,
    ));
    let count = acceptor_id.saturating_add(1);
    let config = AcceptorConfig::new(cluster, acceptor_id, count, keys(), t.binding);
    let mut acceptor = Acceptor::new(config, t.nonce_a);
    assert_eq!(
        dialer.start(t.nonce_d),
        Step::Continue { send: hello },
        "{who}"
    );
    assert_eq!(
        acceptor.on_frame(&hello),
        Step::Continue { send: challenge },
        "{who}"
    );
    let accepted = Step::Accept {
        send: Some(finish),
        peer: acceptor_id,
    };
    assert_eq!(dialer.on_frame(&challenge), accepted, "{who}");
    let accepted = Step::Accept {
        send: None,
        peer: dialer_id,
    };
    assert_eq!(acceptor.on_frame(&finish), accepted, "{who}");
}

fn check_auth_disabled(entry: &Value) {
    let who = name(entry);
    let cluster = uint(entry, "cluster_id");
    let dialer_id = byte(entry, "dialer_id");
    let hello = frame(entry, "hello_frame_hex");
    assert_eq!(
        hello_frame(cluster, dialer_id, &NO_NONCE, 0),
        hello,
        "{who}"
    );
    let Some(peer) = dialer_id.checked_add(1) else {
        return;
    };
    let config = DialerConfig::new(cluster, dialer_id, peer, None, Binding::Plaintext, 0);
    let step = Dialer::new(config).start(OUR_NONCE_D);
    assert_eq!(
        step,
        Step::Accept {
            send: Some(hello),
            peer
        },
        "{who}"
    );
    let config = AcceptorConfig::new(cluster, peer, peer, None, Binding::Plaintext);
    let step = Acceptor::new(config, OUR_NONCE_A).on_frame(&hello);
    assert_eq!(
        step,
        Step::Accept {
            send: None,
            peer: dialer_id
        },
        "{who}"
    );
}

fn check_reject(entry: &Value) {
    let who = name(entry);
    let status_byte = byte(entry, "status");
    let status = status_label(string(entry, "status_label"));
    assert_eq!(status.byte(), status_byte, "{who}: label vs byte");
    let acceptor_id = byte(entry, "acceptor_id");
    let expected = frame(entry, "challenge_frame_hex");
    // The entry does not name the cluster; the frame's own is taken, every other byte rebuilt.
    let cluster = ReplicaChallenge::view(&expected)
        .unwrap()
        .frame
        .cluster
        .get();
    assert_eq!(
        reject_frame(cluster, acceptor_id, status),
        expected,
        "{who}"
    );
    // A dialer reads it as a rejection with that status.
    let mut dialer = Dialer::new(DialerConfig::new(
        cluster,
        0,
        acceptor_id,
        Keys::new(&[1; 32], None).ok(),
        Binding::Plaintext,
        0,
    ));
    dialer.start(OUR_NONCE_D);
    let step = dialer.on_frame(&expected);
    assert_eq!(
        step,
        Step::Close {
            send: None,
            reason: Reason::Rejected(status)
        },
        "{who}"
    );
}

fn check_status_decode(entry: &Value) {
    let raw = byte(entry, "byte");
    let decoded = Status::decode(raw);
    assert_eq!(
        decoded,
        status_label(string(entry, "decoded")),
        "status byte {raw}"
    );
    let proceeds = boolean(entry, "dialer_proceeds");
    assert_eq!(decoded.proceeds(), proceeds, "status byte {raw}");
    // The dialer machine agrees: a non-proceeding status closes before the MAC is looked at.
    let keys = Keys::new(&[1; 32], None).ok();
    let mut dialer = Dialer::new(DialerConfig::new(0, 0, 1, keys, Binding::Plaintext, 0));
    dialer.start(OUR_NONCE_D);
    let mut challenge = challenge_frame(0, 1, &OUR_NONCE_A, &[0; MAC_LEN]);
    challenge[ReplicaChallenge::FIELDS
        .iter()
        .find(|f| f.name == "status")
        .unwrap()
        .offset] = raw;
    let expected = if proceeds {
        Reason::MacMismatch
    } else {
        Reason::Rejected(decoded)
    };
    let step = dialer.on_frame(&challenge);
    assert_eq!(
        step,
        Step::Close {
            send: None,
            reason: expected
        },
        "status byte {raw}"
    );
}

fn check_verify(entry: &Value) {
    let who = name(entry);
    let signer = MacKey::derive(secret(entry, "signer_secret_utf8").expect("signer secret"));
    let signed = transcript(get(entry, "signed_transcript"))
        .bytes(direction(string(entry, "signed_direction")));
    let received: Mac = bytes32(entry, "mac_hex");
    assert_eq!(mac(&signer, &signed), received, "{who}: mac");
    let current = secret(entry, "verifier_shared_secret_utf8").expect("verifier secret");
    let previous = secret(entry, "verifier_previous_shared_secret_utf8");
    let keys = Keys::new(current, previous).expect("valid verifier secrets");
    let verified = transcript(get(entry, "verified_transcript"))
        .bytes(direction(string(entry, "verified_direction")));
    assert_eq!(
        keys.verify(&verified, &received),
        boolean(entry, "accepted"),
        "{who}"
    );
}

// ---- behaviour tables -----------------------------------------------------------------------

/// What a machine did over one connection: frames written and the final verdict.
#[derive(Default)]
struct Run {
    written: Vec<Frame>,
    /// `Some(peer)` when accepted; `None` when closed or still waiting when the peer went away.
    accepted: Option<u8>,
    done: bool,
}

impl Run {
    fn record(&mut self, step: Step) {
        assert!(!self.done, "a step after the machine finished: {step:?}");
        match step {
            Step::Continue { send } => self.written.push(send),
            Step::Accept { send, peer } => {
                self.written.extend(send);
                self.accepted = Some(peer);
                self.done = true;
            }
            Step::Close { send, .. } => {
                self.written.extend(send);
                self.done = true;
            }
        }
    }

    fn compare(&self, entry: &Value, who: &str) {
        let outcome = get(entry, "outcome");
        assert_eq!(
            self.accepted.is_some(),
            boolean(outcome, "accepted"),
            "{who}: outcome"
        );
        if let Some(peer) = opt(outcome, "peer_id") {
            assert_eq!(
                self.accepted.map(u128::from),
                as_uint(peer),
                "{who}: peer id"
            );
        }
        let expected = arr(entry, "written");
        assert_eq!(self.written.len(), expected.len(), "{who}: frames written");
        for (got, want) in self.written.iter().zip(expected) {
            compare_written(got, want, who);
        }
    }
}

fn compare_written(got: &Frame, want: &Value, who: &str) {
    let common = &ReplicaChallenge::view(got).unwrap().frame;
    assert_eq!(
        uint(want, "command"),
        u128::from(common.command),
        "{who}: command"
    );
    assert_eq!(
        uint(want, "size"),
        u128::from(common.size.get()),
        "{who}: size"
    );
    let status_offset = ReplicaChallenge::FIELDS
        .iter()
        .find(|f| f.name == "status")
        .unwrap();
    assert_eq!(
        byte(want, "status_byte"),
        got[status_offset.offset],
        "{who}: status byte"
    );
    match opt(want, "frame_hex") {
        Some(_) => assert_eq!(got[..], hex(want, "frame_hex"), "{who}: frame"),
        None => assert_eq!(
            got[..128],
            hex(want, "header_prefix_hex_0_128"),
            "{who}: prefix"
        ),
    }
}

fn expect_side(entry: &Value, side: &str) {
    let found = string(entry, "side");
    assert!(
        ["acceptor", "dialer"].contains(&found),
        "unknown side {found:?}: the test has fallen behind"
    );
    assert_eq!(found, side, "{}: side", name(entry));
}

fn check_acceptor_behaviour(entry: &Value) {
    let who = name(entry);
    expect_side(entry, "acceptor");
    let config = get(entry, "config");
    let cluster = uint(entry, "cluster_id");
    let self_id = byte(config, "self_id");
    let binding = binding(get(config, "binding"));
    let keys = auth(config);
    let acceptor_config = AcceptorConfig::new(
        cluster,
        self_id,
        byte(config, "replica_count"),
        keys.clone(),
        binding,
    );
    let mut acceptor = Acceptor::new(acceptor_config, OUR_NONCE_A);
    let mut run = Run::default();
    if let Some(inbound) = opt(entry, "inbound_frames_hex") {
        let inbound = inbound.as_array().expect("inbound_frames_hex is an array");
        for frame in inbound {
            if run.done {
                break;
            }
            let frame = decode_hex(frame.as_str().expect("hex frame"));
            run.record(acceptor.on_frame(&frame));
        }
    } else {
        let peer = get(entry, "peer");
        play_dialer(&mut acceptor, &mut run, peer, cluster, self_id);
        if let (Some(keys), Some(_), Some(_)) = (
            &keys,
            opt(entry, "observed_challenge_hex"),
            opt(entry, "observed_finish_hex"),
        ) {
            check_observed(entry, peer, keys, binding, cluster, self_id);
        }
    }
    run.compare(entry, &who);
}

/// The scripted dialer of the README: hello with `nonce_d`, then a frame with `finish_command`
/// carrying the dialer MAC over the received `nonce_a`.
fn play_dialer(acceptor: &mut Acceptor, run: &mut Run, peer: &Value, cluster: u128, self_id: u8) {
    let dialer_id = byte(peer, "dialer_id");
    let nonce_d = bytes32(peer, "nonce_d_hex");
    run.record(acceptor.on_frame(&hello_frame(cluster, dialer_id, &nonce_d, 0)));
    let Some(challenge) = run.written.last().filter(|_| !run.done) else {
        return;
    };
    let finish = scripted_finish(peer, cluster, self_id, nonce_of(challenge));
    run.record(acceptor.on_frame(&finish));
}

fn scripted_finish(peer: &Value, cluster: u128, acceptor_id: u8, nonce_a: Nonce) -> Frame {
    let dialer_id = byte(peer, "dialer_id");
    let transcript = Transcript {
        cluster,
        dialer_id,
        acceptor_id,
        nonce_d: bytes32(peer, "nonce_d_hex"),
        nonce_a,
        binding: binding(get(peer, "binding")),
    };
    let key = MacKey::derive(secret(peer, "signs_with_secret_utf8").expect("peer secret"));
    let mut finish = finish_frame(
        cluster,
        dialer_id,
        &mac(&key, &transcript.bytes(Direction::Dialer)),
    );
    finish[header::FRAME_FIELDS
        .iter()
        .find(|f| f.name == "command")
        .unwrap()
        .offset] = byte(peer, "finish_command");
    finish
}

/// The recorded run is self-consistent under this crate: the observed challenge is what our
/// acceptor would write with that nonce, and the observed finish what the scripted dialer writes.
fn check_observed(
    entry: &Value,
    peer: &Value,
    keys: &Keys,
    binding: Binding,
    cluster: u128,
    self_id: u8,
) {
    let who = name(entry);
    let challenge = hex(entry, "observed_challenge_hex");
    let nonce_a = nonce_of(&challenge);
    let transcript = Transcript {
        cluster,
        dialer_id: byte(peer, "dialer_id"),
        acceptor_id: self_id,
        nonce_d: bytes32(peer, "nonce_d_hex"),
        nonce_a,
        binding,
    };
    let mac_a = keys.sign(&transcript.bytes(Direction::Acceptor));
    assert_eq!(
        challenge_frame(cluster, self_id, &nonce_a, &mac_a)[..],
        challenge,
        "{who}"
    );
    let finish = scripted_finish(peer, cluster, self_id, nonce_a);
    assert_eq!(
        finish[..],
        hex(entry, "observed_finish_hex"),
        "{who}: observed finish"
    );
}

fn check_dialer_behaviour(entry: &Value) {
    let who = name(entry);
    expect_side(entry, "dialer");
    let config = get(entry, "config");
    let cluster = uint(entry, "cluster_id");
    let self_id = byte(config, "self_id");
    let peer_id = byte(entry, "peer_id");
    let binding = binding(get(config, "binding"));
    let dialer_config = DialerConfig::new(cluster, self_id, peer_id, auth(config), binding, 0);
    let mut dialer = Dialer::new(dialer_config);
    let mut run = Run::default();
    run.record(dialer.start(OUR_NONCE_D));
    let recipe = get(entry, "reply_recipe");
    let reply = scripted_reply(recipe, OUR_NONCE_D);
    if let (false, Some(reply)) = (run.done, reply) {
        run.record(dialer.on_frame(&reply));
    }
    run.compare(entry, &who);
    let finish = Command::ReplicaFinish.byte();
    let finish_written = run.written.iter().any(|f| f[60] == finish);
    assert_eq!(
        finish_written,
        boolean(entry, "finish_written"),
        "{who}: finish_written"
    );
    if let (Some(_), Some(_)) = (
        opt(entry, "observed_hello_hex"),
        opt(entry, "observed_reply_hex"),
    ) {
        // The recorded reply is what the recipe yields for the recorded hello's nonce.
        let observed_nonce = nonce_of(&hex(entry, "observed_hello_hex"));
        let rebuilt = scripted_reply(recipe, observed_nonce).expect("recipe with a reply");
        assert_eq!(
            rebuilt[..],
            hex(entry, "observed_reply_hex"),
            "{who}: observed reply"
        );
    }
}

/// The scripted acceptor's answer to a hello carrying `nonce_d`.
fn scripted_reply(recipe: &Value, nonce_d: Nonce) -> Option<Vec<u8>> {
    match string(recipe, "kind") {
        "none" => None,
        "fixed_frame" => Some(hex(recipe, "frame_hex")),
        "challenge_ok" => {
            let t = get(recipe, "mac_transcript");
            let transcript = Transcript {
                cluster: uint(t, "cluster_id"),
                dialer_id: byte(t, "dialer_id"),
                acceptor_id: byte(t, "acceptor_id"),
                nonce_d,
                nonce_a: bytes32(recipe, "nonce_a_hex"),
                binding: binding(get(t, "binding")),
            };
            let key = MacKey::derive(secret(recipe, "mac_secret_utf8").expect("mac secret"));
            let mac_a = mac(&key, &transcript.bytes(Direction::Acceptor));
            let cluster = uint(recipe, "frame_cluster_id");
            let replica = byte(recipe, "frame_replica");
            Some(challenge_frame(cluster, replica, &transcript.nonce_a, &mac_a).to_vec())
        }
        kind => panic!("unknown reply_recipe kind {kind:?}: the test has fallen behind"),
    }
}

// ---- frames.json ----------------------------------------------------------------------------

/// One handshake frame of frames.json, decoded.
struct HsFrame {
    who: String,
    command: Command,
    bytes: Frame,
    cluster: u128,
    replica: u8,
    nonce: Nonce,
    mac: Mac,
    status: u8,
}

pub fn check_frames(frames: &Value, handshake: &Value) {
    let decoded: Vec<HsFrame> = arr(frames, "frames")
        .iter()
        .filter(|f| string(f, "integrity") == "handshake_mac")
        .map(decode_frame)
        .collect();
    let cases = arr(handshake, "cases");
    // Candidate signing inputs: every secret and binding the same set's cases use.
    let mut secrets: Vec<&[u8]> = cases
        .iter()
        .filter_map(|c| secret(c, "shared_secret_utf8"))
        .collect();
    secrets.dedup();
    let mut bindings: Vec<Binding> = cases.iter().map(|c| binding(get(c, "binding"))).collect();
    bindings.dedup();
    for frame in &decoded {
        rebuild(frame);
        if !tie_to_case(frame, cases) {
            tie_to_exchange(frame, &decoded, &secrets, &bindings);
        }
    }
}

fn decode_frame(entry: &Value) -> HsFrame {
    let who = name(entry);
    let command = Command::from_byte(byte(entry, "command")).expect("command byte");
    assert_eq!(
        string(entry, "layout"),
        command.layout_name(),
        "{who}: layout"
    );
    assert_eq!(
        string(entry, "command_name"),
        command.name(),
        "{who}: command name"
    );
    let bytes_all = hex(entry, "frame_hex");
    assert_eq!(
        bytes_all,
        [hex(entry, "header_hex"), hex(entry, "body_hex")].concat(),
        "{who}"
    );
    // Builders write headers; the size field (compared below) says whether there is a body.
    let bytes: Frame = header_of(&bytes_all);
    // Field by field against the crate's layout table.
    let fields = get(entry, "fields");
    for field in header::layout_fields(command.layout_name()).expect("known layout") {
        let want = obj(fields)
            .get(field.name)
            .unwrap_or_else(|| panic!("{who}: {}", field.name));
        match field.kind {
            FieldKind::Bytes => assert_eq!(
                field.bytes(&bytes),
                decode_hex(want.as_str().expect("hex")),
                "{who}: {}",
                field.name
            ),
            _ => assert_eq!(
                field.read_uint(&bytes),
                as_uint(want),
                "{who}: {}",
                field.name
            ),
        }
    }
    let common = &ReplicaChallenge::view(&bytes).unwrap().frame;
    assert_eq!(common.command, command.byte(), "{who}");
    let (cluster, replica) = (common.cluster.get(), common.replica);
    let status_field = ReplicaChallenge::FIELDS
        .iter()
        .find(|f| f.name == "status")
        .unwrap();
    HsFrame {
        command,
        cluster,
        replica,
        nonce: nonce_of(&bytes),
        mac: mac_of(&bytes),
        status: bytes[status_field.offset],
        bytes,
        who,
    }
}

/// The crate's builders reproduce the frame from its decoded fields.
fn rebuild(f: &HsFrame) {
    let lane_offset = header::HELLO_LANE_OFFSET;
    let rebuilt = match f.command {
        Command::ReplicaHello => hello_frame(f.cluster, f.replica, &f.nonce, f.bytes[lane_offset]),
        Command::ReplicaChallenge if f.status == Status::Ok.byte() => {
            challenge_frame(f.cluster, f.replica, &f.nonce, &f.mac)
        }
        Command::ReplicaChallenge => reject_frame(f.cluster, f.replica, Status::decode(f.status)),
        Command::ReplicaFinish => finish_frame(f.cluster, f.replica, &f.mac),
        other => panic!("{}: {other} is not a handshake command", f.who),
    };
    assert_eq!(rebuilt, f.bytes, "{}: rebuilt from fields", f.who);
}

/// A case of handshake.json with the same nonce (hello, challenge) or MAC (finish): the frame must
/// be that case's frame.
fn tie_to_case(f: &HsFrame, cases: &[Value]) -> bool {
    let (key, slot, value) = match f.command {
        Command::ReplicaHello => ("hello_frame_hex", "nonce_d_hex", f.nonce),
        Command::ReplicaChallenge => ("challenge_frame_hex", "nonce_a_hex", f.nonce),
        _ => ("finish_frame_hex", "mac_d_hex", f.mac),
    };
    let Some(case) = cases.iter().find(|c| bytes32(c, slot) == value) else {
        return false;
    };
    assert_eq!(
        f.bytes[..],
        hex(case, key),
        "{}: differs from case {}",
        f.who,
        name(case)
    );
    true
}

/// An ok challenge or a finish whose exchange partners are in frames.json must carry a MAC that
/// verifies under one of the set's secrets and bindings (README: same set, same secret).
fn tie_to_exchange(f: &HsFrame, all: &[HsFrame], secrets: &[&[u8]], bindings: &[Binding]) {
    let of = |command: Command| {
        all.iter()
            .filter(move |o| o.command == command && o.cluster == f.cluster)
    };
    let challenges = || of(Command::ReplicaChallenge).filter(|c| c.status == Status::Ok.byte());
    let (direction, pairs): (Direction, Vec<(&HsFrame, &HsFrame)>) = match f.command {
        Command::ReplicaChallenge if f.status == Status::Ok.byte() => (
            Direction::Acceptor,
            of(Command::ReplicaHello)
                .filter(|h| h.replica < f.replica)
                .map(|h| (h, f))
                .collect(),
        ),
        Command::ReplicaFinish => (
            Direction::Dialer,
            of(Command::ReplicaHello)
                .filter(|h| h.replica == f.replica)
                .flat_map(|h| {
                    challenges()
                        .filter(move |c| c.replica > h.replica)
                        .map(move |c| (h, c))
                })
                .collect(),
        ),
        _ => return,
    };
    if pairs.is_empty() {
        return;
    }
    let verifies = pairs.iter().any(|(hello, challenge)| {
        secrets.iter().any(|secret| {
            bindings.iter().any(|&binding| {
                let transcript = Transcript {
                    cluster: f.cluster,
                    dialer_id: hello.replica,
                    acceptor_id: challenge.replica,
                    nonce_d: hello.nonce,
                    nonce_a: challenge.nonce,
                    binding,
                };
                let keys = Keys::new(secret, None).expect("valid secret");
                keys.verify(&transcript.bytes(direction), &f.mac)
            })
        })
    });
    assert!(
        verifies,
        "{}: MAC does not verify under the set's secret",
        f.who
    );
}
