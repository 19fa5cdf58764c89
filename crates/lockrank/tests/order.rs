#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! The order check: each documented rule passes when kept and panics, naming both sites,
//! when broken (debug builds; the test profile has debug assertions).

use std::panic::{AssertUnwindSafe, catch_unwind};

use cairn_lockrank::{Mutex, Order, Rank, RwLock, check_may_wait, held_locks};

fn panics(f: impl FnOnce()) -> String {
    let result = catch_unwind(AssertUnwindSafe(f));
    let payload = result.expect_err("the order check should have panicked");
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn ascending_ranks_pass_and_everything_is_forgotten_on_unlock() {
    let rename = Mutex::new(Rank::Rename, ());
    let io = RwLock::new(Rank::InodeIo, ());
    let inode = Mutex::new(Rank::Inode, 0u32);
    let agi = Mutex::new(Rank::AgHeader, ());
    {
        let _rename = rename.lock();
        let _io = io.write();
        let mut data = inode.lock();
        *data += 1;
        let _agi = agi.lock_with(0, Order::Ranked);
        assert_eq!(held_locks().len(), 4);
    }
    assert!(held_locks().is_empty());
}

#[test]
fn a_lower_rank_after_a_higher_one_panics_with_both_sites() {
    let inode = Mutex::new(Rank::Inode, ());
    let buffer = Mutex::new(Rank::Buffer, ());
    let message = panics(|| {
        let _buffer = buffer.lock();
        let _inode = inode.lock();
    });
    assert!(message.contains("taking Inode"), "{message}");
    assert!(message.contains("Buffer"), "{message}");
    assert!(message.contains("order.rs"), "{message}");
    assert!(held_locks().is_empty(), "unwinding forgets what was held");
}

#[test]
fn ag_headers_ascend() {
    let headers: Vec<_> = (0..4).map(|_| Mutex::new(Rank::AgHeader, ())).collect();
    {
        // AGI 0, AGF 0, AGF 1: keys 0, 1, 3.
        let _a = headers[0].lock_with(0, Order::Ranked);
        let _b = headers[1].lock_with(1, Order::Ranked);
        let _c = headers[3].lock_with(3, Order::Ranked);
    }
    let message = panics(|| {
        let _agf = headers[1].lock_with(1, Order::Ranked);
        let _agi = headers[0].lock_with(0, Order::Ranked);
    });
    assert!(message.contains("key not below"), "{message}");
}

#[test]
fn a_buffer_does_not_order_the_ag_headers() {
    let buffer = Mutex::new(Rank::Buffer, ());
    let agf = Mutex::new(Rank::AgHeader, ());
    let state = Mutex::new(Rank::AllocAg, ());
    let other = Mutex::new(Rank::Buffer, ());
    let _buffer = buffer.lock();
    let _agf = agf.lock_with(1, Order::Ranked);
    let _state = state.lock();
    let _other = other.lock();
}

#[test]
fn a_second_inode_lock_needs_a_declared_rule() {
    let parent = Mutex::new(Rank::DirInode, ());
    let child = Mutex::new(Rank::Inode, ());
    let other = Mutex::new(Rank::Inode, ());
    {
        let _parent = parent.lock();
        let _child = child.lock();
        let _other = other.lock_nested("test: by inode number");
    }
    let message = panics(|| {
        let _child = child.lock();
        let _other = other.lock();
    });
    assert!(message.contains("no rule was declared"), "{message}");
    let message = panics(|| {
        let _child = child.lock();
        let _parent = parent.lock();
    });
    assert!(message.contains("taking DirInode"), "{message}");
}

#[test]
fn single_ranks_do_not_nest() {
    let first = Mutex::new(Rank::JournalCil, ());
    let second = Mutex::new(Rank::JournalCil, ());
    let message = panics(|| {
        let _first = first.lock();
        let _second = second.lock();
    });
    assert!(message.contains("one at a time"), "{message}");
}

#[test]
fn try_lock_is_not_checked_but_recorded() {
    let buffer = Mutex::new(Rank::Buffer, ());
    let inode = Mutex::new(Rank::Inode, ());
    let _buffer = buffer.lock();
    let _inode = inode.try_lock().expect("free");
    assert_eq!(held_locks().len(), 2);
    let journal = Mutex::new(Rank::JournalCil, ());
    let _journal = journal.lock();
    let another = Mutex::new(Rank::Inode, ());
    drop(_journal);
    let message = panics(|| {
        let _another = another.lock();
    });
    assert!(message.contains("taking Inode"), "{message}");
}

#[test]
fn waiting_for_log_space_with_a_buffer_held_panics() {
    let inode = Mutex::new(Rank::Inode, ());
    let buffer = Mutex::new(Rank::Buffer, ());
    {
        let _inode = inode.lock();
        check_may_wait(Rank::LogSpace);
    }
    let message = panics(|| {
        let _buffer = buffer.lock();
        check_may_wait(Rank::LogSpace);
    });
    assert!(message.contains("taking LogSpace"), "{message}");
}

#[test]
fn locks_are_per_thread() {
    let buffer = std::sync::Arc::new(Mutex::new(Rank::Buffer, ()));
    let _held = Mutex::new(Rank::Buffer, ());
    let guard = _held.lock();
    let inode = std::sync::Arc::new(Mutex::new(Rank::Inode, ()));
    let thread = std::thread::spawn(move || {
        // Another thread's buffer says nothing about this one.
        let _inode = inode.lock();
        let _buffer = buffer.lock();
    });
    thread.join().expect("no violation on the other thread");
    drop(guard);
}
