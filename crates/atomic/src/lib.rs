//! Atomics behind traits: cairn's lock-free protocols are written once, generic over the
//! atomic type, so the filesystem runs them on std's atomics (the traits' methods are
//! `#[inline(always)]` forwards, so this costs nothing) and the tests drive the very same
//! functions on loom's atomics, whose model checker tries every interleaving and every value
//! the memory model lets a load return (`docs/testing.md`, "Model checking").
//!
//! Owns: the traits `Atomic` (what every atomic does), `AtomicWord` (a `u64`, with
//! arithmetic) and `AtomicFlag` (a `bool`), their implementations for `std::sync::atomic`, and
//! with the `loom` feature for `loom::sync::atomic`. Invariant: every method is the same-named
//! atomic operation with the orderings given, nothing added (no fence, no retry), so what loom
//! checks is what runs.

use std::sync::atomic::Ordering;

/// What every atomic does, on values of type `Value`.
pub trait Atomic: Send + Sync {
    type Value: Copy;
    fn new(value: Self::Value) -> Self;
    fn load(&self, order: Ordering) -> Self::Value;
    fn store(&self, value: Self::Value, order: Ordering);
    fn swap(&self, value: Self::Value, order: Ordering) -> Self::Value;
    fn compare_exchange(
        &self,
        current: Self::Value,
        new: Self::Value,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Self::Value, Self::Value>;
}

/// An atomic `u64`, with the read-modify-writes cairn's protocols use.
pub trait AtomicWord: Atomic<Value = u64> {
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64;
    fn fetch_or(&self, value: u64, order: Ordering) -> u64;
    fn fetch_and(&self, value: u64, order: Ordering) -> u64;
    fn fetch_update(
        &self,
        set: Ordering,
        fetch: Ordering,
        update: impl FnMut(u64) -> Option<u64>,
    ) -> Result<u64, u64>;
}

/// An atomic `bool`.
pub trait AtomicFlag: Atomic<Value = bool> {}

/// Forwards `Atomic` to an atomic type with the std method set, on values of `$value`.
macro_rules! atomic {
    ($atomic:ty, $value:ty) => {
        impl Atomic for $atomic {
            type Value = $value;

            #[inline(always)]
            fn new(value: $value) -> Self {
                <$atomic>::new(value)
            }
            #[inline(always)]
            fn load(&self, order: Ordering) -> $value {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: $value, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: $value, order: Ordering) -> $value {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: $value,
                new: $value,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$value, $value> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}

/// `Atomic` and `AtomicWord` for an atomic `u64` type with the std method set.
macro_rules! word {
    ($atomic:ty) => {
        atomic!($atomic, u64);

        impl AtomicWord for $atomic {
            #[inline(always)]
            fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_add(self, value, order)
            }
            #[inline(always)]
            fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_sub(self, value, order)
            }
            #[inline(always)]
            fn fetch_or(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_or(self, value, order)
            }
            #[inline(always)]
            fn fetch_and(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_and(self, value, order)
            }
            #[inline(always)]
            fn fetch_update(
                &self,
                set: Ordering,
                fetch: Ordering,
                update: impl FnMut(u64) -> Option<u64>,
            ) -> Result<u64, u64> {
                <$atomic>::fetch_update(self, set, fetch, update)
            }
        }
    };
}

/// `Atomic` and `AtomicFlag` for an atomic `bool` type with the std method set.
macro_rules! flag {
    ($atomic:ty) => {
        atomic!($atomic, bool);

        impl AtomicFlag for $atomic {}
    };
}

word!(std::sync::atomic::AtomicU64);
flag!(std::sync::atomic::AtomicBool);
#[cfg(feature = "loom")]
word!(loom::sync::atomic::AtomicU64);
#[cfg(feature = "loom")]
flag!(loom::sync::atomic::AtomicBool);
