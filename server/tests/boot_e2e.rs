//! Boot from disk across real processes (issue 10 item 3): a wiped node rejoins as lost state
//! and never helps form a quorum until it holds the view's log (decisions 28, 61, 191); a
//! damaged newest journal entry is held faulty, repaired from peers, nothing acknowledged lost
//! (decision 62); a changed shard count refuses naming the stamp (decision 192).
//!
//! Commits come from the test hook `STRAND_TEST_REGISTER_INTERVAL_MS` (decision 138). Waits are
//! bounded; nothing asserts on wall time.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use wire::header::{Layout as _, PrepareHeader};

/// `metadata.journal_slots` of [`common::config`], and the metadata slot size.
const SLOTS: u64 = 256;
const SLOT_SIZE: u64 = 1024 * 1024;

fn journal_file(node: &Node) -> std::path::PathBuf {
    node.dir
        .join("shard-0")
        .join("metadata")
        .join("journal.prepares")
}

/// The intact prepare in `slot` of a stopped node's metadata journal: `(op, frame)`.
fn slot_prepare(file: &[u8], slot: u64) -> Option<(u64, Vec<u8>)> {
    let at = usize::try_from(slot * SLOT_SIZE).ok()?;
    let header = PrepareHeader::view(file.get(at..at + wire::HEADER_SIZE)?)?;
    let size = usize::try_from(header.frame.size.get()).ok()?;
    let frame = file.get(at..at + size)?;
    match wire::decode_replica(frame, wire::MAX_MESSAGE_SIZE_DEFAULT) {
        Ok(wire::Message::Prepare { header, .. }) if header.op.get() % SLOTS == slot => {
            Some((header.op.get(), frame.to_vec()))
        }
        _ => None,
    }
}

/// The newest prepare of a stopped node's metadata journal that is intact in its slot and
/// whose header the ring holds: an append writes the slot, syncs, then the ring, so a node
/// killed in between holds a newer intact slot the ring does not vouch for, which a boot may
/// rightly cut as a torn last write (the test's kill landed there once, under load).
fn newest_prepare(node: &Node) -> (u64, Vec<u8>) {
    let file = std::fs::read(journal_file(node)).unwrap();
    let ring = std::fs::read(
        node.dir
            .join("shard-0")
            .join("metadata")
            .join("journal.headers"),
    )
    .unwrap();
    (0..SLOTS)
        .filter_map(|s| slot_prepare(&file, s))
        .filter(|(op, frame)| {
            let at = usize::try_from(op % SLOTS).unwrap() * wire::HEADER_SIZE;
            ring.get(at..at + wire::HEADER_SIZE) == frame.get(..wire::HEADER_SIZE)
        })
        .max_by_key(|(op, _)| *op)
        .expect("a journaled prepare the ring vouches for")
}

/// A backup is killed, the body of its newest journaled prepare damaged on disk (the header
/// ring keeps its copy: the prepare was durable, so it may have been acknowledged). It boots,
/// holds the entry faulty instead of cutting it (decision 62), repairs it from its peers
/// (the slot holds the very prepare again, byte for byte) and catches up with the cluster.
#[test]
fn a_damaged_newest_entry_is_held_faulty_and_repaired_from_peers() {
    let _serial = serial();
    let dir = scratch("faulty");
    let ports = free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config("faulty-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs, &[]);
    }
    run_cluster(&mut nodes, &logs, |nodes| {
        let all = wait_until(
            "a committing cluster",
            &nodes.iter().collect::<Vec<_>>(),
            &logs,
            |all| one_primary(all) && all.iter().all(|m| m["commit_min"] >= 5),
        );
        let backup = all.iter().position(|m| m["is_primary"] == 0).unwrap();
        kill(&mut nodes[backup]);
        let (op, frame) = newest_prepare(&nodes[backup]);
        // Damage a byte of the frame's body region (or header when the body is short): the
        // slot no longer verifies; the ring entry is untouched.
        let mut file = std::fs::read(journal_file(&nodes[backup])).unwrap();
        let at = usize::try_from((op % SLOTS) * SLOT_SIZE).unwrap() + frame.len() - 1;
        file[at] ^= 0x40;
        std::fs::write(journal_file(&nodes[backup]), &file).unwrap();
        assert!(slot_prepare(&file, op % SLOTS).is_none(), "the damage took");
        let committed = wait_until(
            "commits without the backup",
            &nodes
                .iter()
                .filter(|n| n.child.is_some())
                .collect::<Vec<_>>(),
            &logs,
            |all| all.iter().all(|m| m["commit_max"] > op + 2),
        )
        .iter()
        .map(|m| m["commit_max"])
        .min()
        .unwrap();

        spawn(&config_path, &mut nodes[backup], &logs, &[]);
        let all_nodes: Vec<&Node> = nodes.iter().collect();
        wait_until("the damaged backup catches up", &all_nodes, &logs, |all| {
            one_primary(all)
                && all[backup]["commit_min"] >= committed
                && all[backup]["lost_state"] == 0
        });
        let held = log_lines(&logs, &format!("faulty=[{op}]"));
        assert_eq!(
            held.len(),
            1,
            "op {op} was not held faulty at boot:\n{}",
            log_lines(&logs, "metadata group recovered").join("\n")
        );
        // The repair writes the same prepare back. The write may still be in flight when the
        // node reports the op committed (the commit does not wait for it; a node killed before
        // it lands holds the op faulty again at its next boot), so read the slot until it is
        // intact, within the bound, then stop the node.
        let start = std::time::Instant::now();
        let (repaired_op, repaired) = loop {
            let file = std::fs::read(journal_file(&nodes[backup])).unwrap();
            if let Some(found) = slot_prepare(&file, op % SLOTS) {
                break found;
            }
            assert!(
                start.elapsed() < BOUND,
                "the repair never wrote slot {}",
                op % SLOTS
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        kill(&mut nodes[backup]);
        assert_eq!(repaired_op, op);
        assert_eq!(
            repaired, frame,
            "the repaired prepare is the acknowledged one"
        );
        spawn(&config_path, &mut nodes[backup], &logs, &[]);
        wait_until(
            "the cluster after a clean restart",
            &all_nodes_of(nodes),
            &logs,
            |all| one_primary(all) && all[backup]["commit_min"] > committed,
        );
        let booted = log_lines(&logs, "metadata group recovered");
        assert!(booted.last().unwrap().contains("faulty=[]"), "{booted:?}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn all_nodes_of(nodes: &[Node]) -> Vec<&Node> {
    nodes.iter().collect()
}

/// Decision 191 across processes. Both backups are killed while the cluster commits; one is
/// wiped and restarted with `--rejoin`. With only the primary up beside it, the rejoining node
/// is in lost state: it never acks or votes, so the primary's commit point does not move
/// (without `--rejoin` the wiped node would be a fresh replica that acks and lets the primary
/// commit with a quorum of one remembering node). Once the other backup returns, the lost node
/// learns the view from two peers, catches up, leaves lost state and the cluster commits.
#[test]
fn a_wiped_node_rejoins_in_lost_state_and_never_helps_form_a_quorum() {
    let _serial = serial();
    let dir = scratch("rejoin");
    let ports = free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config("rejoin-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs, &[]);
    }
    run_cluster(&mut nodes, &logs, |nodes| {
        let all = wait_until("a committing cluster", &all_nodes_of(nodes), &logs, |all| {
            one_primary(all) && all.iter().all(|m| m["commit_min"] >= 5)
        });
        let primary = all.iter().position(|m| m["is_primary"] == 1).unwrap();
        let backups: Vec<usize> = (0..3).filter(|&i| i != primary).collect();
        let (wiped, other) = (backups[0], backups[1]);
        kill(&mut nodes[wiped]);
        kill(&mut nodes[other]);
        std::fs::remove_dir_all(&nodes[wiped].dir).unwrap();
        // --rejoin is refused on a directory with data (tried on the intact backup's).
        let output = Command::new(env!("CARGO_BIN_EXE_strand"))
            .args(["start", "--config"])
            .arg(&config_path)
            .args([
                "--replica-id",
                &other.to_string(),
                "--shards",
                "1",
                "--data-dir",
            ])
            .arg(&nodes[other].dir)
            .arg("--rejoin")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--rejoin") && stderr.contains("strand.cluster"),
            "{stderr}"
        );

        let alone = metrics(nodes[primary].http).expect("the primary answers");
        let stuck_at = alone["commit_max"];
        spawn(&config_path, &mut nodes[wiped], &logs, &["--rejoin"]);
        let pair = [&nodes[primary], &nodes[wiped]];
        // Both answer; whether the rejoining node is in lost state is asserted below, after
        // the commit point (so a fresh boot shows up as a commit, not only as a gauge).
        wait_until("the rejoining node answers", &pair, &logs, |_| true);
        // The primary keeps proposing (the hook) and retransmitting to the rejoining node for
        // a while; its commit point never moves, the lost node never acks or leads.
        let frames_in = |http: u16| {
            scrape(http).map_or(0, |all| all["strand_replica_frames_in_total{shard=\"0\"}"])
        };
        let heard_before = frames_in(nodes[wiped].http);
        let watched = Instant::now();
        let mut samples = 0;
        let mut lost = Vec::new();
        while watched.elapsed() < Duration::from_secs(6) {
            if let (Some(p), Some(w)) = (metrics(nodes[primary].http), metrics(nodes[wiped].http)) {
                samples += 1;
                assert_eq!(
                    p["commit_max"],
                    stuck_at,
                    "the primary committed with the lost node's help: {p:?} {w:?}\n{}",
                    std::fs::read_to_string(&logs).unwrap_or_default()
                );
                lost.push((w["lost_state"], w["is_primary"], w["status"]));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(samples >= 5, "too few samples: {samples}");
        // The lost node was connected and heard the primary throughout (its answers to the
        // view probes, its prepares and commits): the commit point stood still for want of an
        // ack, not of a connection.
        let heard = frames_in(nodes[wiped].http) - heard_before;
        eprintln!("the rejoining node heard {heard} frames while in lost state");
        assert!(
            heard >= 10,
            "the rejoining node heard {heard} frames in the window"
        );
        // Throughout: lost state, not primary, recovering.
        assert!(lost.iter().all(|s| *s == (1, 0, 2)), "{lost:?}");
        let booted = log_lines(&logs, "metadata group recovered");
        assert!(
            booted.last().unwrap().contains("lost_state=true"),
            "{booted:?}"
        );
        // Killed while still lost and restarted without the flag: its superblock remembers
        // (decision 48), so it is lost again and the commit point still stands.
        kill(&mut nodes[wiped]);
        spawn(&config_path, &mut nodes[wiped], &logs, &[]);
        let again = wait_until(
            "the lost node restarts in lost state",
            &[&nodes[primary], &nodes[wiped]],
            &logs,
            |all| all[1]["lost_state"] == 1,
        );
        assert_eq!(again[0]["commit_max"], stuck_at, "{again:?}");
        let booted = log_lines(&logs, "metadata group recovered");
        assert!(
            booted.last().unwrap().contains("lost_state=true"),
            "{booted:?}"
        );

        // The other backup returns: a quorum of remembering nodes; the lost node catches up.
        spawn(&config_path, &mut nodes[other], &logs, &[]);
        wait_until(
            "the cluster with the rejoined node",
            &all_nodes_of(nodes),
            &logs,
            |all| {
                one_primary(all)
                    && all[wiped]["lost_state"] == 0
                    && all[wiped]["commit_min"] > stuck_at + 3
                    && all.iter().all(|m| m["commit_max"] > stuck_at + 3)
            },
        );
        // Its restart remembers nothing lost any more.
        kill(&mut nodes[wiped]);
        spawn(&config_path, &mut nodes[wiped], &logs, &[]);
        wait_until(
            "the rejoined node restarts",
            &all_nodes_of(nodes),
            &logs,
            |all| {
                one_primary(all)
                    && all[wiped]["lost_state"] == 0
                    && all[wiped]["commit_min"] > stuck_at + 3
            },
        );
        let booted = log_lines(&logs, "metadata group recovered");
        assert!(
            booted.last().unwrap().contains("lost_state=false"),
            "{booted:?}"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decision 240 across processes: the crash window of a rejoin. `strand start --rejoin` writes
/// the stamp (recording the rejoin) on the main thread before shard 0 marks the metadata
/// superblock lost; a crash between the two leaves a stamped directory with no superblock.
/// The test formats a wiped backup's directory exactly that way (`boot::check_rejoin` and
/// `boot::check_or_format` with the node's stamp, as `strand start --rejoin` does) and starts
/// it without the flag: it boots in lost state and, with only the primary up beside it, the
/// primary's commit point does not move. `--rejoin` again on that directory is accepted and
/// boots lost; once the other backup returns, the node catches up and leaves lost state.
#[test]
fn a_rejoin_cut_before_its_superblock_mark_boots_in_lost_state_without_the_flag() {
    let _serial = serial();
    let dir = scratch("rejoin-window");
    let ports = free_ports(9);
    let config_path = dir.join("strand.toml");
    let cluster = "rejoin-window-e2e";
    std::fs::write(&config_path, config(cluster, 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs, &[]);
    }
    run_cluster(&mut nodes, &logs, |nodes| {
        let all = wait_until("a committing cluster", &all_nodes_of(nodes), &logs, |all| {
            one_primary(all) && all.iter().all(|m| m["commit_min"] >= 5)
        });
        let primary = all.iter().position(|m| m["is_primary"] == 1).unwrap();
        let backups: Vec<usize> = (0..3).filter(|&i| i != primary).collect();
        let (wiped, other) = (backups[0], backups[1]);
        kill(&mut nodes[wiped]);
        kill(&mut nodes[other]);
        std::fs::remove_dir_all(&nodes[wiped].dir).unwrap();
        std::fs::create_dir_all(&nodes[wiped].dir).unwrap();
        // What `strand start --rejoin` does on the main thread before any shard runs.
        let stamp = server::boot::Stamp {
            cluster_name: cluster.into(),
            cluster_id: wire::cluster_id(cluster),
            replica_id: u8::try_from(wiped).unwrap(),
            replica_count: 3,
            layout: server::boot::ShardLayout {
                shards: 1,
                replica_lanes: 16,
            },
            rejoin: true,
        };
        server::boot::check_rejoin(&nodes[wiped].dir).unwrap();
        assert!(server::boot::check_or_format(&nodes[wiped].dir, &stamp).unwrap());
        assert!(
            !nodes[wiped]
                .dir
                .join("shard-0")
                .join("metadata")
                .join("superblock")
                .exists(),
            "the crash window: no superblock yet"
        );

        let stuck_at = metrics(nodes[primary].http).expect("the primary answers")["commit_max"];
        spawn(&config_path, &mut nodes[wiped], &logs, &[]);
        let pair = [&nodes[primary], &nodes[wiped]];
        wait_until("the cut rejoin answers", &pair, &logs, |_| true);
        let watched = Instant::now();
        let mut lost = Vec::new();
        while watched.elapsed() < Duration::from_secs(5) {
            if let (Some(p), Some(w)) = (metrics(nodes[primary].http), metrics(nodes[wiped].http)) {
                assert_eq!(
                    p["commit_max"],
                    stuck_at,
                    "the primary committed with the cut rejoin's help: {p:?} {w:?}\n{}",
                    std::fs::read_to_string(&logs).unwrap_or_default()
                );
                lost.push(w["lost_state"]);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(lost.len() >= 5, "too few samples: {lost:?}");
        assert!(lost.iter().all(|l| *l == 1), "{lost:?}");
        let booted = log_lines(&logs, "metadata group recovered");
        assert!(
            booted.last().unwrap().contains("lost_state=true"),
            "{booted:?}"
        );
        assert!(
            !log_lines(&logs, "the stamp records a rejoin").is_empty(),
            "the boot names the stamp's rejoin"
        );

        // `--rejoin` again on the stamped directory goes on with the rejoin.
        kill(&mut nodes[wiped]);
        spawn(&config_path, &mut nodes[wiped], &logs, &["--rejoin"]);
        let again = wait_until(
            "the rejoin goes on with the flag",
            &[&nodes[primary], &nodes[wiped]],
            &logs,
            |all| all[1]["lost_state"] == 1,
        );
        assert_eq!(again[0]["commit_max"], stuck_at, "{again:?}");

        spawn(&config_path, &mut nodes[other], &logs, &[]);
        wait_until(
            "the cluster with the rejoined node",
            &all_nodes_of(nodes),
            &logs,
            |all| {
                one_primary(all)
                    && all[wiped]["lost_state"] == 0
                    && all[wiped]["commit_min"] > stuck_at + 3
            },
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decision 192: a node formatted with one shard refuses to start with two, naming the stamp,
/// both counts and what to do; with one again it boots.
#[test]
fn a_changed_shard_count_refuses_naming_the_stamp() {
    let dir = scratch("shards");
    let ports = free_ports(3);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config("shards-e2e", 1, &ports, "")).unwrap();
    let data = dir.join("data");
    let run = |shards: &str| {
        Command::new(env!("CARGO_BIN_EXE_strand"))
            .env("STRAND_TEST_REGISTER_INTERVAL_MS", "20")
            .args(["start", "--config"])
            .arg(&config_path)
            .args(["--replica-id", "0", "--shards", shards, "--data-dir"])
            .arg(&data)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let wait_ready = |child: &mut std::process::Child| {
        let start = Instant::now();
        while metrics(ports[1]).is_none_or(|m| m["commit_min"] < 3) {
            assert!(start.elapsed() < BOUND, "node not ready");
            assert!(child.try_wait().unwrap().is_none(), "node exited");
            std::thread::sleep(Duration::from_millis(100));
        }
        signal(child, libc::SIGTERM);
        assert!(child.wait().unwrap().success());
    };
    wait_ready(&mut run("1"));
    let stamp = std::fs::read(data.join("strand.cluster")).unwrap();
    let output = run("2").wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "strand.cluster",
        "formatted for 1 shards and 16 replica lanes",
        "now runs 2 shards and 16 replica lanes",
        "--shards",
        "refusing to start",
    ] {
        assert!(stderr.contains(needle), "no `{needle}`: {stderr}");
    }
    assert_eq!(std::fs::read(data.join("strand.cluster")).unwrap(), stamp);
    wait_ready(&mut run("1"));
    inspect_prints_the_directory(&data);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `strand inspect data-dir` on a directory a node ran in (its metadata group committed), with
/// a partition WAL and segment files laid beside it: the stamp, the superblock copies and the
/// chosen state, the journal head, the WAL's durable end, its files and the segment ranges;
/// it writes nothing.
fn inspect_prints_the_directory(data: &Path) {
    use journal::storage::block_on;
    let wal_dir = data.join("shard-1").join("wal");
    let storage = journal::FileStorage::new(&wal_dir, false).unwrap();
    let config = journal::wal::WalConfig {
        file_size_max: 256 * 1024,
        window_bytes_max: 64 * 1024,
        window_us_max: 500,
    };
    let (mut wal, _) = block_on(journal::wal::PartitionWal::open(storage, config, |_| {})).unwrap();
    for i in 0..3u8 {
        block_on(wal.append(7, &[i; 300], 0)).unwrap();
    }
    block_on(wal.record_end()).unwrap();
    drop(wal);
    for base in [0u64, 100] {
        std::fs::write(wal_dir.join(format!("p7-{base:020}.log")), [1u8; 10]).unwrap();
    }
    let before = tree(data);
    let output = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["inspect", "data-dir"])
        .arg(data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for needle in [
        "cluster_name = \"shards-e2e\"",
        "shards = 1",
        "replica_lanes = 16",
        "copy 0: sequence",
        "copy 3: sequence",
        "chosen: sequence",
        "lost_state false",
        "head ",
        "partition WAL",
        "durable end: durable lsn 3",
        "wal.0000000001",
        "segments \"p7-\"",
        "offsets 0..100: 10 bytes",
        "offsets 100..: 10 bytes (newest)",
    ] {
        assert!(text.contains(needle), "no `{needle}` in:\n{text}");
    }
    assert_eq!(tree(data), before, "inspect wrote to the directory");
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(tree(&path));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}
