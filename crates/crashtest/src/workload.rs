//! Workload generators: ACE-style systematic sequences of one and two operations over the
//! setup tree, each followed by a persistence call, and long random sequences.

use cairn_fs::{FallocateMode, RenameMode};

use crate::model::{Model, join, parent_of};
use crate::op::{self, Op, clone, fallocate, truncate};

/// A named workload: the ops run after the setup.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub ops: Vec<Op>,
}

fn write(path: &str, offset: u64, len: u64) -> Op {
    Op::Write {
        path: path.into(),
        offset,
        len,
        id: 0,
    }
}

fn write_direct(path: &str, offset: u64, len: u64) -> Op {
    Op::WriteDirect {
        path: path.into(),
        offset,
        len,
        id: 0,
    }
}

fn rewrite(path: &str, len: u64) -> Op {
    Op::Rewrite {
        path: path.into(),
        len,
        id: 0,
    }
}

fn link(from: &str, to: &str) -> Op {
    Op::Link {
        from: from.into(),
        to: to.into(),
    }
}

fn rename(from: &str, to: &str, mode: RenameMode) -> Op {
    Op::Rename {
        from: from.into(),
        to: to.into(),
        mode,
    }
}

fn rename_whiteout(from: &str, to: &str, mode: RenameMode) -> Op {
    Op::RenameWhiteout {
        from: from.into(),
        to: to.into(),
        mode,
    }
}

fn tmpfile(path: &str, len: u64) -> Op {
    Op::Tmpfile {
        path: path.into(),
        len,
        id: 0,
    }
}

fn setxattr(path: &str, name: &str, len: u64) -> Op {
    Op::SetXattr {
        path: path.into(),
        name: name.into(),
        len,
        id: 0,
    }
}

/// The operations the systematic generator combines, on names of the setup tree: create,
/// mkdir, write (new file, overwrite aligned and not, append, past the end), truncate (to
/// zero, mid-block, up), link, unlink, rmdir, symlink, rename (within and across
/// directories, over a file, a directory, no-replace, exchange, leaving a whiteout),
/// O_TMPFILE then linkat, setxattr (new, replace, on a directory, large), removexattr,
/// and fallocate in every mode (collapse and insert range included).
pub fn op_templates() -> Vec<Op> {
    vec![
        Op::Create("new".into()),
        Op::Create("A/new".into()),
        Op::Mkdir("dnew".into()),
        Op::Mkdir("A/dnew".into()),
        write("A/C/baz", 0, 8192),
        write("foo", 0, 4096),
        write("foo", 1000, 3000),
        write("foo", 16384, 5000),
        write("foo", 40000, 100),
        write("A/bar", 5000, 2000),
        truncate("foo", 0),
        rewrite("foo", 6000),
        truncate("foo", 5000),
        truncate("foo", 30000),
        truncate("A/bar", 4096),
        link("foo", "A/lnk"),
        link("A/C/baz", "B/baz2"),
        Op::Unlink("foo".into()),
        Op::Unlink("B/bar2".into()),
        Op::Unlink("ln".into()),
        Op::Rmdir("E".into()),
        Op::Symlink {
            path: "A/sym".into(),
            target: b"../foo".to_vec(),
        },
        rename("foo", "A/foo2", RenameMode::Replace),
        rename("A/bar", "A/bar3", RenameMode::Replace),
        rename("foo", "A/bar", RenameMode::Replace),
        rename("A/C", "B/C2", RenameMode::NoReplace),
        rename("foo", "A/bar", RenameMode::Exchange),
        rename("B", "A/C", RenameMode::Exchange),
        rename_whiteout("foo", "A/foo2", RenameMode::Replace),
        rename_whiteout("foo", "A/bar", RenameMode::Replace),
        rename_whiteout("A/C", "B/C2", RenameMode::NoReplace),
        tmpfile("A/tmp", 10000),
        tmpfile("new", 100),
        setxattr("foo", "user.n", 40),
        setxattr("foo", "user.s", 3000),
        setxattr("A/C", "user.d", 100),
        Op::RemoveXattr {
            path: "foo".into(),
            name: "user.s".into(),
        },
        fallocate(
            "foo",
            16384,
            8192,
            FallocateMode::Allocate { keep_size: true },
        ),
        fallocate(
            "foo",
            20000,
            10000,
            FallocateMode::Allocate { keep_size: false },
        ),
        fallocate("foo", 1000, 9000, FallocateMode::PunchHole),
        fallocate(
            "foo",
            3000,
            5000,
            FallocateMode::ZeroRange { keep_size: true },
        ),
        fallocate(
            "A/bar",
            5000,
            4000,
            FallocateMode::ZeroRange { keep_size: false },
        ),
        fallocate("foo", 4096, 4096, FallocateMode::CollapseRange),
        fallocate("foo", 4096, 8192, FallocateMode::InsertRange),
    ]
}

/// The persistence calls that may follow `done` on `model` (which it was applied to):
/// fsync and fdatasync of the path it touched, fsync of that path's directory, sync, and
/// the commit window passing.
pub fn persist_choices(model: &Model, done: &Op) -> Vec<Op> {
    let path = done.primary_path();
    let mut choices = Vec::new();
    if model.node_at(path).is_some() {
        choices.push(Op::Fsync(path.into()));
        if !model.is_dir(path) {
            choices.push(Op::Fdatasync(path.into()));
        }
    }
    choices.push(Op::Fsync(parent_of(path).into()));
    if let Op::Rename { from, .. } | Op::RenameWhiteout { from, .. } = done
        && parent_of(from) != parent_of(path)
        && model.is_dir(parent_of(from))
    {
        choices.push(Op::Fsync(parent_of(from).into()));
    }
    choices.push(Op::Sync);
    choices.push(Op::Wait);
    choices
}

/// Gives every write and attribute value of `ops` its own pattern id.
fn number_writes(ops: &mut [Op]) {
    for (index, step) in ops.iter_mut().enumerate() {
        if let Op::Write { id, .. }
        | Op::WriteDirect { id, .. }
        | Op::Rewrite { id, .. }
        | Op::Tmpfile { id, .. }
        | Op::SetXattr { id, .. } = step
        {
            *id = 1000 + index as u64;
        }
    }
}

/// The model after the setup (inode numbers are placeholders).
pub fn setup_model() -> Model {
    let mut model = Model::default();
    for setup_op in op::setup_ops() {
        op::apply(&mut model, &setup_op, None, 0);
    }
    model
}

/// Applies `ops` to a copy of `model` if every one is valid in turn.
fn try_apply(model: &Model, ops: &[Op]) -> Option<Model> {
    let mut model = model.clone();
    for (step, next) in ops.iter().enumerate() {
        if !op::valid(&model, next) {
            return None;
        }
        op::apply(&mut model, next, Some(step), 0);
    }
    Some(model)
}

fn name_of_ops(ops: &[Op]) -> String {
    ops.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn workload(mut ops: Vec<Op>) -> Workload {
    number_writes(&mut ops);
    Workload {
        name: name_of_ops(&ops),
        ops,
    }
}

/// Every one-operation workload: each template followed by each of its persistence calls.
pub fn seq1() -> Vec<Workload> {
    let setup = setup_model();
    let mut out = Vec::new();
    for template in op_templates() {
        let Some(after) = try_apply(&setup, std::slice::from_ref(&template)) else {
            continue;
        };
        for persist in persist_choices(&after, &template) {
            out.push(workload(vec![template.clone(), persist]));
        }
    }
    out
}

/// Every valid two-operation workload: both ops then each persistence call of the second,
/// and both ops each followed by a persistence call (rotating through the choices).
pub fn seq2() -> Vec<Workload> {
    let setup = setup_model();
    let templates = op_templates();
    let mut out = Vec::new();
    for (first_index, first) in templates.iter().enumerate() {
        let Some(after_first) = try_apply(&setup, std::slice::from_ref(first)) else {
            continue;
        };
        let first_persists = persist_choices(&after_first, first);
        for (second_index, second) in templates.iter().enumerate() {
            let pair = [first.clone(), second.clone()];
            let Some(after) = try_apply(&setup, &pair) else {
                continue;
            };
            let rotation = first_index + second_index;
            for (index, persist) in persist_choices(&after, second).into_iter().enumerate() {
                let mut ops = pair.to_vec();
                if index % 2 == 1 {
                    let middle = first_persists[(rotation + index) % first_persists.len()].clone();
                    ops.insert(1, middle);
                }
                ops.push(persist);
                if try_apply(&setup, &ops).is_some() {
                    out.push(workload(ops));
                }
            }
        }
    }
    out
}

/// The attribute index workloads (run after `op::xattr_setup_ops`, which puts "foo"'s
/// attributes in index form): a new attribute, a replace in place, a replace by a remote
/// value (which moves it to another leaf), a removal, a large new one, two changes in a row,
/// and unlinking "foo" (its attributes freed in steps); each followed by each of its
/// persistence calls.
pub fn xattr_index() -> Vec<Workload> {
    let mut setup = setup_model();
    for setup_op in op::xattr_setup_ops().iter().skip(op::setup_ops().len()) {
        op::apply(&mut setup, setup_op, None, 0);
    }
    let remove = |index| Op::RemoveXattr {
        path: "foo".into(),
        name: op::bulk_xattr(index),
    };
    let sequences = vec![
        vec![setxattr("foo", "user.new", 24)],
        vec![setxattr("foo", &op::bulk_xattr(42), 3)],
        vec![setxattr("foo", &op::bulk_xattr(7), 3000)],
        vec![remove(100)],
        vec![setxattr("foo", "user.large", 20_000)],
        vec![remove(5), setxattr("foo", &op::bulk_xattr(6), 600)],
        vec![Op::Unlink("foo".into())],
    ];
    let mut out = Vec::new();
    for ops in sequences {
        let Some(after) = try_apply(&setup, &ops) else {
            continue;
        };
        let last = ops.last().cloned().unwrap_or(Op::Sync);
        for persist in persist_choices(&after, &last) {
            let mut ops = ops.clone();
            ops.push(persist);
            out.push(workload(ops));
        }
    }
    out
}

/// The collapse and insert workloads (run after `op::shift_setup_ops`, which makes "frag"
/// an extent tree of `SHIFT_EXTENTS` one-block extents): collapses and inserts at its start,
/// in its middle (edges inside extents and in holes) and near its end, a shift after a
/// write, two shifts in a row; each followed by each of its persistence calls. With
/// `logmode=sync` crash points fall between a shift's steps; the oracle then holds the
/// file to one whole version (`Expectation::shift_whole`).
pub fn shift() -> Vec<Workload> {
    let mut setup = setup_model();
    for setup_op in op::shift_setup_ops().iter().skip(op::setup_ops().len()) {
        op::apply(&mut setup, setup_op, None, 0);
    }
    let block = op::SHIFT_ALIGN;
    let collapse = |offset: u64, len: u64| {
        fallocate(
            "frag",
            offset * block,
            len * block,
            FallocateMode::CollapseRange,
        )
    };
    let insert = |offset: u64, len: u64| {
        fallocate(
            "frag",
            offset * block,
            len * block,
            FallocateMode::InsertRange,
        )
    };
    let sequences = vec![
        vec![collapse(0, 3)],
        vec![collapse(5, 4)],
        vec![collapse(60, 12)],
        vec![insert(0, 2)],
        vec![insert(7, 5)],
        vec![insert(70, 1)],
        vec![write("frag", 3 * block, 2 * block), collapse(2, 6)],
        vec![insert(10, 3), collapse(1, 5)],
    ];
    let mut out = Vec::new();
    for ops in sequences {
        let Some(after) = try_apply(&setup, &ops) else {
            continue;
        };
        let last = ops.last().cloned().unwrap_or(Op::Sync);
        for persist in persist_choices(&after, &last) {
            let mut ops = ops.clone();
            ops.push(persist);
            out.push(workload(ops));
        }
    }
    out
}

/// Write-behind cap that makes writers write back mid-workload: a few of the workloads
/// below cache more than this, so a later write finds the cache full and writes the oldest
/// file back first (and a `Writeback` pass finds it over a quarter of the cap).
pub const SMALL_DATA_CACHE_BYTES: u64 = 64 << 10;
/// Write-behind cap no workload reaches: data stays in memory until an op writes it back.
pub const LARGE_DATA_CACHE_BYTES: u64 = 64 << 20;

/// The write-behind bodies that end in cached data, each run below followed by nothing (the
/// crash comes before the unmount writes it back), fsync, fdatasync and sync: an append, an
/// overwrite in place, a new file (a reservation outstanding), a write past the end (a hole
/// and a zeroed end-of-file page), several runs of one file (crash points fall with some
/// runs' data on the device and others' not, or, with a sync log, between a run's
/// allocation and its conversion), a new file
/// over the small cap (the next write writes the oldest file back first), truncates and
/// fallocates over cached pages, an `O_DIRECT` write and a seek (both write the pages back
/// first), and a background writeback pass.
fn write_behind_bodies() -> Vec<Vec<Op>> {
    let runs = |path: &str| {
        vec![
            write(path, 0, 4096),
            write(path, 8192, 4096),
            write(path, 24576, 8192),
            write(path, 49152, 12288),
        ]
    };
    let mut over_cap = runs("foo");
    over_cap.extend([
        Op::Create("new".into()),
        write("new", 0, 49152),
        write("new", 49152, 4096),
        write("A/bar", 100, 200),
    ]);
    let mut background = runs("foo");
    background.extend([Op::Writeback, write("foo", 70000, 100)]);
    vec![
        vec![write("foo", 16384, 5000)],
        vec![write("foo", 1000, 3000)],
        vec![Op::Create("new".into()), write("new", 0, 20000)],
        vec![write("A/C/baz", 0, 8192), write("foo", 40000, 100)],
        runs("foo"),
        over_cap,
        background,
        vec![write("foo", 16384, 8192), truncate("foo", 18000)],
        vec![write("foo", 16384, 5000), truncate("foo", 30000)],
        vec![truncate("foo", 5000), write("foo", 10000, 2000)],
        vec![
            write("foo", 16384, 5000),
            fallocate("foo", 12000, 8192, FallocateMode::PunchHole),
        ],
        vec![write("foo", 1000, 3000), write_direct("foo", 8192, 4096)],
        vec![write("foo", 16384, 5000), Op::SeekHole("foo".into())],
        // Overwrites in place: their checkpoints skip the flush before the commit record.
        vec![
            write("foo", 0, 4096),
            Op::Fsync("foo".into()),
            write("foo", 8192, 4096),
        ],
        vec![
            write_direct("foo", 4096, 4096),
            Op::Fsync("foo".into()),
            write_direct("foo", 0, 8192),
        ],
        vec![write("foo", 1000, 3000), write("A/bar", 6000, 4096)],
    ]
}

/// Sequences where the size of a cached write reaches the log before its data reaches the
/// device: another op logs the inode (with its size in memory) and another file's fsync
/// forces the log, or the inode is freed with its pages (their reservation given back).
fn write_behind_forced() -> Vec<Vec<Op>> {
    vec![
        vec![
            write("foo", 16384, 5000),
            setxattr("foo", "user.n", 40),
            write("A/bar", 0, 100),
            Op::Fsync("A/bar".into()),
        ],
        vec![
            write("foo", 16384, 5000),
            link("foo", "A/lnk"),
            Op::Fsync("A".into()),
        ],
        vec![
            write("foo", 16384, 5000),
            rename("foo", "A/foo2", RenameMode::Replace),
            Op::Fsync("A".into()),
        ],
        vec![
            Op::Create("new".into()),
            write("new", 0, 9000),
            link("new", "A/n2"),
            Op::Fdatasync("A/bar".into()),
        ],
        vec![
            write("foo", 16384, 5000),
            Op::Fsync("foo".into()),
            write("foo", 21384, 3000),
            setxattr("foo", "user.n", 40),
            Op::Fsync("A".into()),
        ],
        vec![
            Op::Create("new".into()),
            write("new", 0, 20000),
            Op::Unlink("new".into()),
            Op::Sync,
        ],
        vec![
            Op::Create("new".into()),
            write("new", 0, 8192),
            rename("new", "foo", RenameMode::Replace),
            Op::Fsync("".into()),
        ],
    ]
}

/// The write-behind workloads: each body of `write_behind_bodies` followed by nothing,
/// fsync, fdatasync and sync of the file it wrote last, then `write_behind_forced`.
pub fn write_behind() -> Vec<Workload> {
    let mut out = Vec::new();
    for body in write_behind_bodies() {
        let last = body
            .iter()
            .rev()
            .find(|step| matches!(step, Op::Write { .. }))
            .map_or("foo", Op::primary_path)
            .to_string();
        let ends = [
            None,
            Some(Op::Fsync(last.clone())),
            Some(Op::Fdatasync(last)),
            Some(Op::Sync),
        ];
        for end in ends {
            let mut ops = body.clone();
            ops.extend(end);
            out.push(workload(ops));
        }
    }
    out.extend(write_behind_forced().into_iter().map(workload));
    debug_assert!(
        out.iter()
            .all(|w| try_apply(&setup_model(), &w.ops).is_some())
    );
    out
}

/// The patterns of issue 34, nothing `fsync`ed but another file: new files written and
/// logged again by an attribute change; files replaced by a temporary renamed over them
/// (the editor's save) and by an exchange; a rewrite in place (`O_TRUNC`, write, close);
/// and the same changes left for the commit window. Each ends with another file's fsync,
/// nothing, a sync or a wait. The oracle checks each file is a prefix of a content it had,
/// and that a replaced file shows its old content or its new one, whole.
pub fn replace_patterns() -> Vec<Workload> {
    let replace = |target: &str, temporary: &str, len| {
        vec![
            Op::Create(temporary.into()),
            write(temporary, 0, len),
            rename(temporary, target, RenameMode::Replace),
        ]
    };
    let mut saved = replace("foo", "foo.tmp", 9000);
    saved.extend(replace("A/bar", "A/bar.tmp", 100));
    let mut new_files = Vec::new();
    for name in ["n1", "A/n2", "B/n3"] {
        new_files.extend([
            Op::Create(name.into()),
            write(name, 0, 20),
            setxattr(name, "user.t", 8),
        ]);
    }
    let exchanged = vec![
        Op::Create("swap".into()),
        write("swap", 0, 5000),
        rename("swap", "foo", RenameMode::Exchange),
    ];
    let rewritten = vec![rewrite("foo", 7000), write("A/bar", 6000, 3000)];
    let bodies = [saved, new_files, exchanged, rewritten];
    let ends = [
        Some(Op::Fsync("E".into())),
        None,
        Some(Op::Sync),
        Some(Op::Wait),
    ];
    let mut out = Vec::new();
    for body in bodies {
        for end in &ends {
            let mut ops = body.clone();
            if matches!(end, Some(Op::Fsync(_))) {
                // Another program's file, fsynced: the log is forced with everything.
                ops.extend([Op::Create("E/other".into()), write("E/other", 0, 10)]);
                ops.push(Op::Fsync("E/other".into()));
            } else {
                ops.extend(end.clone());
            }
            out.push(workload(ops));
        }
    }
    debug_assert!(
        out.iter()
            .all(|w| try_apply(&setup_model(), &w.ops).is_some())
    );
    out
}

/// The bodies of the reflink workloads (`copy_file_range` sharing "foo"'s blocks): a
/// clone into a new file, then each way of changing either side (overwrite aligned and
/// not, of the copy and of the original; unlink either; truncate down and up, punch and
/// zero range on the copy; a clone of the clone; the copy unlinked and the original then
/// overwritten, whose blocks must still be copied until the unlink is durable), a clone
/// into an existing file that grows it (head and tail not aligned), a clone within one
/// file, and a copy whose offsets differ within a block (a plain copy).
fn reflink_bodies() -> Vec<Vec<Op>> {
    let cloned = || vec![Op::Create("copy".into()), clone("foo", 0, "copy", 0, 16384)];
    let then = |more: Vec<Op>| {
        let mut ops = cloned();
        ops.extend(more);
        ops
    };
    vec![
        cloned(),
        then(vec![write("copy", 4096, 4096)]),
        then(vec![write("copy", 1000, 300)]),
        then(vec![write("foo", 0, 8192)]),
        then(vec![Op::Unlink("foo".into())]),
        then(vec![Op::Unlink("copy".into())]),
        then(vec![Op::Unlink("copy".into()), write("foo", 4096, 4096)]),
        then(vec![write("foo", 0, 4096), Op::Unlink("foo".into())]),
        then(vec![truncate("copy", 5000), truncate("copy", 12000)]),
        then(vec![fallocate(
            "copy",
            1000,
            5000,
            FallocateMode::PunchHole,
        )]),
        then(vec![fallocate(
            "copy",
            3000,
            6000,
            FallocateMode::ZeroRange { keep_size: true },
        )]),
        then(vec![
            clone("copy", 0, "A/C/baz", 0, 16384),
            write("copy", 0, 100),
        ]),
        then(vec![Op::Fsync("copy".into()), write("foo", 0, 16384)]),
        // Shifts move file offsets only: the shared blocks go with them.
        then(vec![
            fallocate("copy", 4096, 4096, FallocateMode::CollapseRange),
            write("copy", 4096, 4096),
        ]),
        then(vec![fallocate(
            "foo",
            4096,
            8192,
            FallocateMode::InsertRange,
        )]),
        vec![clone("foo", 1000, "A/bar", 1000, 12000)],
        vec![clone("foo", 4096, "foo", 20480, 8192)],
        vec![clone("foo", 100, "A/C/baz", 0, 9000)],
        vec![
            write("foo", 0, 4096),
            Op::Create("copy".into()),
            clone("foo", 0, "copy", 0, 16384),
        ],
    ]
}

/// The reflink workloads: each body of `reflink_bodies` followed by nothing, fsync,
/// fdatasync and sync of the file it changed last.
pub fn reflink() -> Vec<Workload> {
    let mut out = Vec::new();
    for body in reflink_bodies() {
        let last = body
            .iter()
            .rev()
            .find(|step| !matches!(step, Op::Unlink(_) | Op::Fsync(_)))
            .map_or("foo", Op::primary_path)
            .to_string();
        let ends = [
            None,
            Some(Op::Fsync(last.clone())),
            Some(Op::Fdatasync(last)),
            Some(Op::Sync),
        ];
        for end in ends {
            let mut ops = body.clone();
            ops.extend(end);
            if try_apply(&setup_model(), &ops).is_some() {
                out.push(workload(ops));
            }
        }
    }
    out
}

/// A small deterministic generator (splitmix64) for random workloads.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}

const RANDOM_DIRS: [&str; 4] = ["", "A", "B", "A/C"];
const RANDOM_NAMES: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];
const RANDOM_XATTRS: [&str; 3] = ["user.x0", "user.x1", "user.x2"];
const RENAME_MODES: [RenameMode; 3] = [
    RenameMode::Replace,
    RenameMode::NoReplace,
    RenameMode::Exchange,
];
const FALLOCATE_MODES: [FallocateMode; 5] = [
    FallocateMode::Allocate { keep_size: false },
    FallocateMode::Allocate { keep_size: true },
    FallocateMode::PunchHole,
    FallocateMode::ZeroRange { keep_size: false },
    FallocateMode::ZeroRange { keep_size: true },
];

fn pick<T: Copy>(rng: &mut Rng, from: &[T]) -> T {
    from[rng.below(from.len() as u64) as usize]
}

fn random_path(rng: &mut Rng, model: &Model) -> String {
    let mut dirs: Vec<String> = RANDOM_DIRS.iter().map(|d| d.to_string()).collect();
    dirs.extend(model.names.keys().filter(|p| model.is_dir(p)).cloned());
    let dir = dirs[rng.below(dirs.len() as u64) as usize].clone();
    join(
        &dir,
        RANDOM_NAMES[rng.below(RANDOM_NAMES.len() as u64) as usize],
    )
}

fn existing_path(rng: &mut Rng, model: &Model) -> String {
    let names: Vec<&String> = model.names.keys().collect();
    names
        .get(rng.below(names.len() as u64) as usize)
        .map_or_else(String::new, |path| (*path).clone())
}

/// One random op (possibly invalid on `model`; the caller retries).
fn random_op(rng: &mut Rng, model: &Model) -> Op {
    let size = |rng: &mut Rng| rng.below(48 * 1024);
    match rng.below(19) {
        0 | 1 => Op::Create(random_path(rng, model)),
        2 => Op::Mkdir(random_path(rng, model)),
        3..=5 => {
            let path = existing_path(rng, model);
            write(&path, size(rng), 1 + rng.below(12 * 1024))
        }
        6 => truncate(&existing_path(rng, model), size(rng)),
        7 => link(&existing_path(rng, model), &random_path(rng, model)),
        8 => Op::Unlink(existing_path(rng, model)),
        9 => Op::Rmdir(existing_path(rng, model)),
        10 => Op::Symlink {
            path: random_path(rng, model),
            target: format!("t{}", rng.below(1000)).into_bytes(),
        },
        11 => Op::Fsync(existing_path(rng, model)),
        12 => Op::Fdatasync(existing_path(rng, model)),
        13 => {
            let from = existing_path(rng, model);
            let to = if rng.below(2) == 0 {
                random_path(rng, model)
            } else {
                existing_path(rng, model)
            };
            rename(&from, &to, pick(rng, &RENAME_MODES))
        }
        14 => {
            let len = [8, 200, 3000][rng.below(3) as usize];
            setxattr(&existing_path(rng, model), pick(rng, &RANDOM_XATTRS), len)
        }
        15 => Op::RemoveXattr {
            path: existing_path(rng, model),
            name: pick(rng, &RANDOM_XATTRS).into(),
        },
        16 => {
            let path = existing_path(rng, model);
            fallocate(
                &path,
                size(rng),
                1 + size(rng) / 2,
                pick(rng, &FALLOCATE_MODES),
            )
        }
        _ => Op::Sync,
    }
}

/// A random workload of `len` valid ops drawn from `seed`.
pub fn random(seed: u64, len: usize) -> Workload {
    let mut built = random_from(seed, len, random_op);
    built.name = format!("random seed {seed} len {len}");
    built
}

/// One random op for a write-behind run: a third of the time a large write (several
/// blocks, often past the end), an `O_DIRECT` write, a background writeback pass, a
/// rewrite in place, the commit window passing, a rename over an existing name or a seek;
/// otherwise one of `random_op`'s.
fn random_write_behind_op(rng: &mut Rng, model: &Model) -> Op {
    if rng.below(3) != 0 {
        return random_op(rng, model);
    }
    let path = existing_path(rng, model);
    match rng.below(9) {
        0..=2 => write(&path, rng.below(96 * 1024), 1 + rng.below(40 * 1024)),
        3 => write_direct(&path, rng.below(48 * 1024), 1 + rng.below(12 * 1024)),
        4 => Op::Writeback,
        5 => rewrite(&path, rng.below(20 * 1024)),
        6 => Op::Wait,
        7 => rename(&existing_path(rng, model), &path, RenameMode::Replace),
        _ => Op::SeekHole(path),
    }
}

/// A random workload of `len` valid ops drawn from `seed`, for a write-behind run (more
/// and larger writes, and the ops that write cached pages back).
pub fn random_write_behind(seed: u64, len: usize) -> Workload {
    let mut built = random_from(seed, len, random_write_behind_op);
    built.name = format!("random write-behind seed {seed} len {len}");
    built
}

/// One random op for a reflink run: a third of the time a `copy_file_range` between two
/// existing names (offsets at the same place in a block three times in four, so blocks are
/// shared), otherwise one of `random_op`'s.
fn random_reflink_op(rng: &mut Rng, model: &Model) -> Op {
    if rng.below(3) != 0 {
        return random_op(rng, model);
    }
    let (from, to) = (existing_path(rng, model), existing_path(rng, model));
    let from_offset = rng.below(32 * 1024);
    let to_offset = match rng.below(4) {
        0 => rng.below(48 * 1024),
        _ => rng.below(12) * 4096 + from_offset % 4096,
    };
    clone(&from, from_offset, &to, to_offset, 1 + rng.below(40 * 1024))
}

/// A random workload of `len` valid ops drawn from `seed`, a third of them clones.
pub fn random_reflink(seed: u64, len: usize) -> Workload {
    let mut built = random_from(seed, len, random_reflink_op);
    built.name = format!("random reflink seed {seed} len {len}");
    built
}

fn random_from(seed: u64, len: usize, draw: fn(&mut Rng, &Model) -> Op) -> Workload {
    let mut rng = Rng(seed);
    let mut model = setup_model();
    let mut ops = Vec::with_capacity(len);
    while ops.len() < len {
        let next = draw(&mut rng, &model);
        if op::valid(&model, &next) {
            op::apply(&mut model, &next, Some(ops.len()), 0);
            ops.push(next);
        }
    }
    workload(ops)
}
