//! The glommio DMA backend (feature `glommio`): `O_DIRECT` files driven through io_uring by the
//! shard's executor, with glommio's own aligned `DmaBuffer`s, so no `unsafe` here either.
//!
//! Must run inside a glommio `LocalExecutor`. Glommio registers `io_memory` bytes of buffers per
//! ring in locked memory; [`memlock_limit`] reads `RLIMIT_MEMLOCK` so the shard can report
//! whether `io_memory x 3 rings x executors` fits (DESIGN.md §6) instead of relying on glommio's
//! silent fallback to unregistered buffers.

use std::path::{Path, PathBuf};

use std::os::unix::fs::{FileExt, OpenOptionsExt};

use glommio::io::{DmaFile, OpenOptions};

use crate::file::AlignedBuf;

use crate::storage::{OpenMode, Storage, StorageError, check_aligned, check_name};

/// A directory of DMA files.
///
/// Reads try glommio's `read_at_aligned` (io_uring `READ_FIXED`); a kernel that answers
/// `EOPNOTSUPP` (seen on this project's VMs) switches the storage to `pread(2)` on an
/// `O_DIRECT` std descriptor of the same file, which blocks the shard for the read: reads happen
/// at recovery, for repair and for cold polls. Writes and `fdatasync` always go through io_uring.
#[derive(Debug, Clone)]
pub struct DmaStorage {
    root: PathBuf,
    reads_through_std: std::rc::Rc<std::cell::Cell<bool>>,
}

/// An open DMA file.
#[derive(Debug)]
pub struct DmaHandle {
    file: DmaFile,
    name: String,
    /// The same file through std, for reads when glommio's fixed-buffer reads are refused.
    fallback: std::fs::File,
}

fn io_error<T>(op: &'static str, name: &str, error: glommio::GlommioError<T>) -> StorageError {
    let error = std::io::Error::from(error);
    if error.kind() == std::io::ErrorKind::NotFound {
        return StorageError::NotFound(name.to_owned());
    }
    StorageError::io(op, name, &error)
}

/// `RLIMIT_MEMLOCK` soft limit in bytes (`None` when unlimited or unreadable).
pub fn memlock_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line.split_whitespace().nth(3)?;
    soft.parse().ok()
}

impl DmaStorage {
    /// Storage over `root` (created if missing).
    pub fn new(root: &Path) -> Result<DmaStorage, StorageError> {
        std::fs::create_dir_all(root)
            .map_err(|e| StorageError::io("mkdir", &root.display().to_string(), &e))?;
        Ok(DmaStorage {
            root: root.to_owned(),
            reads_through_std: std::rc::Rc::new(std::cell::Cell::new(false)),
        })
    }

    /// Whether reads fell back to `pread(2)` (glommio's fixed-buffer reads were refused).
    pub fn reads_through_std(&self) -> bool {
        self.reads_through_std.get()
    }

    fn sync_dir(&self) -> Result<(), StorageError> {
        crate::storage::sync_dir(&self.root)
    }
}

impl Storage for DmaStorage {
    type File = DmaHandle;

    async fn open(&self, name: &str, mode: OpenMode) -> Result<DmaHandle, StorageError> {
        check_name(name)?;
        let path = self.root.join(name);
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(mode == OpenMode::Create)
            .dma_open(&path)
            .await
            .map_err(|e| io_error("open", name, e))?;
        if !existed {
            self.sync_dir()?;
        }
        let fallback = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .map_err(|e| StorageError::io("open", name, &e))?;
        Ok(DmaHandle {
            file,
            name: name.to_owned(),
            fallback,
        })
    }

    async fn read_at(
        &self,
        file: &DmaHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError> {
        check_aligned("read", &file.name, offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() && !self.reads_through_std.get() {
            let chunk = (buf.len() - done).min(1 << 20);
            let read = match file.file.read_at_aligned(offset + done as u64, chunk).await {
                Ok(read) => read,
                Err(e) => {
                    let error = std::io::Error::from(e);
                    if error.raw_os_error() == Some(libc::EOPNOTSUPP)
                        || error.kind() == std::io::ErrorKind::Unsupported
                    {
                        self.reads_through_std.set(true);
                        break;
                    }
                    return Err(StorageError::io("read", &file.name, &error));
                }
            };
            buf[done..done + read.len()].copy_from_slice(&read);
            done += read.len();
            if read.len() < chunk {
                return Ok(done);
            }
        }
        if done < buf.len() {
            let mut aligned = AlignedBuf::zeroed(buf.len() - done);
            let target = aligned.as_mut_slice();
            let mut got = 0;
            while got < target.len() {
                match file
                    .fallback
                    .read_at(&mut target[got..], offset + (done + got) as u64)
                {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(StorageError::io("read", &file.name, &e)),
                }
            }
            buf[done..done + got].copy_from_slice(&aligned.as_slice()[..got]);
            done += got;
        }
        Ok(done)
    }

    async fn write_at(
        &self,
        file: &DmaHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        check_aligned("write", &file.name, offset, data.len())?;
        let mut buffer = file.file.alloc_dma_buffer(data.len());
        buffer.as_bytes_mut().copy_from_slice(data);
        let written = file
            .file
            .write_at(buffer, offset)
            .await
            .map_err(|e| io_error("write", &file.name, e))?;
        if written != data.len() {
            return Err(StorageError::Io {
                op: "write",
                name: file.name.clone(),
                kind: std::io::ErrorKind::WriteZero,
                errno: None,
            });
        }
        Ok(())
    }

    async fn sync(&self, file: &DmaHandle) -> Result<(), StorageError> {
        file.file
            .fdatasync()
            .await
            .map_err(|e| io_error("sync", &file.name, e))
    }

    async fn len(&self, file: &DmaHandle) -> Result<u64, StorageError> {
        file.file
            .file_size()
            .await
            .map_err(|e| io_error("stat", &file.name, e))
    }

    async fn set_len(&self, file: &DmaHandle, len: u64) -> Result<(), StorageError> {
        file.file
            .truncate(len)
            .await
            .map_err(|e| io_error("truncate", &file.name, e))
    }

    async fn remove(&self, name: &str) -> Result<(), StorageError> {
        check_name(name)?;
        glommio::io::remove(self.root.join(name))
            .await
            .map_err(|e| io_error("remove", name, e))?;
        self.sync_dir()
    }

    async fn list(&self) -> Result<Vec<String>, StorageError> {
        crate::storage::list_dir(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{JournalConfig, MetadataJournal};
    use crate::prepare::tests::prepare;
    use crate::storage::SECTOR;
    use crate::wal::{PartitionWal, WalConfig};
    use glommio::{LocalExecutorBuilder, Placement};

    #[test]
    fn the_journal_runs_on_glommio_dma_files() {
        eprintln!("RLIMIT_MEMLOCK: {:?} bytes", memlock_limit());
        let dir = std::env::temp_dir().join(format!("journal-dma-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.clone();
        let handle = LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(2 * 1024 * 1024)
            .spawn(move || async move {
                let storage = DmaStorage::new(&root).unwrap();
                let f = storage.open("x", OpenMode::Create).await.unwrap();
                storage
                    .write_at(&f, 0, &vec![7u8; 2 * SECTOR])
                    .await
                    .unwrap();
                storage.sync(&f).await.unwrap();
                let mut back = vec![0u8; 2 * SECTOR];
                assert_eq!(storage.read_at(&f, 0, &mut back).await.unwrap(), 2 * SECTOR);
                assert!(back[..2 * SECTOR].iter().all(|b| *b == 7));
                let config = JournalConfig {
                    slot_count: 16,
                    slot_size: 4 * SECTOR as u64,
                };
                let (mut journal, _) = MetadataJournal::open(storage.clone(), config, 0, 0)
                    .await
                    .unwrap();
                let mut parent = 0;
                for op in 1..=20 {
                    if journal.capacity_remaining() == 0 {
                        journal.set_checkpoint(op - 9).unwrap();
                    }
                    let frame = prepare(op, parent, 5000, 1);
                    journal.append(&frame).await.unwrap();
                    parent = crate::prepare::verify_frame(&frame, true)
                        .unwrap()
                        .identity();
                }
                let (journal, recovery) = MetadataJournal::open(storage.clone(), config, 11, 0)
                    .await
                    .unwrap();
                assert!(recovery.is_clean(), "{recovery:?}");
                assert_eq!(recovery.op_head, 20);
                assert!(journal.read(20).await.is_ok());
                let wal_config = WalConfig {
                    file_size_max: 1 << 20,
                    window_bytes_max: 1 << 18,
                    window_us_max: 0,
                };
                let (mut wal, _) = PartitionWal::open(storage.clone(), wal_config, |_| {})
                    .await
                    .unwrap();
                for i in 0..50u64 {
                    wal.submit(i % 3, &vec![i as u8; 3000], 0).unwrap();
                }
                assert_eq!(wal.commit().await.unwrap(), 50);
                let mut seen = 0;
                let (_, recovery) = PartitionWal::open(storage.clone(), wal_config, |_| seen += 1)
                    .await
                    .unwrap();
                assert!(recovery.is_clean());
                assert_eq!(seen, 50);
                storage.reads_through_std()
            })
            .unwrap();
        let fell_back = handle.join().unwrap();
        eprintln!("glommio reads fell back to pread(2): {fell_back}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
