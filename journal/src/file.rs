//! The file backend on std files: `O_DIRECT` (optional) and `fdatasync`, with sector-aligned
//! buffers built without `unsafe` (an over-allocated `Vec` sliced at its first aligned byte).
//!
//! Calls are blocking and complete on the first poll. This is the production backend until a
//! glommio DMA backend lands (it needs `unsafe`-free DMA buffers behind a feature); on a
//! thread-per-core shard the group commit keeps the blocking `fdatasync` count low.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::storage::{OpenMode, SECTOR, Storage, StorageError, check_aligned, check_name};

/// A heap buffer whose usable slice starts on a [`SECTOR`] boundary, as `O_DIRECT` needs.
#[derive(Debug)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed aligned buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + SECTOR];
        let start = raw.as_ptr().align_offset(SECTOR);
        assert!(start < SECTOR, "align_offset on u8 is always possible");
        AlignedBuf { raw, start, len }
    }

    /// Makes the buffer `len` bytes long, keeping its allocation when it is large enough (no
    /// fresh pages to fault in for a buffer written again and again). The bytes are whatever
    /// the buffer held before, or zeros where it grew: the caller writes all it uses.
    pub fn reuse(&mut self, len: usize) {
        if self.raw.len() >= self.start + len {
            self.len = len;
        } else {
            *self = AlignedBuf::zeroed(len);
        }
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The aligned bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn is_aligned(bytes: &[u8]) -> bool {
    bytes.as_ptr().align_offset(SECTOR) == 0
}

/// A directory of files, optionally opened with `O_DIRECT`.
#[derive(Debug, Clone)]
pub struct FileStorage {
    root: PathBuf,
    direct: bool,
}

/// An open file of a [`FileStorage`].
#[derive(Debug)]
pub struct FileHandle {
    file: File,
    name: String,
    /// The same file opened `O_DSYNC` on the first [`Storage::write_durable`] (decision 496).
    dsync: std::cell::OnceCell<File>,
}

impl FileStorage {
    /// Storage over `root` (created if missing, its entry and every entry in it made durable).
    /// `direct` opens every file with `O_DIRECT`.
    pub fn new(root: &Path, direct: bool) -> Result<FileStorage, StorageError> {
        crate::storage::create_root(root)?;
        Ok(FileStorage {
            root: root.to_owned(),
            direct,
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn sync_dir(&self) -> Result<(), StorageError> {
        crate::storage::sync_dir(&self.root)
    }

    fn options(&self) -> OpenOptions {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if self.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options
    }

    /// `file`'s `O_DSYNC` descriptor, opened on first use.
    fn dsync<'a>(&self, file: &'a FileHandle) -> Result<&'a File, StorageError> {
        if let Some(dsync) = file.dsync.get() {
            return Ok(dsync);
        }
        let flags = if self.direct { libc::O_DIRECT } else { 0 } | libc::O_DSYNC;
        let opened = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(self.root.join(&file.name))
            .map_err(|e| StorageError::io("open", &file.name, &e))?;
        let identity = |f: &File| {
            f.metadata()
                .map(|m| (m.dev(), m.ino()))
                .map_err(|e| StorageError::io("stat", &file.name, &e))
        };
        if identity(&opened)? != identity(&file.file)? {
            return Err(StorageError::Replaced(file.name.clone()));
        }
        Ok(file.dsync.get_or_init(|| opened))
    }

    /// Writes `data` at `offset` through `target` (one of `file`'s descriptors), from an
    /// aligned copy when `O_DIRECT` needs one.
    fn write_through(
        &self,
        target: &File,
        file: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        check_aligned("write", &file.name, offset, data.len())?;
        let write = |bytes: &[u8]| {
            target
                .write_all_at(bytes, offset)
                .map_err(|e| StorageError::io("write", &file.name, &e))
        };
        if !self.direct || is_aligned(data) {
            return write(data);
        }
        let mut aligned = AlignedBuf::zeroed(data.len());
        aligned.as_mut_slice().copy_from_slice(data);
        write(aligned.as_slice())
    }
}

impl Storage for FileStorage {
    fn local_dir(&self) -> Option<&std::path::Path> {
        Some(&self.root)
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }

    type File = FileHandle;

    async fn open(&self, name: &str, mode: OpenMode) -> Result<FileHandle, StorageError> {
        check_name(name)?;
        let path = self.root.join(name);
        let existed = path.exists();
        let mut options = self.options();
        if mode == OpenMode::Create {
            options.create(true);
        }
        let file = options.open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StorageError::NotFound(name.to_owned())
            } else {
                StorageError::io("open", name, &e)
            }
        })?;
        if !existed {
            self.sync_dir()?;
        }
        Ok(FileHandle {
            file,
            name: name.to_owned(),
            dsync: std::cell::OnceCell::new(),
        })
    }

    async fn read_at(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError> {
        check_aligned("read", &file.name, offset, buf.len())?;
        let read = |target: &mut [u8]| -> Result<usize, StorageError> {
            let mut done = 0;
            while done < target.len() {
                match file.file.read_at(&mut target[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(StorageError::io("read", &file.name, &e)),
                }
            }
            Ok(done)
        };
        if !self.direct || is_aligned(buf) {
            return read(buf);
        }
        let mut aligned = AlignedBuf::zeroed(buf.len());
        let n = read(aligned.as_mut_slice())?;
        buf[..n].copy_from_slice(&aligned.as_slice()[..n]);
        Ok(n)
    }

    async fn write_at(
        &self,
        file: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.write_through(&file.file, file, offset, data)
    }

    /// Through a second descriptor of the file opened `O_DSYNC`: the kernel syncs before the
    /// write returns.
    async fn write_durable(
        &self,
        file: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        if cfg!(feature = "bug-sync-noop") {
            // BUG KNOB, as in `sync`: the write is never made durable.
            return self.write_through(&file.file, file, offset, data);
        }
        check_aligned("write", &file.name, offset, data.len())?;
        let dsync = self.dsync(file)?;
        self.write_through(dsync, file, offset, data)
    }

    async fn sync(&self, file: &FileHandle) -> Result<(), StorageError> {
        if cfg!(feature = "bug-sync-noop") {
            // BUG KNOB (never in a build that ships): nothing is ever made durable. The
            // power-loss tests must catch it (`.ci/run` shows they do).
            return Ok(());
        }
        file.file
            .sync_data()
            .map_err(|e| StorageError::io("sync", &file.name, &e))
    }

    async fn len(&self, file: &FileHandle) -> Result<u64, StorageError> {
        file.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| StorageError::io("stat", &file.name, &e))
    }

    async fn set_len(&self, file: &FileHandle, len: u64) -> Result<(), StorageError> {
        file.file
            .set_len(len)
            .map_err(|e| StorageError::io("truncate", &file.name, &e))
    }

    async fn remove(&self, name: &str) -> Result<(), StorageError> {
        check_name(name)?;
        std::fs::remove_file(self.root.join(name)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StorageError::NotFound(name.to_owned())
            } else {
                StorageError::io("remove", name, &e)
            }
        })?;
        self.sync_dir()
    }

    async fn list(&self) -> Result<Vec<String>, StorageError> {
        crate::storage::list_dir(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::block_on;

    pub(crate) fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("journal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [0, 1, SECTOR, 3 * SECTOR] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(is_aligned(buf.as_slice()) || len == 0);
        }
    }

    /// Decision 496: a durable write goes through a second descriptor opened by name, so it
    /// checks that the name still holds the handle's file; a file put in its place is refused,
    /// never written. Before that it reads back what it wrote.
    #[test]
    fn a_durable_write_refuses_a_file_put_in_its_place() {
        let dir = temp_dir("dsync");
        let storage = FileStorage::new(&dir, false).expect("temp dir");
        block_on(async {
            let f = storage.open("w", OpenMode::Create).await.unwrap();
            storage.write_durable(&f, 0, &[5u8; SECTOR]).await.unwrap();
            let mut back = vec![0u8; SECTOR];
            assert_eq!(storage.read_at(&f, 0, &mut back).await.unwrap(), SECTOR);
            assert!(back.iter().all(|b| *b == 5));
            let g = storage.open("g", OpenMode::Create).await.unwrap();
            std::fs::remove_file(dir.join("g")).unwrap();
            std::fs::write(dir.join("g"), [0u8; SECTOR]).unwrap();
            let refused = storage.write_durable(&g, 0, &[6u8; SECTOR]).await;
            assert_eq!(refused, Err(StorageError::Replaced("g".to_owned())));
            assert_eq!(std::fs::read(dir.join("g")).unwrap(), vec![0u8; SECTOR]);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn direct_io_round_trip_with_unaligned_caller_buffers() {
        let dir = temp_dir("direct");
        for direct in [true, false] {
            let Ok(storage) = FileStorage::new(&dir, direct) else {
                panic!("temp dir");
            };
            block_on(async {
                let f = match storage.open("x", OpenMode::Create).await {
                    Ok(f) => f,
                    // tmpfs refuses O_DIRECT: nothing to test there
                    Err(StorageError::Io {
                        errno: Some(libc::EINVAL),
                        ..
                    }) => return,
                    Err(e) => panic!("{e}"),
                };
                let mut data = vec![0u8; 2 * SECTOR + 1];
                data.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
                let unaligned = &data[1..];
                storage
                    .write_at(&f, SECTOR as u64, unaligned)
                    .await
                    .unwrap();
                storage.sync(&f).await.unwrap();
                let mut back = vec![0u8; 2 * SECTOR + 1];
                let n = storage
                    .read_at(&f, SECTOR as u64, &mut back[1..])
                    .await
                    .unwrap();
                assert_eq!(n, 2 * SECTOR);
                assert_eq!(&back[1..], unaligned);
                assert_eq!(storage.len(&f).await.unwrap(), 3 * SECTOR as u64);
                assert!(storage.list().await.unwrap().contains(&"x".to_owned()));
                storage.remove("x").await.unwrap();
            });
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
