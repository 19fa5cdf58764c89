//! Loom models of the cache's lock-free protocol (`state.rs`, the lookaside sweep, the
//! statistics stripes). Each drives the crate's own functions on loom's atomics: loom runs
//! the closure once for every interleaving of the threads and every value the memory model
//! lets each load return, exhaustively (each model finishes in well under a second).
//!
//! What each model leaves to itself: the locks and queues around the atomics (a loom `Mutex`
//! for the LRU queue or the buffer lock, a loom `RwLock` for the index) and the few lines
//! of glue that route a verdict (`BufferCache::reclaim` pushes a `Rotate` back, `release`
//! pushes a claimed buffer). `docs/testing.md` says what each model caught when the protocol
//! was weakened on purpose.

use std::collections::VecDeque;
use std::sync::Arc;

use cairn_format::FsBlock;
use loom::sync::atomic::{AtomicBool as LoomFlag, AtomicU64 as LoomWord};
use loom::sync::{Mutex, RwLock};
use loom::thread;

use crate::buffer::BufKey;
use crate::lookaside::{AgTable, Fill, Occupant};
use crate::state::{
    DEAD, DIRTY, Generation, HOLD_ONE, ON_LRU, PIN_ONE, StateWord, Verdict, WriteCheck, holds,
};
use crate::stats::{Stats, add_to, claim_first, give_back};

/// A buffer reduced to what the protocol reads: its key and its state word, on loom's atomic.
#[derive(Debug)]
struct ModelBuffer {
    key: BufKey,
    state: StateWord<LoomWord>,
}

impl ModelBuffer {
    fn new(block: u64, state: u64) -> Arc<Self> {
        Arc::new(Self {
            key: BufKey::new(FsBlock(block), 1),
            state: StateWord::with_state(state),
        })
    }
}

impl Occupant for ModelBuffer {
    type Word = LoomWord;

    fn key(&self) -> BufKey {
        self.key
    }

    fn state(&self) -> &StateWord<LoomWord> {
        &self.state
    }
}

type Lru = Arc<Mutex<VecDeque<Arc<ModelBuffer>>>>;

/// Runs `model` under loom for every execution and checks it had more than one to explore
/// (a model whose threads cannot interleave would check nothing), and prints the count.
fn explore(model: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let executions = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&executions);
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        model();
    });
    let executions = executions.load(Ordering::Relaxed);
    assert!(executions > 1, "the model had nothing to interleave");
    eprintln!("{executions} executions");
}

/// `BufferCache::release`: drops a hold and pushes the buffer if the release claimed it.
fn release(buffer: &Arc<ModelBuffer>, lru: &Lru) {
    if buffer.state.release() {
        lru.lock().unwrap().push_back(Arc::clone(buffer));
    }
}

/// `BufferCache::reclaim` for one buffer: pop, judge (no reuse count left, so no second
/// chance; `try_free` is the exchange to `DEAD`), and a `Rotate` goes back on the queue.
fn reclaim_one(lru: &Lru) -> Option<Verdict> {
    let buffer = lru.lock().unwrap().pop_front()?;
    let verdict = buffer.state.judge(|| false, || buffer.state.try_kill());
    if verdict == Verdict::Rotate {
        lru.lock().unwrap().push_back(buffer);
    }
    Some(verdict)
}

// Model 1, a lookup's hold against reclaim's kill: a hold that found the buffer live never
// sees it dead while held (only reclaim kills here), reclaim kills only an unheld buffer,
// and no hold is lost or invented.
#[test]
fn hold_against_reclaim() {
    explore(|| {
        // Unheld, clean, queued, reuse count spent: reclaim will try to free it.
        let buffer = ModelBuffer::new(7, ON_LRU);
        let lru: Lru = Arc::new(Mutex::new(VecDeque::from([Arc::clone(&buffer)])));
        let reader = {
            let (buffer, lru) = (Arc::clone(&buffer), Arc::clone(&lru));
            thread::spawn(move || {
                let live = buffer.state.hold_live();
                if live {
                    assert_eq!(buffer.state.load() & DEAD, 0, "killed while held");
                }
                release(&buffer, &lru);
                live
            })
        };
        let verdict = reclaim_one(&lru);
        let reader_held = reader.join().unwrap();
        let state = buffer.state.load();
        assert_eq!(holds(state), 0, "hold count {state:#x}");
        let killed = verdict == Some(Verdict::Freed);
        assert_eq!(
            killed,
            state & DEAD != 0,
            "verdict {verdict:?}, state {state:#x}"
        );
        if !killed {
            assert!(reader_held, "the reader was refused a buffer nobody killed");
        }
    });
}

// Model 2, the last release against reclaim's LRU judgement: a holder's release and a
// lookup's hold and release race reclaim popping the buffer; an unheld live buffer ends on
// the queue exactly once (never lost, never queued twice), a freed one not at all.
#[test]
fn last_release_against_lru_judgement() {
    explore(|| {
        // Held by a user, queued by an earlier release.
        let buffer = ModelBuffer::new(7, HOLD_ONE | ON_LRU);
        let lru: Lru = Arc::new(Mutex::new(VecDeque::from([Arc::clone(&buffer)])));
        let holder = {
            let (buffer, lru) = (Arc::clone(&buffer), Arc::clone(&lru));
            thread::spawn(move || release(&buffer, &lru))
        };
        let lookup = {
            let (buffer, lru) = (Arc::clone(&buffer), Arc::clone(&lru));
            thread::spawn(move || {
                buffer.state.hold_live();
                release(&buffer, &lru);
            })
        };
        reclaim_one(&lru);
        holder.join().unwrap();
        lookup.join().unwrap();
        let state = buffer.state.load();
        let queued = lru.lock().unwrap().len();
        assert_eq!(holds(state), 0, "hold count {state:#x}");
        if state & DEAD != 0 {
            assert_eq!(queued, 0, "a freed buffer is still queued");
        } else {
            assert_eq!(queued, 1, "live unheld buffer queued {queued} times");
            assert_ne!(state & ON_LRU, 0, "queued without ON_LRU");
        }
    });
}

/// How a buffer leaves: reclaim kills it (then it is removed and the generation bumped, as
/// `remove_locked`), or it is marked stale (as `invalidate`).
#[derive(Debug, Clone, Copy)]
enum Death {
    Reclaimed,
    Invalidated,
}

/// The index of one AG in model 3: the buffers by block, behind its lock.
type ModelIndex = Arc<RwLock<Vec<Arc<ModelBuffer>>>>;

/// Kills or invalidates `buffer` under the index's write lock and bumps the generation.
fn die(
    buffer: &Arc<ModelBuffer>,
    index: &ModelIndex,
    generation: &Generation<LoomWord>,
    death: Death,
) {
    match death {
        Death::Reclaimed => {
            let killed = buffer.state.judge(
                || false,
                || {
                    let mut index = index.write().unwrap();
                    if !buffer.state.try_kill() {
                        return false;
                    }
                    buffer.state.set_flags(DEAD);
                    index.retain(|b| !Arc::ptr_eq(b, buffer));
                    generation.bump();
                    true
                },
            );
            assert_eq!(killed, Verdict::Freed, "nothing holds it");
        }
        Death::Invalidated => {
            let _index = index.write().unwrap();
            buffer.state.mark_stale();
            generation.bump();
        }
    }
}

// Model 3, the generation protocol: one thread's slot names a buffer that another thread
// kills (or marks stale) and then bumps the AG's generation; the first thread looks up
// another buffer of the AG (sweep, then slot or index, through `AgTable`'s own code). Once
// its table is swept at the bumped generation, it holds no dead or stale buffer.
#[test]
fn sweep_after_generation_bump() {
    for death in [Death::Reclaimed, Death::Invalidated] {
        explore(move || {
            let generation = Arc::new(Generation::<LoomWord>::new());
            let doomed = ModelBuffer::new(0, 0);
            let other = ModelBuffer::new(1, 0);
            let index: ModelIndex =
                Arc::new(RwLock::new(vec![Arc::clone(&doomed), Arc::clone(&other)]));
            let killer = {
                let (doomed, index, generation) = (
                    Arc::clone(&doomed),
                    Arc::clone(&index),
                    Arc::clone(&generation),
                );
                thread::spawn(move || die(&doomed, &index, &generation, death))
            };
            let stats = Stats::new();
            let mut table = AgTable::<ModelBuffer>::new(0);
            // An earlier insert left the doomed buffer in slot 0 of 2.
            table.offer((2, 0), 0, &doomed, Fill::Insert, &stats);
            table.sweep(&generation, &stats);
            let hold = |buffer: &Arc<ModelBuffer>| buffer.state.hold_live();
            let mut lookup = Some(|| {
                let index = index.read().unwrap();
                let found = index.iter().find(|b| b.key == other.key)?;
                found.state.hold_live().then(|| Arc::clone(found))
            });
            let found = table.find((2, 1), (1, other.key), &stats, hold, &mut lookup);
            let (found, _) = found.expect("the other buffer is live and indexed");
            found.state.unhold();
            if table.generation_seen() == 1 {
                let occupant = table.occupant(0);
                assert!(occupant.is_none(), "swept at 1, still holds {occupant:?}");
            }
            killer.join().unwrap();
        });
    }
}

// Model 4, pins against write-back's check: a transaction pins the dirty buffer under its
// lock while the checkpoint of an earlier pin completes (the log write, then the unpin,
// without the lock) and write-back checks it under the lock. Write-back never writes the
// buffer while a pin is outstanding, nor before the unpinning checkpoint's log write.
#[test]
fn pins_against_write_back() {
    explore(|| {
        // Dirty and pinned once: the first transaction's changes are in a checkpoint.
        let buffer = ModelBuffer::new(7, DIRTY | PIN_ONE);
        // The buffer's lock; true once the second transaction pinned it.
        let lock = Arc::new(Mutex::new(false));
        // The first checkpoint's log write is on disk.
        let logged = Arc::new(LoomFlag::new(false));
        let transaction = {
            let (buffer, lock) = (Arc::clone(&buffer), Arc::clone(&lock));
            thread::spawn(move || {
                let mut pinned = lock.lock().unwrap();
                buffer.state.pin();
                *pinned = true;
            })
        };
        let checkpoint = {
            let (buffer, logged) = (Arc::clone(&buffer), Arc::clone(&logged));
            thread::spawn(move || {
                logged.store(true, std::sync::atomic::Ordering::Relaxed);
                assert!(buffer.state.unpin(), "the first pin is there");
            })
        };
        {
            let second_pinned = lock.lock().unwrap();
            if buffer.state.write_check() == WriteCheck::Write {
                assert!(
                    !*second_pinned,
                    "written while pinned by the second transaction"
                );
                let logged = logged.load(std::sync::atomic::Ordering::Relaxed);
                assert!(logged, "written before the checkpoint's log write");
            }
        }
        transaction.join().unwrap();
        checkpoint.join().unwrap();
        assert_eq!(
            buffer.state.load(),
            DIRTY | PIN_ONE,
            "one pin left, still dirty"
        );
    });
}

// Model 5, the statistics stripes: two threads count with a stripe each if they can claim
// one (plain load and store), else in the shared stripe (atomic add); the first gives its
// stripe back when done, so the second may take it over. No count is lost.
#[test]
fn stripe_handover_loses_no_count() {
    explore(|| {
        let claimed = Arc::new([LoomFlag::new(false)]);
        let owned = Arc::new(LoomWord::new(0));
        let shared = Arc::new(LoomWord::new(0));
        let count = {
            let (claimed, owned, shared) = (
                Arc::clone(&claimed),
                Arc::clone(&owned),
                Arc::clone(&shared),
            );
            move || match claim_first(&*claimed) {
                Some(stripe) => {
                    add_to(&*owned, 1, true);
                    add_to(&*owned, 1, true);
                    give_back(&claimed[stripe]);
                }
                None => add_to(&*shared, 2, false),
            }
        };
        let first = thread::spawn(count.clone());
        count();
        first.join().unwrap();
        let total = owned.load(std::sync::atomic::Ordering::Relaxed)
            + shared.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(total, 4, "counts lost");
    });
}
