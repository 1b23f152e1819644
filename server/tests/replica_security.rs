//! The replica plane's security across real processes (issue 10 item 6): a peer with the wrong
//! cluster name, the wrong secret, or no TLS when TLS is on never gets a connection
//! established, so no frame of it is processed; garbage, a 4 GiB size field and a command byte
//! above 29 on an established connection close that connection and nothing else. Checked on
//! the node's `/metrics` counters, and the cluster keeps committing throughout.
//!
//! Each cluster runs replicas 1 and 2 of a three-node roster (a quorum of two); the attacker
//! speaks as the absent replica 0, which dials every higher id, so its connections never
//! collide with a real node's. Commits come from the test hook (decision 138).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use wire::HEADER_SIZE;
use wire::handshake::{
    Binding, Dialer, DialerConfig, Direction, Keys, NONCE_LEN, Step, Transcript, finish_frame,
    hello_frame,
};

const SECRET: &str = "a-test-shared-secret-of-32-bytes-or-more";

/// The attacker's nonce (the acceptor draws its own; this side needs none random).
const NONCE: [u8; NONCE_LEN] = [7; NONCE_LEN];

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    stream
}

/// Reads one 256-byte handshake frame.
fn read_frame(stream: &mut TcpStream) -> [u8; HEADER_SIZE] {
    let mut frame = [0u8; HEADER_SIZE];
    stream.set_read_timeout(Some(BOUND)).unwrap();
    stream.read_exact(&mut frame).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    frame
}

/// Waits until the node closes `stream` (end of stream or a reset), within [`BOUND`]; whatever
/// arrives before is discarded.
fn closed_by_node(stream: &mut TcpStream, what: &str) {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < BOUND {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
    panic!("{what}: the node kept the connection open for {BOUND:?}");
}

/// Establishes a connection to replica 2 as replica 0 on `lane`, with the right cluster and
/// secret (plaintext binding).
fn establish(port: u16, cluster: u128, lane: u8) -> TcpStream {
    let mut stream = connect(port);
    let keys = Keys::new(SECRET.as_bytes(), None).unwrap();
    let mut dialer = Dialer::new(DialerConfig::new(
        cluster,
        0,
        2,
        Some(keys),
        Binding::Plaintext,
        lane,
    ));
    let mut step = dialer.start(NONCE);
    loop {
        match step {
            Step::Continue { send } => {
                stream.write_all(&send).unwrap();
                let challenge = read_frame(&mut stream);
                step = dialer.on_frame(&challenge);
            }
            Step::Accept { send, .. } => {
                if let Some(frame) = send {
                    stream.write_all(&frame).unwrap();
                }
                return stream;
            }
            Step::Close { reason, .. } => panic!("the handshake failed: {reason}"),
        }
    }
}

/// A 256-byte header with `size` at byte 48 and `command` at byte 60, everything else zero.
fn header(size: u32, command: u8) -> [u8; HEADER_SIZE] {
    let mut frame = [0u8; HEADER_SIZE];
    frame[48..52].copy_from_slice(&size.to_le_bytes());
    frame[60] = command;
    frame
}

/// A counter of shard 0's replica plane (`strand_{name}{shard="0"[,reason="..."]}`).
fn counter(all: &BTreeMap<String, u64>, name: &str, reason: Option<&str>) -> u64 {
    let key = match reason {
        Some(r) => format!("strand_{name}{{shard=\"0\",reason=\"{r}\"}}"),
        None => format!("strand_{name}{{shard=\"0\"}}"),
    };
    *all.get(&key).unwrap_or_else(|| panic!("no {key}"))
}

/// Every `replica_connections_closed_total` reason of shard 0.
fn closes(all: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    all.iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("strand_replica_connections_closed_total{shard=\"0\",reason=\"")
                .map(|r| (r.trim_end_matches("\"}").to_owned(), *v))
        })
        .collect()
}

fn scrape_ok(http: u16) -> BTreeMap<String, u64> {
    scrape(http).expect("the node answers /metrics")
}

/// The node counts a refusal or a close right after it closes the socket, so the counters are
/// read once `ready` holds (or after [`BOUND`], for the assertions to report).
fn settled(http: u16, ready: impl Fn(&BTreeMap<String, u64>) -> bool) -> BTreeMap<String, u64> {
    let start = Instant::now();
    loop {
        let all = scrape_ok(http);
        if ready(&all) || start.elapsed() > BOUND {
            return all;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts replicas 1 and 2 of `config` and waits until they commit.
fn start_pair(dir: &Path, config: &str) -> (Vec<Node>, std::path::PathBuf) {
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config).unwrap();
    let logs = dir.join("nodes.log");
    let ports: Vec<u16> = config
        .lines()
        .filter_map(|l| l.strip_prefix("ports = { tcp = "))
        .flat_map(|l| {
            l.split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse::<u16>().unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut nodes = nodes(dir, 3, &ports);
    for node in nodes.iter_mut().skip(1) {
        spawn(&config_path, node, &logs, &[]);
    }
    (nodes, logs)
}

fn committing(nodes: &[Node], logs: &Path, above: u64) -> u64 {
    let pair: Vec<&Node> = nodes.iter().skip(1).collect();
    wait_until("the pair commits", &pair, logs, |all| {
        one_primary(all) && all.iter().all(|m| m["commit_min"] > above)
    })
    .iter()
    .map(|m| m["commit_min"])
    .min()
    .unwrap()
}

/// Plaintext with authentication: the wrong cluster name and the wrong secret are refused in
/// the handshake; garbage, a 4 GiB size field and a command byte above 29 close only their own
/// connection.
#[test]
fn refused_peers_and_bad_frames_close_only_their_connection() {
    let _serial = serial();
    let dir = scratch("security-plain");
    let ports = free_ports(9);
    let text = config(
        "security-e2e",
        3,
        &ports,
        &format!("\n[cluster.auth]\nenabled = true\nshared_secret = \"{SECRET}\"\n"),
    );
    let (mut nodes, logs) = start_pair(&dir, &text);
    let cluster = wire::cluster_id("security-e2e");
    let target = nodes[2].replica_port;
    let http = nodes[2].http;
    let peer_http = nodes[1].http;
    run_cluster(&mut nodes, &logs, |nodes| {
        let mut committed = committing(nodes, &logs, 2);
        let before = scrape_ok(http);
        let peer_before = closes(&scrape_ok(peer_http));

        // 1. Another cluster name: the hello is refused, nothing is established.
        let mut stream = connect(target);
        stream
            .write_all(&hello_frame(wire::cluster_id("another"), 0, &NONCE, 1))
            .unwrap();
        // A consensus-looking frame after it is never read as one.
        stream.write_all(&header(256, 7)).ok();
        closed_by_node(&mut stream, "wrong cluster");

        // 2. The wrong secret: the challenge arrives, the finish's MAC does not verify.
        let mut stream = connect(target);
        stream
            .write_all(&hello_frame(cluster, 0, &NONCE, 2))
            .unwrap();
        let challenge = read_frame(&mut stream);
        // The finish a peer holding another secret would send: the real transcript (both
        // nonces, plaintext binding), MACed with its key.
        let transcript = Transcript {
            cluster,
            dialer_id: 0,
            acceptor_id: 2,
            nonce_d: NONCE,
            nonce_a: challenge[128..160].try_into().unwrap(),
            binding: Binding::Plaintext,
        };
        let wrong = Keys::new(b"another-secret-of-at-least-32-bytes!", None).unwrap();
        let forged = wrong.sign(&transcript.bytes(Direction::Dialer));
        stream
            .write_all(&finish_frame(cluster, 0, &forged))
            .unwrap();
        stream.write_all(&header(256, 7)).ok();
        closed_by_node(&mut stream, "wrong secret");

        let failed = |all: &BTreeMap<String, u64>, r| {
            counter(all, "replica_handshakes_failed_total", Some(r))
        };
        let after = settled(http, |all| {
            failed(all, "cluster_mismatch") > failed(&before, "cluster_mismatch")
                && failed(all, "mac_mismatch") > failed(&before, "mac_mismatch")
        });
        assert_eq!(
            failed(&after, "cluster_mismatch"),
            failed(&before, "cluster_mismatch") + 1
        );
        assert_eq!(
            failed(&after, "mac_mismatch"),
            failed(&before, "mac_mismatch") + 1
        );
        assert_eq!(
            counter(&after, "replica_connections_inbound_total", None),
            counter(&before, "replica_connections_inbound_total", None),
            "a refused peer got a connection"
        );
        assert_eq!(
            closes(&after),
            closes(&before),
            "no established connection closed"
        );
        committed = committing(nodes, &logs, committed + 2);

        // 3. Established connections (right cluster and secret) that send garbage, a 4 GiB
        // size field, a command byte above 29: each closes, counted by its reason.
        let before = scrape_ok(http);
        let mut garbage: Vec<u8> = (0..HEADER_SIZE as u32)
            .map(|i| (i * 37 % 251) as u8)
            .collect();
        garbage[48..52].copy_from_slice(&17u32.to_le_bytes());
        let attacks: [(&str, Vec<u8>, u8); 3] = [
            ("size_too_small", garbage, 3),
            ("size_too_large", header(u32::MAX, 7).to_vec(), 4),
            ("command_byte", header(256, 30).to_vec(), 5),
        ];
        for (reason, bytes, lane) in &attacks {
            let mut stream = establish(target, cluster, *lane);
            stream.write_all(bytes).unwrap();
            closed_by_node(&mut stream, reason);
        }
        let total = |all: &BTreeMap<String, u64>| closes(all).values().sum::<u64>();
        let after = settled(http, |all| total(all) >= total(&before) + 3);
        assert_eq!(
            counter(&after, "replica_connections_inbound_total", None),
            counter(&before, "replica_connections_inbound_total", None) + 3,
        );
        let (was, now) = (closes(&before), closes(&after));
        for (reason, count) in &now {
            let expected = was[reason] + u64::from(attacks.iter().any(|a| a.0 == reason));
            assert_eq!(*count, expected, "closes by {reason}: {was:?} -> {now:?}");
        }
        // Nothing else: the real peer's connections never closed, the cluster commits on.
        assert_eq!(closes(&scrape_ok(peer_http)), peer_before);
        committing(nodes, &logs, committed + 3);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// TLS on: a peer that speaks the handshake in plaintext is refused by TLS; nothing is
/// established and the cluster keeps committing.
#[test]
fn a_peer_without_tls_is_refused_when_tls_is_on() {
    let _serial = serial();
    let dir = scratch("security-tls");
    let ports = free_ports(9);
    let text = config(
        "security-tls-e2e",
        3,
        &ports,
        &format!(
            "\n[cluster.auth]\nenabled = true\nshared_secret = \"{SECRET}\"\n\n\
             [cluster.tls]\nenabled = true\nself_signed = true\n"
        ),
    );
    let (mut nodes, logs) = start_pair(&dir, &text);
    let cluster = wire::cluster_id("security-tls-e2e");
    let target = nodes[2].replica_port;
    let http = nodes[2].http;
    run_cluster(&mut nodes, &logs, |nodes| {
        let committed = committing(nodes, &logs, 2);
        let before = scrape_ok(http);
        let mut stream = connect(target);
        stream
            .write_all(&hello_frame(cluster, 0, &NONCE, 1))
            .unwrap();
        stream.write_all(&header(256, 7)).ok();
        closed_by_node(&mut stream, "no TLS");
        let tls = |all: &BTreeMap<String, u64>| {
            counter(all, "replica_handshakes_failed_total", Some("tls"))
        };
        let after = settled(http, |all| tls(all) > tls(&before));
        assert_eq!(tls(&after), tls(&before) + 1);
        assert_eq!(
            counter(&after, "replica_connections_inbound_total", None),
            counter(&before, "replica_connections_inbound_total", None),
        );
        assert_eq!(closes(&after), closes(&before));
        committing(nodes, &logs, committed + 3);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
