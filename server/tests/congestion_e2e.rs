//! `network.tcp_congestion_control` end to end (decision 501): every socket of a running node
//! (the client connections it accepts, the replica connections it accepts and dials) runs
//! under the configured congestion control, read from the kernel with `ss`; a name the kernel
//! does not have stops `strand start` with exit 2, naming the key.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::client::Client;
use shard::net::CongestionControl;

/// A congestion control the kernel offers that is not its default (`reno` is built into every
/// kernel), so that a socket the node left alone would show something else.
fn not_the_default() -> CongestionControl {
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .expect("read the kernel's default congestion control");
    let name = if default.trim() == "reno" {
        "cubic"
    } else {
        "reno"
    };
    CongestionControl::new(name).unwrap()
}

/// Writes the config of an `n`-node cluster `name` with `network.tcp_congestion_control` set
/// to `congestion` into `dir`; its ports and path.
fn config_under(
    dir: &Path,
    name: &str,
    n: usize,
    congestion: &CongestionControl,
) -> (Vec<u16>, PathBuf) {
    let ports = common::free_ports(3 * n);
    let path = dir.join("strand.toml");
    let network = server::config::network_section(Some(congestion));
    std::fs::write(&path, common::config(name, n, &ports, &network)).unwrap();
    (ports, path)
}

/// One established TCP socket as `ss -tinp` shows it.
#[derive(Debug)]
struct Socket {
    local_port: u16,
    peer_port: u16,
    pid: u32,
    congestion: String,
}

fn port(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// Every established TCP socket of the machine, with its owner's pid and congestion control.
fn sockets() -> Vec<Socket> {
    let output = Command::new("ss")
        .args(["-tinpH", "state", "established"])
        .output()
        .expect("run ss (package iproute2)");
    assert!(output.status.success(), "ss failed: {output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(pid) = line
            .split_once("pid=")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
        else {
            continue;
        };
        let Some(info) = lines.next_if(|l| l.starts_with(char::is_whitespace)) else {
            continue;
        };
        out.push(Socket {
            local_port: port(fields[2]),
            peer_port: port(fields[3]),
            pid,
            congestion: info.split_whitespace().next().unwrap_or("").to_string(),
        });
    }
    out
}

#[test]
fn every_socket_of_a_node_runs_under_the_configured_congestion_control() {
    let _serial = common::serial();
    let chosen = not_the_default();
    let dir = common::scratch("congestion");
    let (ports, config_path) = config_under(&dir, "congestion-e2e", 2, &chosen);
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 2, &ports);
    for node in nodes.iter_mut() {
        common::spawn(&config_path, node, &logs, &[]);
    }
    common::run_cluster(&mut nodes, &logs, |nodes| {
        // Both nodes commit: the replica connections are up both ways.
        common::wait_until(
            "commits on both nodes",
            &[&nodes[0], &nodes[1]],
            &logs,
            |all| all.iter().all(|m| m["commit_min"] >= 3),
        );
        let mut client = Client::connect(nodes[0].tcp, 7);
        client.login();
        let pids: BTreeMap<u32, u8> = nodes
            .iter()
            .map(|n| (n.child.as_ref().unwrap().id(), n.id))
            .collect();
        let replica_ports: Vec<u16> = nodes.iter().map(|n| n.replica_port).collect();
        let mine: Vec<Socket> = sockets()
            .into_iter()
            .filter(|s| pids.contains_key(&s.pid))
            .collect();
        let client_side = mine.iter().filter(|s| s.local_port == nodes[0].tcp).count();
        let replica_accepted = mine
            .iter()
            .filter(|s| replica_ports.contains(&s.local_port))
            .count();
        let replica_dialed = mine
            .iter()
            .filter(|s| replica_ports.contains(&s.peer_port))
            .count();
        assert!(
            client_side >= 1 && replica_accepted >= 1 && replica_dialed >= 1,
            "expected an accepted client connection and replica connections both ways: {mine:#?}"
        );
        let other: Vec<&Socket> = mine
            .iter()
            .filter(|s| s.congestion != chosen.name())
            .collect();
        assert!(
            other.is_empty(),
            "sockets of the nodes not under {chosen}: {other:#?}"
        );
        // The test's own connection was left alone: the check reads what each socket runs.
        let ours = sockets()
            .into_iter()
            .find(|s| s.peer_port == nodes[0].tcp && s.pid == std::process::id())
            .expect("the test's client connection");
        assert_ne!(ours.congestion, chosen.name(), "{ours:?}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_congestion_control_the_kernel_lacks_stops_the_node_naming_the_key() {
    let dir = common::scratch("congestion-missing");
    let lacking = CongestionControl::new("no_such_cc").unwrap();
    let (_, config_path) = config_under(&dir, "congestion-missing", 1, &lacking);
    let output = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["start", "--config"])
        .arg(&config_path)
        .args(["--replica-id", "0", "--shards", "1", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("config key `network.tcp_congestion_control`")
            && stderr.contains("no_such_cc")
            && stderr.contains("tcp_available_congestion_control"),
        "{stderr}"
    );
    assert!(
        !dir.join("data").exists(),
        "the node formatted a data directory before refusing its config"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
