//! What the storage fuzz targets share: the fuzzer's bytes read as a script, and the faults a
//! script can put into a durable image.

use journal::{MemStorage, OpenMode, SECTOR, Storage, block_on};

/// The fuzzer's bytes as a stream of small numbers (zeros once they run out).
pub struct Script<'a>(pub &'a [u8]);

impl Script<'_> {
    pub fn u8(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
}

/// One fault, chosen by `script`, in the durable image of `name` (`sectors` long): a bit flip,
/// a zeroed sector, one sector's bytes written over another's (a misdirected write), or the
/// file cut at a sector.
pub fn damage(disk: &MemStorage, name: &str, sectors: u64, script: &mut Script<'_>) {
    let sectors = sectors.max(1);
    let sector = u64::from(script.u8()) % sectors;
    match script.u8() % 4 {
        0 => {
            let byte = sector * SECTOR as u64 + u64::from(script.u16()) % SECTOR as u64;
            disk.flip_bit(name, byte, script.u8() % 8).expect("exists");
        }
        1 => disk.zero_sector(name, sector).expect("exists"),
        2 => {
            let to = u64::from(script.u8()) % sectors;
            let image = disk.durable_image(name).expect("exists");
            let at = (sector as usize * SECTOR).min(image.len());
            let mut copy = image[at..(at + SECTOR).min(image.len())].to_vec();
            copy.resize(SECTOR, 0);
            block_on(async {
                let file = disk.open(name, OpenMode::Existing).await.expect("exists");
                disk.write_at(&file, to * SECTOR as u64, &copy)
                    .await
                    .expect("aligned");
                disk.sync(&file).await.expect("in memory");
            });
        }
        _ => disk
            .truncate_file(name, sector * SECTOR as u64)
            .expect("exists"),
    }
}
