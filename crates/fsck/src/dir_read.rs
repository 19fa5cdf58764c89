//! Reading a directory for the namespace checks: the short form from the inode, or the data
//! blocks mapped below file block 2^32 with the parent and index markers of block 0, and the
//! hash index whose blocks are mapped at file block 2^32 + block (see docs/fs.md).

use cairn_format::dir::{ShortformDir, dir_address, dir_data_entries, dir_data_salvage};
use cairn_format::inode::FileType;
use cairn_format::{Expected, Extent, FsBlock, MetaKind, verify_header};

use crate::check::Checker;
use crate::report::Problem;

/// File block of a directory's data fork where hash index tree block 0 would be mapped.
pub(crate) const INDEX_FILE_BASE: u64 = 1 << 32;
/// The block-form marker entries (file type `Unknown`) of data block 0.
const PARENT_MARKER: &[u8] = b"..parent";
const INDEX_MARKER: &[u8] = b"..index";

/// Where a directory's entries live, as the chunk walk found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirSource {
    /// The short-form bytes (the Local data fork up to `size`).
    Short(Vec<u8>),
    /// The data fork's extents, data and index blocks alike.
    Blocks(Vec<Extent>),
}

/// One user entry of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: Vec<u8>,
    pub inode: u64,
    pub file_type: FileType,
    /// Data address (block form) or tag (short form).
    pub address: u32,
}

/// What a directory holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Listing {
    pub parent: Option<u64>,
    pub entries: Vec<Entry>,
    /// The packed index root of the `..index` marker, in block form.
    pub index: Option<u64>,
    /// Entries repair removes, with why: of file type `Unknown` but not block 0's markers,
    /// or a second entry of one name.
    pub drop: Vec<(Entry, &'static str)>,
}

impl Checker<'_> {
    pub(crate) fn dir_problem(&mut self, dir: u64, block: Option<u64>, message: String) {
        let message = format!("directory {dir}: {message}");
        self.report
            .add(Problem::new("directory", block.or(Some(dir)), message));
    }

    /// Reads directory `dir`; `None` (with the problem reported) if it cannot be read.
    pub(crate) fn read_directory(&mut self, dir: u64, source: &DirSource) -> Option<Listing> {
        match source {
            DirSource::Short(bytes) => {
                let decoded = ShortformDir::decode(bytes)
                    .and_then(|sf| sf.check(&self.geometry).map(|()| sf));
                match decoded {
                    Ok(sf) => Some(Listing {
                        parent: Some(sf.parent),
                        entries: sf
                            .entries
                            .into_iter()
                            .map(|e| Entry {
                                name: e.name,
                                inode: e.inode,
                                file_type: e.file_type,
                                address: u32::from(e.tag),
                            })
                            .collect(),
                        index: None,
                        drop: Vec::new(),
                    }),
                    Err(err) => {
                        self.dir_problem(dir, None, err.to_string());
                        None
                    }
                }
            }
            DirSource::Blocks(extents) => self.read_block_directory(dir, extents),
        }
    }

    fn read_block_directory(&mut self, dir: u64, extents: &[Extent]) -> Option<Listing> {
        let mut listing = Listing::default();
        // cairn-fs reads data blocks 0 up to the last one mapped and refuses a hole.
        let mut next = 0;
        for extent in extents.iter().filter(|e| e.file_block < INDEX_FILE_BASE) {
            if extent.file_block > next {
                let message = format!("hole at data block {next}");
                self.dir_problem(dir, None, message);
            }
            next = next.max(extent.file_end());
            if extent.unwritten {
                let message = format!("data block {} is unwritten", extent.file_block);
                self.dir_problem(dir, None, message);
                continue;
            }
            for index in 0..u64::from(extent.length) {
                let file_block = extent.file_block + index;
                let at = extent.fs_block.0 + index;
                self.read_dir_data_block(dir, file_block, at, &mut listing)?;
            }
        }
        if listing.parent.is_none() {
            self.dir_problem(dir, None, "data block 0 has no parent marker".to_string());
        }
        Some(listing)
    }

    fn read_dir_data_block(
        &mut self,
        dir: u64,
        file_block: u64,
        at: u64,
        listing: &mut Listing,
    ) -> Option<()> {
        let block = self.read_block(FsBlock(at), MetaKind::DirData.name())?;
        let expected = Expected {
            kind: MetaKind::DirData,
            blkno: at,
            uuid: self.uuid,
            owner: Some(dir),
        };
        let entries = verify_header(&block, &expected).and_then(|_| dir_data_entries(&block));
        let entries = match entries {
            Ok(entries) => entries,
            Err(err) => {
                self.report.add(Problem::from_format(at, &err));
                if !self.repairing {
                    return None;
                }
                // Repair salvages what decodes and empties the rest (a lost block 0 gets
                // its markers back; the index is rebuilt over what the blocks hold).
                let mut copy = block.clone();
                match dir_data_salvage(&mut copy) {
                    Ok(entries) => {
                        self.findings.restamp_dir_blocks.push((at, dir));
                        entries
                    }
                    Err(_) => {
                        self.findings.lost_dir_blocks.push((at, dir, file_block));
                        Vec::new()
                    }
                }
            }
        };
        for entry in entries {
            let marker = entry.file_type == FileType::Unknown;
            if marker && file_block == 0 && entry.name == PARENT_MARKER {
                listing.parent = Some(entry.inode);
            } else if marker && file_block == 0 && entry.name == INDEX_MARKER {
                listing.index = Some(entry.inode);
            } else if marker {
                let message = format!("entry at offset {} has no file type", entry.offset);
                self.dir_problem(dir, Some(at), message);
                let address = u32::try_from(file_block)
                    .ok()
                    .and_then(|b| dir_address(b, entry.offset))
                    .unwrap_or(u32::MAX);
                let entry = Entry {
                    name: entry.name,
                    inode: entry.inode,
                    file_type: entry.file_type,
                    address,
                };
                listing.drop.push((entry, "no file type"));
            } else {
                let address = u32::try_from(file_block)
                    .ok()
                    .and_then(|b| dir_address(b, entry.offset))
                    .unwrap_or(u32::MAX);
                listing.entries.push(Entry {
                    name: entry.name,
                    inode: entry.inode,
                    file_type: entry.file_type,
                    address,
                });
            }
        }
        Some(())
    }
}

/// An entry's name for messages.
pub(crate) fn entry_name(entry: &Entry) -> String {
    String::from_utf8_lossy(&entry.name).into_owned()
}
