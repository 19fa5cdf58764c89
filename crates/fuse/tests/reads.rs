#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Reads through the real mount, as users make them: a file read with `O_DIRECT` in 1 MiB,
//! 64 KiB and 4 KiB requests from start to end (the daemon reads ahead), by 16 threads at
//! random at once (reads handed to the device's completion thread), by a sequential reader
//! while another descriptor overwrites blocks a little ahead of it (the read-ahead must not
//! return the old bytes), and buffered after a remount. Every block must hold what was
//! last written to it; `cairn stats` must show read-ahead hits and reads handed over, so
//! the test covers the paths it means to. Also with `read_buffers=0`, where every read is
//! synchronous.

mod common;

use common::{Mount, Scratch, fsck, python};

/// Each 4 KiB block holds (block index, generation) repeated; the reader checks every block
/// it gets against the generation last written there.
const READERS: &str = r#"
import concurrent.futures, mmap, os, random, struct, sys
path, size = sys.argv[1], int(sys.argv[2])
BS = 4096
def block(index, generation=0):
    return struct.pack("<QQ", index, generation) * (BS // 16)
generations = {}
def check(buf, offset, count):
    if count <= 0 or count % BS or offset % BS:
        sys.exit("read of %d bytes at %d" % (count, offset))
    for k in range(count // BS):
        index = offset // BS + k
        generation = generations.get(index, 0)
        if buf[k * BS:(k + 1) * BS] != block(index, generation):
            got = struct.unpack("<QQ", buf[k * BS:k * BS + 16])
            sys.exit("block %d holds %s, want generation %d" % (index, got, generation))
with open(path, "wb") as out:
    for index in range(size // BS):
        out.write(block(index))
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
for request in (1 << 20, 64 << 10, BS):
    buf, offset = mmap.mmap(-1, request), 0
    while offset < size:
        count = os.preadv(fd, [buf], offset)
        check(buf, offset, count)
        offset += count
def random_reads(seed):
    rng, buf = random.Random(seed), mmap.mmap(-1, 4 * BS)
    for _ in range(300):
        offset = rng.randrange(size // BS - 4) * BS
        check(buf, offset, os.preadv(fd, [buf], offset))
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    list(pool.map(random_reads, range(16)))
writer = os.open(path, os.O_WRONLY | os.O_DIRECT)
buf, page, offset = mmap.mmap(-1, 1 << 20), mmap.mmap(-1, BS), 0
while offset < size:
    ahead = offset + (2 << 20) + BS
    if ahead + BS <= size:
        index = ahead // BS
        generations[index] = generations.get(index, 0) + 1
        page[:] = block(index, generations[index])
        os.pwrite(writer, page, ahead)
    count = os.preadv(fd, [buf], offset)
    check(buf, offset, count)
    offset += count
with open(sys.argv[3], "w") as out:
    out.write(repr(generations))
"#;

/// Reads the file buffered (page cache, after a remount) and checks every block.
const BUFFERED: &str = r#"
import struct, sys
path, size, generations = sys.argv[1], int(sys.argv[2]), eval(open(sys.argv[3]).read())
BS = 4096
with open(path, "rb") as f:
    data = f.read()
if len(data) != size:
    sys.exit("read %d bytes of %d" % (len(data), size))
for index in range(size // BS):
    want = struct.pack("<QQ", index, generations.get(index, 0)) * (BS // 16)
    if data[index * BS:(index + 1) * BS] != want:
        sys.exit("block %d differs" % index)
"#;

fn stat_value(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{name}: ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn read_everything(options: &str) -> String {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), options);
    let file = mount.path("f");
    let generations = scratch.dir.path().join("generations");
    let size = (24u64 << 20).to_string();
    let args = [file.to_str().unwrap(), &size, generations.to_str().unwrap()];
    let output = common::run(python(), &[&["-c", READERS][..], &args].concat());
    assert!(output.status.success(), "{}", common::output_text(&output));
    let stats = common::run(
        common::cairn_bin().to_str().unwrap(),
        &["stats", mount.mountpoint.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&stats.stdout).into_owned();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &scratch.mountpoint(), options);
    let output = common::run(python(), &[&["-c", BUFFERED][..], &args].concat());
    assert!(output.status.success(), "{}", common::output_text(&output));
    mount.unmount();
    text
}

// The default mount: read-ahead serves the sequential readers and reads are handed over,
// and every block read holds its last write.
#[test]
fn reads_return_the_last_written_bytes() {
    let stats = read_everything("");
    assert!(stat_value(&stats, "read_ahead_hits") > 100, "{stats}");
    assert!(stat_value(&stats, "async_reads") > 0, "{stats}");
    assert!(
        stat_value(&stats, "buffer_bytes") <= stat_value(&stats, "buffer_cap_bytes"),
        "{stats}"
    );
}

// Without read buffers every read is served on its worker thread, and the bytes are the
// same.
#[test]
fn reads_without_read_buffers_are_synchronous() {
    let stats = read_everything("read_buffers=0");
    assert_eq!(stat_value(&stats, "async_reads"), 0, "{stats}");
    assert_eq!(stat_value(&stats, "read_ahead_chunks"), 0, "{stats}");
}
