//! Crash test: a child process appends to a real on-disk metadata journal under load, reporting
//! each durable append (and each durable superblock write) to the parent through a pipe; the
//! parent kills it with SIGKILL at a random moment, recovers the directory, and checks that
//! every append reported durable is there, intact, and that nothing corrupt is reported.
//!
//! SIGKILL loses the process, not the page cache: power loss (lost unsynced writes, torn
//! sectors) is covered by the in-memory backend's crash tests. Kills default to 25;
//! `JOURNAL_CRASH_KILLS=1000` runs the long mode.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use journal::{
    FileStorage, Identity, JournalConfig, PartitionWal, Prng, SECTOR, VsrState, WalConfig,
    block_on, recover_metadata,
};
use wire::encode::{Sender, finish_header};
use wire::header::{FrameHeader, Layout, PrepareHeader};
use wire::{GroupId, Operation};

const CHILD_ENV: &str = "JOURNAL_CRASH_CHILD_DIR";
const ID: Identity = Identity {
    cluster: 7,
    replica_id: 0,
    replica_count: 1,
};
const CONFIG: JournalConfig = JournalConfig {
    slot_count: 64,
    slot_size: 4 * SECTOR as u64,
};

fn prepare(op: u64, parent: u128, body_len: usize, salt: u64) -> Vec<u8> {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        wire::Command::Prepare,
        Sender {
            cluster: ID.cluster,
            replica: 0,
            view: 1,
        },
    );
    header.op.set(op);
    header.parent.set(parent);
    header.commit.set(op - 1);
    header.timestamp.set(op);
    header.operation = Operation::CreateStream.byte();
    header.group.set(GroupId::METADATA.0);
    let mut prng = Prng::new(salt ^ op);
    let body: Vec<u8> = (0..body_len).map(|_| prng.next_u64() as u8).collect();
    finish_header(&mut header, &body).expect("finish");
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

fn storage(dir: &Path) -> FileStorage {
    // O_DIRECT where the filesystem supports it.
    let direct = FileStorage::new(dir, true).expect("dir");
    let probe = block_on(journal::Storage::open(
        &direct,
        "probe",
        journal::OpenMode::Create,
    ));
    if probe.is_ok() {
        let _ = std::fs::remove_file(dir.join("probe"));
        direct
    } else {
        FileStorage::new(dir, false).expect("dir")
    }
}

/// The child: recover, then append forever, reporting durability on stdout.
fn child(dir: &Path, seed: u64) -> ! {
    let storage = storage(dir);
    let mut out = std::io::stdout().lock();
    let mut r = block_on(recover_metadata(storage, ID, CONFIG)).expect("recover");
    if !r.recovery.is_clean() || !r.recovery.chain_breaks.is_empty() {
        writeln!(out, "ERR {:?}", r.recovery.repair).ok();
        std::process::exit(3);
    }
    let mut state = r.state.unwrap_or(VsrState {
        cluster: ID.cluster,
        replica_id: ID.replica_id,
        replica_count: ID.replica_count,
        ..VsrState::default()
    });
    let mut op = r.recovery.op_head;
    let mut parent = r.recovery.headers.last().map_or(0, |h| h.identity());
    let mut prng = Prng::new(seed);
    loop {
        if r.journal.capacity_remaining() <= 8 {
            // Checkpoint: the superblock names it durably before the floor moves (G4).
            state.checkpoint_op = op - 16;
            state.op_head = op;
            block_on(r.superblock.write(&state)).expect("superblock");
            r.journal
                .set_checkpoint(state.checkpoint_op)
                .expect("checkpoint");
            writeln!(out, "S {} {}", state.view, state.checkpoint_op).expect("pipe");
        }
        op += 1;
        let body = prng.below(3 * SECTOR as u64) as usize;
        let frame = prepare(op, parent, body, seed);
        block_on(r.journal.append(&frame)).expect("append");
        parent = journal::prepare::verify_frame(&frame, true)
            .expect("ours")
            .identity();
        writeln!(out, "A {op}").expect("pipe");
        if prng.one_in(10) {
            state.view += 1;
            state.log_view = state.view;
            state.op_head = op;
            state.commit_max = op;
            block_on(r.superblock.write(&state)).expect("superblock");
            writeln!(out, "S {} {}", state.view, state.checkpoint_op).expect("pipe");
        }
    }
}

const WAL: WalConfig = WalConfig {
    file_size_max: 1024 * 1024,
    window_bytes_max: 256 * 1024,
    window_us_max: 0,
};

/// The payload of WAL record `lsn`: derived from the lsn, so the parent can check every byte.
fn wal_payload(lsn: u64) -> Vec<u8> {
    let mut prng = Prng::new(lsn);
    let len = prng.below(20_000) as usize;
    (0..len).map(|_| prng.next_u64() as u8).collect()
}

/// The WAL child: recover, then submit records from several groups and group-commit them,
/// reporting each durable lsn.
fn wal_child(dir: &Path, seed: u64) -> ! {
    let mut out = std::io::stdout().lock();
    let (mut wal, recovery) =
        block_on(PartitionWal::open(storage(dir), WAL, |_| {})).expect("recover");
    if !recovery.is_clean() {
        writeln!(out, "ERR {recovery:?}").ok();
        std::process::exit(3);
    }
    let mut prng = Prng::new(seed);
    loop {
        let mut lsn = wal.durable_lsn();
        for _ in 0..1 + prng.below(16) {
            lsn += 1;
            let submitted = wal.submit(lsn % 7, &wal_payload(lsn), 0).expect("submit");
            assert_eq!(submitted, lsn);
        }
        let durable = block_on(wal.commit()).expect("commit");
        writeln!(out, "D {durable}").expect("pipe");
        if wal.file_count() > 3 {
            block_on(wal.reclaim(durable.saturating_sub(50))).expect("reclaim");
        }
    }
}

#[test]
fn crash_child() {
    // Runs only as the child of the SIGKILL tests below.
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let seed = std::env::var("JOURNAL_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        if std::env::var("JOURNAL_CRASH_PLANE").as_deref() == Ok("wal") {
            wal_child(&PathBuf::from(dir), seed);
        }
        child(&PathBuf::from(dir), seed);
    }
}

/// Spawns the child, lets it run for a random moment, kills it with SIGKILL, and returns the
/// lines it reported before the kill.
fn run_and_kill(exe: &Path, dir: &Path, plane: &str, prng: &mut Prng) -> Vec<String> {
    let mut child = Command::new(exe)
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env("JOURNAL_CRASH_PLANE", plane)
        .env("JOURNAL_CRASH_SEED", prng.next_u64().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    std::thread::sleep(Duration::from_micros(2_000 + prng.below(100_000)));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap()
}

#[test]
fn sigkill_during_wal_group_commit_loses_nothing_durable() {
    let kills: u64 = std::env::var("JOURNAL_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let dir = std::env::temp_dir().join(format!("journal-crash-wal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut prng = Prng::new(0xFEED);
    let (mut durable_max, mut reported, mut checked) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for kill in 0..kills {
        for line in run_and_kill(&exe, &dir, "wal", &mut prng) {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["D", lsn] => {
                    durable_max = durable_max.max(lsn.parse().unwrap());
                    reported += 1;
                }
                ["ERR", ..] => panic!("kill {kill}: child found damage: {line}"),
                _ => {}
            }
        }
        let mut last = None;
        let (_, recovery) = block_on(PartitionWal::open(storage(&dir), WAL, |r| {
            assert_eq!(
                r.frame,
                wal_payload(r.lsn),
                "kill {kill}: lsn {} differs",
                r.lsn
            );
            assert_eq!(r.group, r.lsn % 7);
            if let Some(l) = last {
                assert_eq!(r.lsn, l + 1, "kill {kill}: not a prefix");
            }
            last = Some(r.lsn);
            checked += 1;
        }))
        .expect("recover");
        assert!(recovery.is_clean(), "kill {kill}: {recovery:?}");
        assert!(
            recovery.lsn_last >= durable_max,
            "kill {kill}: lost durable records"
        );
        durable_max = recovery.lsn_last;
    }
    eprintln!(
        "wal crash test: {kills} SIGKILLs, {reported} commits reported durable, last lsn \
         {durable_max}, {checked} records re-verified, none lost, nothing corrupt, {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_at_random_moments_loses_nothing_durable() {
    let kills: u64 = std::env::var("JOURNAL_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let dir = std::env::temp_dir().join(format!("journal-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut prng = Prng::new(
        std::env::var("JOURNAL_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0xC0FFEE),
    );
    let mut max_durable_op = 0u64;
    let mut max_view = 0u32;
    let mut max_checkpoint = 0u64;
    let mut total_acked = 0u64;
    let started = Instant::now();
    for kill in 0..kills {
        let lines = run_and_kill(&exe, &dir, "metadata", &mut prng);
        for line in &lines {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("A"), Some(op), None) => {
                    let op: u64 = op.parse().unwrap();
                    max_durable_op = max_durable_op.max(op);
                    total_acked += 1;
                }
                (Some("S"), Some(view), Some(checkpoint)) => {
                    max_view = max_view.max(view.parse().unwrap());
                    max_checkpoint = max_checkpoint.max(checkpoint.parse().unwrap());
                }
                (Some("ERR"), ..) => panic!("kill {kill}: child found damage: {line}"),
                // `running 1 test` and friends from the harness
                _ => {}
            }
        }
        // Recover in the parent and check the reported durability.
        let r = block_on(recover_metadata(storage(&dir), ID, CONFIG)).expect("recover");
        assert!(
            r.recovery.is_clean(),
            "kill {kill}: {:?}",
            r.recovery.repair
        );
        assert!(r.recovery.chain_breaks.is_empty(), "kill {kill}");
        let (_, torn, corrupt, missing, damaged) = r.recovery.counts();
        assert_eq!((corrupt, missing, damaged), (0, 0, 0), "kill {kill}");
        assert!(torn <= 1, "kill {kill}");
        assert!(
            r.recovery.op_head >= max_durable_op,
            "kill {kill}: lost acked ops"
        );
        let state = r.state.unwrap_or_default();
        assert!(state.view >= max_view, "kill {kill}: view regressed");
        assert!(state.checkpoint_op >= max_checkpoint, "kill {kill}");
        for op in (state.checkpoint_op + 1)..=max_durable_op {
            let frame = block_on(r.journal.read(op));
            assert!(
                frame.is_ok(),
                "kill {kill}: acked op {op} unreadable: {frame:?}"
            );
        }
        let ops: Vec<u64> = r.recovery.headers.iter().map(|h| h.op()).collect();
        let expected: Vec<u64> = (state.checkpoint_op + 1..=r.recovery.op_head).collect();
        assert_eq!(ops, expected, "kill {kill}: not a prefix");
        max_durable_op = r.recovery.op_head;
    }
    eprintln!(
        "crash test: {kills} SIGKILLs, {total_acked} appends reported durable, head op {max_durable_op}, \
         view {max_view}, checkpoint {max_checkpoint}, none lost, nothing corrupt, {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
