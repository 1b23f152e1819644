//! The partition WAL's recovery on images it wrote itself and the fuzzer then damaged (bit
//! flips, zeroed sectors, a sector copied over another as a misdirected write would, a cut
//! file), followed by a power loss. Whatever recovery does, it must not panic, every record it
//! hands back must be one that was written under that lsn, lsns must rise, and a second open
//! must hand back the same records. Without damage, every record reported durable comes back
//! and recovery is clean.
#![no_main]

use std::collections::BTreeMap;

use journal::block_on;
use journal::{CrashMode, MemStorage, PartitionWal, Prng, SECTOR, Storage, WalConfig};
use libfuzzer_sys::fuzz_target;

#[path = "storage_faults.rs"]
mod storage_faults;
use storage_faults::{Script, damage};

const CONFIG: WalConfig = WalConfig {
    file_size_max: 16 * SECTOR as u64,
    window_bytes_max: 4 * SECTOR,
    window_us_max: 0,
};

/// What was written under one lsn: `(group, payload, truncate_from)`.
type Written = (u64, Vec<u8>, Option<u64>);

fn payload(lsn: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

/// Every record an open hands back, in order.
fn reopen(disk: &MemStorage) -> Option<Vec<(u64, Written)>> {
    let mut seen = Vec::new();
    let opened = block_on(PartitionWal::open(disk.clone(), CONFIG, |r| {
        let frame = r.frame.to_vec();
        seen.push((r.lsn, (r.group, frame, r.truncate_from)));
    }));
    opened.ok().map(|_| seen)
}

fuzz_target!(|data: &[u8]| {
    let mut script = Script(data);
    let disk = MemStorage::new();
    let (mut wal, _) = block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {})).expect("fresh");
    let mut written: BTreeMap<u64, Written> = BTreeMap::new();
    for _ in 0..script.u8() % 48 {
        match script.u8() % 5 {
            0 | 1 => {
                let group = u64::from(script.u8() % 4);
                let len = usize::from(script.u16()) % (3 * SECTOR);
                let lsn_next = written.keys().last().map_or(1, |l| l + 1);
                let bytes = payload(lsn_next, len);
                if let Ok(lsn) = wal.submit(group, &bytes, 0) {
                    written.insert(lsn, (group, bytes, None));
                }
            }
            2 => {
                let group = u64::from(script.u8() % 4);
                let from = u64::from(script.u8());
                if let Ok(lsn) = wal.submit_truncate(group, from, 0) {
                    written.insert(lsn, (group, Vec::new(), Some(from)));
                }
            }
            _ => {
                block_on(wal.commit()).expect("in-memory commit");
            }
        }
    }
    let durable = wal.durable_lsn();
    drop(wal);
    let names = block_on(disk.list()).expect("list");
    let damages = script.u8() % 4;
    for _ in 0..damages {
        let Some(name) = names.get(usize::from(script.u8()) % names.len().max(1)) else {
            break;
        };
        damage(
            &disk,
            name,
            CONFIG.file_size_max / SECTOR as u64,
            &mut script,
        );
    }
    disk.crash(
        CrashMode::LoseUnsynced,
        &mut Prng::new(u64::from(script.u8())),
    );

    let Some(first) = reopen(&disk) else {
        return; // a refused open is an answer (an IO error of the image)
    };
    let mut last = 0;
    for (lsn, record) in &first {
        assert!(*lsn > last, "lsns rise: {lsn} after {last}");
        last = *lsn;
        assert!(
            written.get(lsn) == Some(record),
            "record {lsn} is what was written"
        );
    }
    if damages == 0 {
        let lsns: Vec<u64> = first.iter().map(|(l, _)| *l).collect();
        assert_eq!(
            lsns,
            (1..=durable).collect::<Vec<_>>(),
            "every durable record comes back"
        );
    }
    let second = reopen(&disk).expect("a WAL that opened once opens again");
    let lsns = |records: &[(u64, Written)]| records.iter().map(|(l, _)| *l).collect::<Vec<_>>();
    assert_eq!(lsns(&first), lsns(&second), "recovery is repeatable");
    assert!(
        first == second,
        "recovery hands back the same records twice"
    );
});
