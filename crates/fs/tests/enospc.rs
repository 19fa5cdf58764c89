#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{FallocateMode, FileKind, Filesystem, FsError, XattrFlags};
use common::{fsck_clean, make_device, make_small_block_device, mount, root};

const CHUNK: usize = 256 << 10;

fn file(fs: &Filesystem, dir: u64, name: &[u8]) -> Result<u64, FsError> {
    fs.create(dir, name, FileKind::Regular, 0o644, 0, &root())
        .map(|a| a.inode)
}

/// Appends `CHUNK`-byte writes to `inode` until one fails; returns the error and the size.
fn fill_with_data(fs: &Filesystem, inode: u64) -> (FsError, u64) {
    let mut size = 0u64;
    let chunk = vec![0xa5u8; CHUNK];
    loop {
        match fs.write(inode, size, &chunk) {
            Ok(written) => size += u64::from(written),
            Err(error) => return (error, size),
        }
        assert!(size < 1 << 30, "the filesystem never filled");
    }
}

// Fills the filesystem with one file's data until NoSpace; the filesystem keeps working
// (reads, statfs, a small write into space freed by truncation), then deleting the file lets
// the same amount be written again, and fsck is clean throughout.
#[test]
fn fill_with_data_then_recover() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let big = file(&fs, top, b"big").unwrap();
    let (error, size) = fill_with_data(&fs, big);
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert!(size > 40 << 20, "only {size} bytes fit");
    assert_eq!(fs.getattr(big).unwrap().size, size);
    assert_eq!(fs.read(big, size - 10, 10).unwrap(), vec![0xa5; 10]);
    let free = fs.statfs().unwrap().blocks_free;
    assert!(free < 64, "{free} blocks still free");
    // A failed write leaves no trace: the file is unchanged and fsck is clean.
    fs.sync().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    assert_eq!(fs.getattr(big).unwrap().size, size);
    fs.setattr(big, &size_to(size - (1 << 20)), &root())
        .unwrap();
    let small = file(&fs, top, b"small").unwrap();
    fs.write(small, 0, &[7; 100_000]).unwrap();
    fs.unlink(top, b"big", &root()).unwrap();
    fs.forget(big, 1);
    let again = file(&fs, top, b"again").unwrap();
    let (error, again_size) = fill_with_data(&fs, again);
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert!(again_size + (1 << 20) > size, "{again_size} after {size}");
    assert_eq!(fs.read(small, 99_990, 10).unwrap(), vec![7; 10]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

fn size_to(size: u64) -> cairn_fs::SetAttr {
    cairn_fs::SetAttr {
        size: Some(size),
        ..cairn_fs::SetAttr::default()
    }
}

// Fills the space with data, frees a little, then creates files, directories and
// attributes until NoSpace; every failure leaves a working filesystem, deleting everything
// gives all blocks back, and fsck is clean.
#[test]
fn fill_with_files_then_recover() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    fs.sync().unwrap();
    let free_at_start = fs.statfs().unwrap().blocks_free;
    let big = file(&fs, top, b"big").unwrap();
    let (_, size) = fill_with_data(&fs, big);
    fs.setattr(big, &size_to(size - (512 << 10)), &root())
        .unwrap();
    let dir = fs.mkdir(top, b"d", 0o755, &root()).unwrap().inode;
    let mut names = Vec::new();
    let error = loop {
        let name = format!("file-with-a-longish-name-{:05}", names.len());
        let made = match names.len() % 10 {
            0 => fs
                .mkdir(dir, name.as_bytes(), 0o755, &root())
                .map(|a| a.inode),
            _ => file(&fs, dir, name.as_bytes()),
        };
        match made {
            Ok(inode) => {
                let _ = fs.setxattr(inode, b"user.tag", &[1; 40], XattrFlags::Any, &root());
                names.push((name, inode));
            }
            Err(error) => break error,
        }
        assert!(names.len() < 200_000, "the filesystem never filled");
    };
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert!(names.len() > 100, "only {} files", names.len());
    // Still working: lookups, readdir, statfs, and a create fails cleanly again.
    let (last, last_inode) = names.last().unwrap();
    assert_eq!(fs.lookup(dir, last.as_bytes()).unwrap().inode, *last_inode);
    assert!(fs.readdir(dir, 0, 10).unwrap().len() == 10);
    fs.statfs().unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    for (index, (name, _)) in names.iter().enumerate() {
        match index % 10 {
            0 => fs.rmdir(dir, name.as_bytes(), &root()).unwrap(),
            _ => fs.unlink(dir, name.as_bytes(), &root()).unwrap(),
        }
    }
    fs.rmdir(top, b"d", &root()).unwrap();
    fs.unlink(top, b"big", &root()).unwrap();
    let free = fs.statfs().unwrap().blocks_free;
    // Inode chunks stay allocated once made; everything else comes back.
    let chunk_blocks = 64 * 512 / 4096;
    let chunks = (names.len() as u64).div_ceil(64) + 1;
    assert!(
        free + chunks * chunk_blocks >= free_at_start,
        "{free} of {free_at_start}"
    );
    let again = file(&fs, top, b"again").unwrap();
    fs.write(again, 0, &vec![3; 4 << 20]).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Appends 3 MiB to one file (the speculative range past its end reaches 4 MiB) and keeps
// it, then fills the rest with another file: when the filesystem runs out, the first file's
// unused speculative blocks are freed and the filler gets them, so the file keeps only the
// blocks its size needs and almost nothing is left free.
#[test]
fn full_filesystem_takes_back_speculative_blocks() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let kept = file(&fs, top, b"kept").unwrap();
    let chunk = vec![0x42u8; 64 << 10];
    for index in 0..48 {
        fs.write(kept, index * chunk.len() as u64, &chunk).unwrap();
    }
    let block_size = 4096;
    let size = 48 * chunk.len() as u64;
    let held = |fs: &Filesystem| fs.getattr(kept).unwrap().blocks_512 * 512 / block_size;
    assert!(
        held(&fs) > size / block_size,
        "no speculative blocks to take back"
    );
    let filler = file(&fs, top, b"filler").unwrap();
    let (error, _) = fill_with_data(&fs, filler);
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert_eq!(held(&fs), size / block_size);
    let free = fs.statfs().unwrap().blocks_free;
    assert!(free < 64, "{free} blocks left free");
    assert_eq!(fs.read(kept, size - 10, 10).unwrap(), vec![0x42; 10]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// The last AG full but for single free blocks, the lower ones empty: a large write by a file
// of that AG takes what the AG can give and goes on in the others. The allocator used to stop
// at the AG its transaction had locked (AG locks ascend within a transaction, and the others
// are below it) and the write failed with NoSpace while three quarters of the filesystem
// were free: whenever the AG ran out within a step of several allocations, so the number of
// free single blocks varies.
#[test]
fn a_full_ag_sends_writes_to_the_others() {
    for holes in 200..216 {
        write_past_a_full_ag(holes);
    }
}

fn write_past_a_full_ag(holes: u64) {
    const BLOCK: u64 = 4096;
    let device = make_small_block_device(64 << 20, BLOCK as u32, 4);
    let fs = mount(&device);
    let ag_bytes = (64 << 20) / 4;
    let ags_of = |fs: &Filesystem, inode: u64| -> Vec<u64> {
        let extents = fs.file_extents(inode).unwrap();
        extents.iter().map(|e| e.physical / ag_bytes).collect()
    };
    let dir = (0..8)
        .map(|i| {
            let dir = fs.mkdir(fs.root(), format!("d{i}").as_bytes(), 0o755, &root());
            let dir = dir.unwrap().inode;
            let probe = file(&fs, dir, b"probe").unwrap();
            fs.write(probe, 0, &[1; 4096]).unwrap();
            (dir, ags_of(&fs, probe)[0])
        })
        .find(|&(_, ag)| ag == 3)
        .expect("a directory whose files go to the last AG")
        .0;
    let filler = file(&fs, dir, b"filler").unwrap();
    let chunk = vec![0x11u8; 256 << 10];
    let mut size = 0u64;
    while ags_of(&fs, filler).iter().all(|&ag| ag == 3) {
        fs.write(filler, size, &chunk).unwrap();
        size += chunk.len() as u64;
    }
    // No speculative blocks to take back: the write's retry after giving them back would
    // hide the failure.
    fs.trim_idle(std::time::Duration::ZERO).unwrap();
    for index in 0..holes {
        fs.fallocate(filler, index * 2 * BLOCK, BLOCK, FallocateMode::PunchHole)
            .unwrap();
    }
    let writer = file(&fs, dir, b"writer").unwrap();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let written = fs.write(writer, 0, &data);
    assert_eq!(
        written.unwrap() as usize,
        data.len(),
        "{holes} single free blocks"
    );
    assert_eq!(fs.read(writer, 0, data.len() as u32).unwrap(), data);
    assert!(ags_of(&fs, writer).iter().any(|&ag| ag < 3));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

/// Preallocates a file holding all but `left` bytes of the free space; returns the free
/// blocks then.
fn fill_but(fs: &Filesystem, left: u64) -> u64 {
    let statfs = fs.statfs().unwrap();
    let free = statfs.blocks_available * u64::from(statfs.block_size);
    let big = file(fs, fs.root(), b"big").unwrap();
    let mode = FallocateMode::Allocate { keep_size: false };
    fs.fallocate(big, 0, free - left, mode).unwrap();
    fs.sync().unwrap();
    fs.statfs().unwrap().blocks_free
}

// A fallocate asking for more than is free fails with NoSpace and takes nothing: the file
// holds the blocks it held, and the free space is what it was (issue 32: a failed 2 GiB
// fallocate on a 4 GiB filesystem with 3 GiB in use left 891 MiB allocated, the filesystem
// full). So does one into a file with data and holes, keeping its size.
#[test]
fn a_failed_fallocate_takes_nothing() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let free_before = fill_but(&fs, 4 << 20);
    let second = file(&fs, fs.root(), b"second").unwrap();
    fs.write(second, 1 << 20, &[9; 8192]).unwrap();
    let held = fs.getattr(second).unwrap().blocks_512;
    let free_before = free_before - held / 8;
    for (offset, mode) in [
        (0, FallocateMode::Allocate { keep_size: false }),
        (0, FallocateMode::Allocate { keep_size: true }),
        (2 << 20, FallocateMode::ZeroRange { keep_size: true }),
    ] {
        let error = fs.fallocate(second, offset, 16 << 20, mode).unwrap_err();
        assert!(matches!(error, FsError::NoSpace), "{mode:?}: {error:?}");
        let attr = fs.getattr(second).unwrap();
        assert_eq!(attr.blocks_512, held, "{mode:?}");
        assert_eq!(attr.size, (1 << 20) + 8192, "{mode:?}");
        assert!(
            fs.read(second, 1 << 20, 8192).unwrap() == [9; 8192],
            "{mode:?}"
        );
        assert_eq!(fs.statfs().unwrap().blocks_free, free_before, "{mode:?}");
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A write larger than the free space maps what there is, then finds the filesystem full: it
// fails with NoSpace and gives back what it mapped, so the file holds no more blocks than
// before, direct and through write-behind's writeback alike.
#[test]
fn a_write_that_finds_the_filesystem_full_gives_its_blocks_back() {
    for cache in [0, 64 << 20] {
        let device = make_device(64 << 20);
        let options = cairn_fs::MountOptions {
            data_cache: cache,
            ..Default::default()
        };
        let fs = common::mount_with(&device, options);
        let free_before = fill_but(&fs, 2 << 20);
        let second = file(&fs, fs.root(), b"second").unwrap();
        let written = fs.write(second, 0, &vec![5; 4 << 20]);
        let synced = fs.fsync(second, false);
        let error = written.and(synced).unwrap_err();
        assert!(
            matches!(error, FsError::NoSpace),
            "cache {cache}: {error:?}"
        );
        assert_eq!(fs.getattr(second).unwrap().blocks_512, 0, "cache {cache}");
        assert_eq!(
            fs.statfs().unwrap().blocks_free,
            free_before,
            "cache {cache}"
        );
        fs.unmount().unwrap();
        fsck_clean(&device);
    }
}

// A directory's add that needs a new data block and an index split at once, on a filesystem
// with room for the data block only: it fails with NoSpace and gives the data block back (the
// directory's size is what it was); with room for both it succeeds. fsck is clean.
#[test]
fn a_failed_directory_growth_gives_its_block_back() {
    let link_name = |index: u32| format!("a-link-with-a-name-long-enough-{index:06}");
    let setup = || {
        let device = make_small_block_device(16 << 20, 1024, 2);
        let fs = mount(&device);
        let target = file(&fs, fs.root(), b"target").unwrap();
        let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
        (device, fs, target, dir)
    };
    // Which add grows the directory by a data block and an index block at once.
    let (_, fs, target, dir) = setup();
    let sizes = |fs: &Filesystem| {
        let attr = fs.getattr(dir).unwrap();
        (attr.size, attr.blocks_512)
    };
    let mut index = 0;
    let splitting = loop {
        let before = sizes(&fs);
        fs.link(target, dir, link_name(index).as_bytes(), &root())
            .unwrap();
        let after = sizes(&fs);
        // In block form, a new data block and at least one index block.
        if before.0 >= 2048 && after.0 > before.0 && after.1 >= before.1 + 2 * 2 {
            break index;
        }
        index += 1;
        assert!(index < 5000, "no add grew the directory by two blocks");
    };
    drop(fs);
    for room in [1, 2, 8] {
        let (device, fs, target, dir) = setup();
        for index in 0..splitting {
            fs.link(target, dir, link_name(index).as_bytes(), &root())
                .unwrap();
        }
        fill_but(&fs, room * 1024);
        let size = fs.getattr(dir).unwrap().size;
        match fs.link(target, dir, link_name(splitting).as_bytes(), &root()) {
            Ok(_) => assert!(room > 1, "the add fitted in one block"),
            Err(FsError::NoSpace) => assert_eq!(fs.getattr(dir).unwrap().size, size),
            Err(error) => panic!("{error:?}"),
        }
        fs.unmount().unwrap();
        fsck_clean(&device);
    }
}

// Growing a file by truncate allocates nothing, also over blocks preallocated past its end
// (which turn unwritten, so they read as zeros): on a full filesystem it succeeds and the
// file holds exactly the blocks it held.
#[test]
fn truncate_up_on_a_full_filesystem_takes_nothing() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let grown = file(&fs, fs.root(), b"grown").unwrap();
    fs.write(grown, 0, &[4; 10_000]).unwrap();
    let keep = FallocateMode::Allocate { keep_size: true };
    fs.fallocate(grown, 0, 1 << 20, keep).unwrap();
    let free = fill_but(&fs, 0);
    let held = fs.getattr(grown).unwrap().blocks_512;
    for size in [20_000, 1 << 20, 64 << 20] {
        fs.setattr(grown, &size_to(size), &root()).unwrap();
        let attr = fs.getattr(grown).unwrap();
        assert_eq!((attr.size, attr.blocks_512), (size, held));
        assert_eq!(fs.statfs().unwrap().blocks_free, free);
    }
    assert!(fs.read(grown, 9_000, 2_000).unwrap()[1_000..] == [0; 1_000]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}
