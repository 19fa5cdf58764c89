#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{FileKind, Filesystem, FsError, RenameMode};
use common::{fsck_clean, make_device, mount, root, user};

fn file(fs: &Filesystem, dir: u64, name: &[u8]) -> u64 {
    fs.create(dir, name, FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode
}

fn mkdir(fs: &Filesystem, dir: u64, name: &[u8]) -> u64 {
    fs.mkdir(dir, name, 0o755, &root()).unwrap().inode
}

fn names(fs: &Filesystem, dir: u64) -> Vec<Vec<u8>> {
    let mut out: Vec<_> = fs
        .readdir(dir, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    out.sort();
    out
}

fn rename(
    fs: &Filesystem,
    a: (u64, &[u8]),
    b: (u64, &[u8]),
    mode: RenameMode,
) -> Result<(), FsError> {
    fs.rename(a.0, a.1, b.0, b.1, mode, &root())
}

// Renames a file within a directory and across directories, over an existing file, and checks
// names, link counts and fsck after a remount.
#[test]
fn rename_files_within_and_across() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let a = mkdir(&fs, top, b"a");
    let b = mkdir(&fs, top, b"b");
    let f = file(&fs, a, b"f");
    let g = file(&fs, b, b"g");
    rename(&fs, (a, b"f"), (a, b"f2"), RenameMode::Replace).unwrap();
    assert_eq!(names(&fs, a), vec![b"f2".to_vec()]);
    rename(&fs, (a, b"f2"), (b, b"g"), RenameMode::Replace).unwrap();
    assert_eq!(names(&fs, a), Vec::<Vec<u8>>::new());
    assert_eq!(names(&fs, b), vec![b"g".to_vec()]);
    assert_eq!(fs.lookup(b, b"g").unwrap().inode, f);
    // The replaced file is gone: its inode is free once forgotten.
    fs.forget(g, 1);
    let left = fs.getattr(g);
    assert!(matches!(left, Err(FsError::NotFound)), "{left:?}");
    assert!(matches!(
        rename(&fs, (a, b"nothing"), (b, b"x"), RenameMode::Replace),
        Err(FsError::NotFound)
    ));
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    let b = fs.lookup(fs.root(), b"b").unwrap().inode;
    assert_eq!(fs.lookup(b, b"g").unwrap().inode, f);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Moves directories across parents and checks "..", link counts, and the errors for a
// directory over a file, a file over a directory, a non-empty target and a move into itself.
#[test]
fn rename_directories_links_and_errors() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let a = mkdir(&fs, top, b"a");
    let b = mkdir(&fs, top, b"b");
    let d = mkdir(&fs, a, b"d");
    let inner = mkdir(&fs, d, b"inner");
    file(&fs, top, b"plain");
    assert_eq!(fs.getattr(a).unwrap().nlink, 3);
    rename(&fs, (a, b"d"), (b, b"d"), RenameMode::Replace).unwrap();
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
    assert_eq!(fs.getattr(b).unwrap().nlink, 3);
    assert_eq!(fs.lookup(d, b"..").unwrap().inode, b);
    // Into its own subtree, and onto its own ancestor.
    assert!(matches!(
        rename(&fs, (b, b"d"), (inner, b"x"), RenameMode::Replace),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        rename(&fs, (b, b"d"), (d, b"x"), RenameMode::Replace),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        rename(&fs, (d, b"inner"), (top, b"b"), RenameMode::Replace),
        Err(FsError::NotEmpty)
    ));
    assert!(matches!(
        rename(&fs, (b, b"d"), (top, b"plain"), RenameMode::Replace),
        Err(FsError::NotDirectory)
    ));
    assert!(matches!(
        rename(&fs, (top, b"plain"), (b, b"d"), RenameMode::Replace),
        Err(FsError::IsDirectory)
    ));
    assert!(matches!(
        rename(&fs, (top, b"a"), (b, b"d"), RenameMode::Replace),
        Err(FsError::NotEmpty)
    ));
    // An empty directory over an empty directory.
    let e = mkdir(&fs, top, b"e");
    rename(&fs, (d, b"inner"), (top, b"e"), RenameMode::Replace).unwrap();
    assert_eq!(fs.lookup(top, b"e").unwrap().inode, inner);
    fs.forget(e, 1);
    assert!(matches!(fs.getattr(e), Err(FsError::NotFound)));
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    assert_eq!(fs.getattr(top).unwrap().nlink, 5);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Checks NoReplace and Exchange, including an exchange of a file and a directory across
// parents (link counts and ".." follow the directory).
#[test]
fn rename_noreplace_and_exchange() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let a = mkdir(&fs, top, b"a");
    let b = mkdir(&fs, top, b"b");
    let f = file(&fs, a, b"f");
    let d = mkdir(&fs, b, b"d");
    assert!(matches!(
        rename(&fs, (a, b"f"), (b, b"d"), RenameMode::NoReplace),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        rename(&fs, (a, b"f"), (b, b"none"), RenameMode::Exchange),
        Err(FsError::NotFound)
    ));
    rename(&fs, (a, b"f"), (a, b"g"), RenameMode::NoReplace).unwrap();
    rename(&fs, (a, b"g"), (b, b"d"), RenameMode::Exchange).unwrap();
    assert_eq!(fs.lookup(a, b"g").unwrap().inode, d);
    assert_eq!(fs.lookup(b, b"d").unwrap().inode, f);
    assert_eq!(fs.lookup(d, b"..").unwrap().inode, a);
    assert_eq!(fs.getattr(a).unwrap().nlink, 3);
    assert_eq!(fs.getattr(b).unwrap().nlink, 2);
    assert_eq!(fs.readdir(a, 0, 10).unwrap()[2].kind, FileKind::Directory);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A rename keeps the cookies of untouched entries valid: reading on from a cookie after the
// renames returns exactly the entries after it.
#[test]
fn rename_keeps_other_cookies() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    for index in 0..8u32 {
        file(&fs, top, format!("n{index}").as_bytes());
    }
    let first = fs.readdir(top, 0, 5).unwrap();
    let cookie = first.last().unwrap().cookie;
    rename(&fs, (top, b"n0"), (top, b"n7"), RenameMode::Replace).unwrap();
    let rest: Vec<_> = fs
        .readdir(top, cookie, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let expected: Vec<Vec<u8>> = (3..8).map(|i| format!("n{i}").into_bytes()).collect();
    assert_eq!(rest, expected);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Checks that rename obeys directory write permission and the sticky bit for non-root users.
#[test]
fn rename_permissions_and_sticky() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let shared = fs.mkdir(top, b"tmp", 0o1777, &root()).unwrap().inode;
    let mine = fs
        .create(shared, b"mine", FileKind::Regular, 0o644, 0, &user(1000))
        .unwrap()
        .inode;
    let other = user(2000);
    assert!(matches!(
        fs.rename(
            shared,
            b"mine",
            shared,
            b"stolen",
            RenameMode::Replace,
            &other
        ),
        Err(FsError::PermissionDenied)
    ));
    fs.rename(
        shared,
        b"mine",
        shared,
        b"kept",
        RenameMode::Replace,
        &user(1000),
    )
    .unwrap();
    assert_eq!(fs.lookup(shared, b"kept").unwrap().inode, mine);
    let locked = fs.mkdir(top, b"locked", 0o755, &root()).unwrap().inode;
    assert!(matches!(
        fs.rename(
            shared,
            b"kept",
            locked,
            b"x",
            RenameMode::Replace,
            &user(1000)
        ),
        Err(FsError::PermissionDenied)
    ));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Cookies handed out in short form stay valid after the directory moves to blocks: reading on
// from a short-form cookie returns every later old entry and none of the earlier ones.
#[test]
fn cookies_survive_the_move_to_blocks() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let dir = mkdir(&fs, top, b"d");
    for index in 0..6u32 {
        file(&fs, dir, format!("old{index}").as_bytes());
    }
    fs.unlink(dir, b"old1", &root()).unwrap();
    let first = fs.readdir(dir, 0, 4).unwrap();
    let cookie = first.last().unwrap().cookie;
    let seen: Vec<Vec<u8>> = first.iter().map(|e| e.name.clone()).collect();
    for index in 0..300u32 {
        file(
            &fs,
            dir,
            format!("new-entry-with-a-longer-name-{index}").as_bytes(),
        );
    }
    let rest: Vec<Vec<u8>> = fs
        .readdir(dir, cookie, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    for name in [&b"old3"[..], b"old4", b"old5"] {
        assert!(rest.iter().any(|n| n == name), "{name:?} missing");
    }
    for name in &seen {
        assert!(!rest.contains(name), "{name:?} came twice");
    }
    assert_eq!(rest.len(), 3 + 300);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

/// Names whose hashes collide, and names whose hashes are neighbours (one probe run).
fn colliding_names() -> Vec<Vec<u8>> {
    use std::collections::HashMap;
    let mut by_hash: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut out = Vec::new();
    // CRC32C never maps two same-length names that differ in at most 4 bytes to one value,
    // so the candidates are pseudo-random letters of random lengths.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..1_000_000u32 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let length = 6 + (state % 7) as usize;
        let name: Vec<u8> = (0..length)
            .map(|i| b'a' + ((state >> (4 * i + 3)) % 26) as u8)
            .collect();
        let hash = cairn_format::dir::name_hash(&name);
        for neighbour in [hash, hash.wrapping_add(1), hash.wrapping_sub(1)] {
            if let Some(other) = by_hash.get(&neighbour)
                && *other != name
                && !out.contains(other)
                && !out.contains(&name)
            {
                out.push(other.clone());
                out.push(name.clone());
            }
        }
        by_hash.insert(hash, name);
        if out.len() >= 12 {
            break;
        }
    }
    out
}

// Hash collisions and neighbouring hashes in the directory index: every name is found, and
// removing names in the middle of a probe run keeps the rest findable.
#[test]
fn index_handles_collisions_and_runs() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let dir = mkdir(&fs, top, b"d");
    for index in 0..100u32 {
        file(&fs, dir, format!("filler-{index}").as_bytes());
    }
    let names = colliding_names();
    assert!(names.len() >= 6, "found too few colliding names");
    for name in &names {
        file(&fs, dir, name);
    }
    for name in &names {
        fs.lookup(dir, name).unwrap();
    }
    for name in names.iter().step_by(2) {
        fs.unlink(dir, name, &root()).unwrap();
    }
    for (index, name) in names.iter().enumerate() {
        let found = fs.lookup(dir, name);
        match index % 2 {
            0 => assert!(matches!(found, Err(FsError::NotFound))),
            _ => assert!(found.is_ok(), "{name:?} lost"),
        }
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// needs_recovery is false on a fresh and a cleanly unmounted device and true after a crash
// (the filesystem dropped without unmount after a durable change).
#[test]
fn needs_recovery_follows_the_log() {
    let device = make_device(64 << 20);
    assert!(!Filesystem::needs_recovery(device.as_ref()).unwrap());
    let fs = mount(&device);
    file(&fs, fs.root(), b"f");
    fs.unmount().unwrap();
    assert!(!Filesystem::needs_recovery(device.as_ref()).unwrap());
    let fs = mount(&device);
    file(&fs, fs.root(), b"g");
    fs.sync().unwrap();
    drop(fs);
    assert!(Filesystem::needs_recovery(device.as_ref()).unwrap());
    let fs = mount(&device);
    fs.lookup(fs.root(), b"g").unwrap();
    fs.unmount().unwrap();
    assert!(!Filesystem::needs_recovery(device.as_ref()).unwrap());
    fsck_clean(&device);
}

// A removed directory that is still looked up (or open) takes no new entries: create,
// mkdir, link and rename into it fail with NotFound, as on Linux. It used to accept them, and
// the entries went with the directory when it was freed, leaving inodes no directory named
// (found by the concurrency stress test).
#[test]
fn a_removed_directory_takes_no_new_entries() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let gone = mkdir(&fs, fs.root(), b"gone");
    let kept = file(&fs, fs.root(), b"kept");
    fs.rmdir(fs.root(), b"gone", &root()).unwrap();
    let create = fs.create(gone, b"f", FileKind::Regular, 0o644, 0, &root());
    assert!(matches!(create, Err(FsError::NotFound)), "{create:?}");
    let made = fs.mkdir(gone, b"d", 0o755, &root());
    assert!(matches!(made, Err(FsError::NotFound)), "{made:?}");
    let linked = fs.link(kept, gone, b"l", &root());
    assert!(matches!(linked, Err(FsError::NotFound)), "{linked:?}");
    let moved = rename(&fs, (fs.root(), b"kept"), (gone, b"k"), RenameMode::Replace);
    assert!(matches!(moved, Err(FsError::NotFound)), "{moved:?}");
    fs.forget(gone, 1);
    fs.forget(kept, 1);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Inodes by number, as file handles name them: a live inode (any type) and "." find it with
// its generation; a freed number, a reused one (new generation), and numbers that name no
// allocated inode (free chunk slots, data blocks, AG headers, past the end) are NotFound,
// never a corruption error, even after a remount emptied the inode cache.
#[test]
fn inodes_by_number_for_file_handles() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let dir = mkdir(&fs, top, b"d");
    let f = file(&fs, dir, b"f");
    fs.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
    let generation = fs.lookup_inode(f).unwrap().generation;
    assert_eq!(fs.lookup(f, b".").unwrap().generation, generation);
    assert_eq!(fs.lookup_inode(dir).unwrap().inode, dir);
    fs.forget(dir, 1);
    fs.unlink(dir, b"f", &root()).unwrap();
    // Unlinked, it is gone for handles even while references wait to be dropped.
    assert!(matches!(fs.lookup_inode(f), Err(FsError::NotFound)));
    fs.forget(f, 3);
    assert!(matches!(fs.lookup_inode(f), Err(FsError::NotFound)));
    let again = fs
        .create(dir, b"again", FileKind::Regular, 0o644, 0, &root())
        .unwrap();
    assert_eq!(again.inode, f, "the freed number is reused first");
    assert_ne!(again.generation, generation);
    fs.unmount().unwrap();
    let fs = mount(&device);
    assert_eq!(fs.lookup_inode(f).unwrap().generation, again.generation);
    fs.forget(f, 1);
    let step = 1 + (f >> 5);
    let mut number = 0u64;
    while number < f.saturating_mul(64) {
        let known = [top, dir, f].contains(&number);
        match fs.lookup_inode(number) {
            Ok(attr) if known => fs.forget(attr.inode, 1),
            Ok(attr) => panic!("inode {number} found: {attr:?}"),
            Err(FsError::NotFound) => {}
            Err(error) => panic!("inode {number}: {error}"),
        }
        number += step;
    }
    assert!(matches!(fs.lookup_inode(u64::MAX), Err(FsError::NotFound)));
    fs.unmount().unwrap();
    fsck_clean(&device);
}
