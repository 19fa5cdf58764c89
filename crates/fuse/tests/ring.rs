//! The io_uring transport (`-o uring`) beyond what the whole suite checks when it runs on
//! the ring (`CAIRN_TEST_TRANSPORT=uring`): the fallback to `/dev/fuse`, said once, where
//! the kernel does not offer the ring; and requests interrupted or aborted on the ring
//! (unmount with requests in flight, a forced abort, clients killed mid-request) leaving
//! nothing hanging and the filesystem consistent. Skipped, saying so, on kernels without
//! FUSE over io_uring.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Scratch, fsck, is_mounted, wait_exit};

/// How long a client or the daemon may take to end after its mount went away.
const END_WAIT: Duration = Duration::from_secs(30);

fn skip() -> bool {
    match common::ring_unavailable() {
        Some(reason) => {
            eprintln!("skipped: {reason}");
            true
        }
        None => false,
    }
}

/// Mounts `image` on the ring (the module parameter on for the handshake).
fn mount_ring(image: &Path, mnt: &Path, options: &str) -> Mount {
    let options = match options.is_empty() {
        true => "uring".to_string(),
        false => format!("uring,{options}"),
    };
    let output = common::with_ring_parameter("Y", || {
        Command::new(common::cairn_bin())
            .args(["-o", &options])
            .arg(image)
            .arg(mnt)
            .output()
            .unwrap()
    });
    assert!(output.status.success(), "{}", common::output_text(&output));
    let mount = Mount::adopt_any_transport(image, mnt);
    assert_eq!(common::served_transport(mnt), "io_uring");
    mount
}

/// Shell clients that keep the mount busy: each writes, fsyncs, creates and removes
/// files and lists its directory in a loop until the mount fails it or `seconds` pass.
fn start_clients(mnt: &Path, count: usize, seconds: u32) -> Vec<Child> {
    (0..count)
        .map(|client| {
            let dir = mnt.join(format!("client{client}"));
            let script = format!(
                "mkdir -p '{d}' && cd '{d}' || exit 0\n\
                 end=$(( $(date +%s) + {seconds} ))\n\
                 i=0\n\
                 while [ $(date +%s) -lt $end ]; do\n\
                   i=$((i+1))\n\
                   dd if=/dev/zero of=f$((i % 8)) bs=64k count=4 conv=fsync 2>/dev/null \
                      || exit 0\n\
                   : > e$i && rm -f e$((i-1)) || exit 0\n\
                   ls -l > /dev/null || exit 0\n\
                 done",
                d = dir.display()
            );
            Command::new("sh")
                .args(["-c", &script])
                .process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Waits for every client to end; fails naming those still running after `END_WAIT`.
fn wait_clients(clients: &mut [Child]) {
    let start = Instant::now();
    for client in clients.iter_mut() {
        while client.try_wait().unwrap().is_none() {
            if start.elapsed() > END_WAIT {
                let _ = client.kill();
                panic!(
                    "client {} still running: it hangs on the mount",
                    client.id()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Requests served over the ring so far, from `cairn stats`.
fn ring_requests(mnt: &Path) -> u64 {
    let output = common::run(
        common::cairn_bin().to_str().unwrap(),
        &["stats", mnt.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("requests_by_queue: "))
        .unwrap_or_else(|| panic!("no ring counters in {text}"));
    line.split_whitespace()
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

// With the module parameter off, -o uring mounts on /dev/fuse, says why once in the log
// and in `cairn stats`, and works; with it on, requests go over the ring.
#[test]
fn falls_back_where_the_kernel_does_not_offer_the_ring() {
    if skip() {
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mnt = scratch.mountpoint();
    let log = scratch.dir.path().join("daemon.log");
    let options = format!("uring,logfile={}", log.display());
    let output = common::with_ring_parameter("N", || {
        Command::new(common::cairn_bin())
            .args(["-o", &options])
            .arg(&image)
            .arg(&mnt)
            .output()
            .unwrap()
    });
    assert!(output.status.success(), "{}", common::output_text(&output));
    let mount = Mount::adopt_any_transport(&image, &mnt);
    assert_eq!(common::served_transport(&mnt), "/dev/fuse");
    std::fs::write(mount.path("a"), b"on /dev/fuse").unwrap();
    assert_eq!(std::fs::read(mount.path("a")).unwrap(), b"on /dev/fuse");
    let stats = common::sh(&format!(
        "{} stats '{}'",
        common::cairn_bin().display(),
        mnt.display()
    ));
    assert!(
        stats.contains("uring_fallback: the kernel's fuse.enable_uring is off"),
        "{stats}"
    );
    mount.unmount();
    let text = std::fs::read_to_string(&log).unwrap();
    let said = text
        .lines()
        .filter(|l| l.contains("serving through /dev/fuse"))
        .count();
    assert_eq!(said, 1, "the fallback is logged once:\n{text}");

    let mount = mount_ring(&image, &mnt, "");
    let before = ring_requests(&mnt);
    common::sh(&format!(
        "cd '{}' && cat a && mkdir d && touch d/x && ls -l d",
        mnt.display()
    ));
    assert!(
        ring_requests(&mnt) >= before + 4,
        "requests did not go over the ring"
    );
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// A forced abort (umount -f) while clients keep requests in flight on the ring: every
// client and the daemon end, nothing stays mounted, and the image recovers to a clean
// filesystem on the next mount.
#[test]
fn abort_with_requests_in_flight() {
    if skip() {
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = mount_ring(&image, &mnt, "noblkdev");
    let mut clients = start_clients(&mnt, 4, 60);
    std::thread::sleep(Duration::from_millis(800));
    assert!(ring_requests(&mnt) > 0);
    let mnt_arg = mnt.to_str().unwrap();
    let _ = common::run("umount", &["-f", mnt_arg]);
    wait_clients(&mut clients);
    if is_mounted(&mnt) {
        let _ = common::run("umount", &["-l", mnt_arg]);
    }
    assert!(!is_mounted(&mnt));
    assert!(
        wait_exit(mount.pid, END_WAIT),
        "the daemon hangs after the abort"
    );
    std::mem::forget(mount);
    let mount = mount_ring(&image, &mnt, "");
    common::sh(&format!("ls -lR '{}' > /dev/null", mnt.display()));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// Unmounting (lazily: the mount is busy) while clients have requests in flight: the
// clients finish their work, the daemon then ends, and the filesystem is clean.
#[test]
fn lazy_unmount_with_requests_in_flight() {
    if skip() {
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = mount_ring(&image, &mnt, "");
    let mut clients = start_clients(&mnt, 4, 3);
    std::thread::sleep(Duration::from_millis(800));
    let output = common::run("umount", &["-l", mnt.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    wait_clients(&mut clients);
    assert!(
        wait_exit(mount.pid, END_WAIT),
        "the daemon hangs after a lazy unmount"
    );
    std::mem::forget(mount);
    assert_eq!(fsck(&image), 0);
}

// Clients killed (SIGKILL) in the middle of their requests, again and again: the mount
// keeps serving the others, unmounts cleanly, and fsck finds nothing wrong.
#[test]
fn clients_killed_mid_request() {
    if skip() {
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = mount_ring(&image, &mnt, "uring_queue_depth=2");
    let mut survivors = start_clients(&mnt, 2, 4);
    for _ in 0..6 {
        let mut victims = start_clients(&mnt, 3, 60);
        std::thread::sleep(Duration::from_millis(300));
        for victim in &victims {
            // Each client is a process group of its own: the shell and its dd.
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-(victim.id() as i32), libc::SIGKILL) };
        }
        wait_clients(&mut victims);
    }
    wait_clients(&mut survivors);
    common::sh(&format!(
        "cd '{}' && echo still > alive && cat alive",
        mnt.display()
    ));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// -o uring=auto mounts on the ring where the kernel offers it, silently on /dev/fuse where
// it does not; by default, and with -o nouring, a mount stays on /dev/fuse either way.
#[test]
fn uring_auto_follows_the_kernel() {
    if skip() {
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.format("64M");
    let mnt = scratch.mountpoint();
    for (parameter, options, want) in [
        ("Y", "uring=auto", "io_uring"),
        ("N", "uring=auto", "/dev/fuse"),
        ("Y", "", "/dev/fuse"),
        ("Y", "nouring", "/dev/fuse"),
    ] {
        let log = scratch
            .dir
            .path()
            .join(format!("daemon-{parameter}-{options}.log"));
        let mut args = vec![format!("logfile={}", log.display())];
        if !options.is_empty() {
            args.push(options.to_string());
        }
        let output = common::with_ring_parameter(parameter, || {
            Command::new(common::cairn_bin())
                .args(["-o", &args.join(",")])
                .arg(&image)
                .arg(&mnt)
                .output()
                .unwrap()
        });
        assert!(output.status.success(), "{}", common::output_text(&output));
        let mount = Mount::adopt_any_transport(&image, &mnt);
        let served = common::served_transport(&mnt);
        assert_eq!(served, want, "enable_uring={parameter}, -o {options}");
        mount.unmount();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains("WARN"),
            "a mount without -o uring warns:\n{text}"
        );
    }
    assert_eq!(fsck(&image), 0);
}
