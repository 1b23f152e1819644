//! A small record replaced atomically: two files written alternately, each record framed with a
//! generation and a checksum, so a crash (or damage) of the copy being written leaves the other,
//! previous generation intact. Used for consumer offsets and the metadata snapshot.
//!
//! Record, at byte 0 of `{name}.0` / `{name}.1`, zero-padded to a sector:
//! `magic u32 | reserved u32 | generation u64 | len u64 | XXH3-64(bytes 0..24 ‖ payload) u64 |
//! payload`.

use wire::integrity::xxh3;

use crate::file::AlignedBuf;
use crate::storage::{OpenMode, Storage, StorageError, is_zero, read_exact_at, sector_ceil};

const HEAD: usize = 32;

/// One of the two copies as read at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyRead {
    /// Empty file.
    Empty,
    /// Intact, with its generation.
    Valid(u64),
    /// Present but not verifying.
    Damaged,
}

/// A record replaced atomically.
#[derive(Debug)]
pub struct PingPong<S: Storage> {
    storage: S,
    magic: u32,
    files: [S::File; 2],
    generation: u64,
}

fn decode(magic: u32, bytes: &[u8]) -> Result<Option<(u64, Vec<u8>)>, ()> {
    if is_zero(bytes) {
        return Ok(None);
    }
    let head = bytes.get(..HEAD).ok_or(())?;
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8"));
    if u32::from_le_bytes(head[0..4].try_into().expect("4")) != magic {
        return Err(());
    }
    let len = usize::try_from(u64_at(16)).map_err(|_| ())?;
    let payload = bytes
        .get(HEAD..HEAD.checked_add(len).ok_or(())?)
        .ok_or(())?;
    let mut input = head[..24].to_vec();
    input.extend_from_slice(payload);
    if xxh3(&input) != u64_at(24) {
        return Err(());
    }
    Ok(Some((u64_at(8), payload.to_vec())))
}

impl<S: Storage> PingPong<S> {
    /// Opens `{name}.0` and `{name}.1`; returns the store, the newest intact payload, and what
    /// each copy held.
    pub async fn open(
        storage: S,
        name: &str,
        magic: u32,
    ) -> Result<(PingPong<S>, Option<Vec<u8>>, [CopyRead; 2]), StorageError> {
        let a = storage.open(&format!("{name}.0"), OpenMode::Create).await?;
        let b = storage.open(&format!("{name}.1"), OpenMode::Create).await?;
        let mut best: Option<(u64, Vec<u8>)> = None;
        let mut reads = [CopyRead::Empty; 2];
        for (i, file) in [&a, &b].into_iter().enumerate() {
            let len = storage.len(file).await?;
            let mut bytes = vec![0u8; sector_ceil(len) as usize];
            let decoded = match read_exact_at(&storage, file, 0, &mut bytes).await {
                Ok(_) => decode(magic, &bytes),
                Err(e) if e.is_media() => Err(()),
                Err(e) => return Err(e),
            };
            reads[i] = match decoded {
                Ok(None) => CopyRead::Empty,
                Ok(Some((generation, payload))) => {
                    if best.as_ref().is_none_or(|(g, _)| generation > *g) {
                        best = Some((generation, payload));
                    }
                    CopyRead::Valid(generation)
                }
                Err(()) => CopyRead::Damaged,
            };
        }
        let generation = best.as_ref().map_or(0, |(g, _)| *g);
        let store = PingPong {
            storage,
            magic,
            files: [a, b],
            generation,
        };
        Ok((store, best.map(|(_, p)| p), reads))
    }

    /// Writes a new generation into the copy not holding the newest one; with `sync` it is
    /// durable on return.
    pub async fn write(&mut self, payload: &[u8], sync: bool) -> Result<(), StorageError> {
        let generation = self.generation + 1;
        let mut buf = AlignedBuf::zeroed(sector_ceil((HEAD + payload.len()) as u64) as usize);
        let out = buf.as_mut_slice();
        out[0..4].copy_from_slice(&self.magic.to_le_bytes());
        out[8..16].copy_from_slice(&generation.to_le_bytes());
        out[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        out[HEAD..HEAD + payload.len()].copy_from_slice(payload);
        let mut input = out[..24].to_vec();
        input.extend_from_slice(payload);
        let checksum = xxh3(&input);
        out[24..32].copy_from_slice(&checksum.to_le_bytes());
        let file = &self.files[(generation % 2) as usize];
        self.storage.set_len(file, buf.len() as u64).await?;
        self.storage.write_at(file, 0, buf.as_slice()).await?;
        if sync {
            self.storage.sync(file).await?;
        }
        self.generation = generation;
        Ok(())
    }

    /// The newest generation written or read.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{CrashMode, MemStorage, Prng};
    use crate::storage::block_on;

    #[test]
    fn newest_wins_and_a_crash_keeps_old_or_new() {
        for seed in 0..100 {
            let disk = MemStorage::new();
            block_on(async {
                let (mut store, none, _) = PingPong::open(disk.clone(), "o", 7).await.unwrap();
                assert!(none.is_none());
                store.write(b"one", true).await.unwrap();
                store.write(b"two", true).await.unwrap();
                store.write(&[3u8; 5000], false).await.unwrap();
                disk.crash(CrashMode::Reorder, &mut Prng::new(seed));
                let (_, value, _) = PingPong::open(disk.clone(), "o", 7).await.unwrap();
                let value = value.unwrap();
                assert!(value == b"two" || value == [3u8; 5000], "seed {seed}");
            });
        }
    }

    #[test]
    fn a_damaged_copy_is_reported_and_the_other_wins() {
        let disk = MemStorage::new();
        block_on(async {
            let (mut store, _, _) = PingPong::open(disk.clone(), "o", 7).await.unwrap();
            store.write(b"one", true).await.unwrap();
            store.write(b"two", true).await.unwrap();
            disk.flip_bit("o.0", 33, 1).unwrap(); // generation 2 lives in copy 0
            let (_, value, reads) = PingPong::open(disk.clone(), "o", 7).await.unwrap();
            assert_eq!(value.unwrap(), b"one");
            assert_eq!(reads, [CopyRead::Damaged, CopyRead::Valid(1)]);
        });
    }
}
