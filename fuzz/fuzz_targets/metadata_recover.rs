//! The metadata journal's recovery on images it wrote itself (appends, truncations, checkpoint
//! floors) and the fuzzer then damaged (bit flips, zeroed sectors, a sector copied over another,
//! a cut file), after a power loss. Recovery must not panic or fail, every intact op it reports
//! must read back as exactly the frame appended under that op, a second open must agree, and
//! without damage every durable op above the floor is intact and nothing needs repair.
#![no_main]

use std::collections::BTreeMap;

use journal::block_on;
use journal::metadata::{HEADERS_FILE, PREPARES_FILE};
use journal::{CrashMode, JournalConfig, MemStorage, MetadataJournal, Prng, SECTOR};
use libfuzzer_sys::fuzz_target;

#[path = "storage_faults.rs"]
mod storage_faults;
use storage_faults::{Script, damage};
use wire::header::{FrameHeader, PrepareHeader};
use wire::{Command, Layout, Operation};

const CONFIG: JournalConfig = JournalConfig {
    slot_count: 8,
    slot_size: 2 * SECTOR as u64,
};

fn prepare(op: u64, parent: u128, body_len: usize) -> Vec<u8> {
    let sender = wire::encode::Sender {
        cluster: 1,
        replica: 0,
        view: 1,
    };
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(Command::Prepare, sender);
    header.op.set(op);
    header.parent.set(parent);
    header.timestamp.set(op);
    header.operation = Operation::CreateStream.byte();
    let body: Vec<u8> = (0..body_len).map(|i| (op as u8) ^ i as u8).collect();
    wire::finish_header(&mut header, &body).expect("fits");
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

fn identity(frame: &[u8]) -> u128 {
    u128::from_le_bytes(frame[0..16].try_into().expect("16 bytes"))
}

/// `(intact ops with their frames, repair ranges)` of one open.
fn reopen(disk: &MemStorage, floor: u64) -> (BTreeMap<u64, Vec<u8>>, Vec<(u64, u64)>) {
    let (journal, recovery) =
        block_on(MetadataJournal::open(disk.clone(), CONFIG, floor, 0)).expect("open");
    let mut intact = BTreeMap::new();
    for header in &recovery.headers {
        let frame = block_on(journal.read(header.op())).expect("an intact op reads back");
        assert_eq!(identity(&frame), header.identity());
        intact.insert(header.op(), frame);
    }
    (intact, recovery.repair)
}

fuzz_target!(|data: &[u8]| {
    let mut script = Script(data);
    let disk = MemStorage::new();
    let (mut journal, _) =
        block_on(MetadataJournal::open(disk.clone(), CONFIG, 0, 0)).expect("fresh");
    // Every frame ever appended under an op (a truncated op may be appended again).
    let mut appended: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut durable: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut floor = 0;
    for _ in 0..script.u8() % 40 {
        match script.u8() % 6 {
            0..=3 => {
                let op = durable.keys().last().copied().unwrap_or(floor) + 1;
                let parent = durable.get(&(op - 1)).map_or(0, |f| identity(f));
                let frame = prepare(op, parent, usize::from(script.u16()) % (SECTOR + 500));
                if block_on(journal.append(&frame)).is_ok() {
                    appended.entry(op).or_default().push(frame.clone());
                    durable.insert(op, frame);
                }
            }
            4 => {
                let from = floor + 1 + u64::from(script.u8() % 8);
                block_on(journal.truncate_from(from)).expect("in memory");
                durable.split_off(&from);
            }
            _ => {
                // A checkpoint at the newest op (the superblock would name it).
                let op = durable.keys().last().copied().unwrap_or(floor);
                journal.set_checkpoint(op).expect("forward");
                floor = op;
                durable = durable.split_off(&op);
            }
        }
    }
    drop(journal);
    let damages = script.u8() % 4;
    for _ in 0..damages {
        let name = if script.u8() % 2 == 0 {
            PREPARES_FILE
        } else {
            HEADERS_FILE
        };
        let Some(image) = disk.durable_image(name) else {
            continue;
        };
        damage(&disk, name, (image.len() / SECTOR) as u64, &mut script);
    }
    disk.crash(
        CrashMode::LoseUnsynced,
        &mut Prng::new(u64::from(script.u8())),
    );

    let (intact, repair) = reopen(&disk, floor);
    for (op, frame) in &intact {
        let ever = appended.get(op).map(Vec::as_slice).unwrap_or_default();
        assert!(
            ever.contains(frame),
            "op {op} reads back as a frame never appended under it"
        );
        assert!(*op > floor, "op {op} at or below the floor {floor}");
    }
    if damages == 0 {
        let above: BTreeMap<u64, Vec<u8>> = durable.split_off(&(floor + 1));
        assert_eq!(intact, above, "every durable op above the floor is intact");
        assert!(repair.is_empty(), "nothing to repair: {repair:?}");
    }
    let (again, repair_again) = reopen(&disk, floor);
    assert!(again == intact, "a second open agrees on the intact ops");
    assert_eq!(repair, repair_again, "and on what must be repaired");
});
