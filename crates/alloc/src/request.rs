//! Allocation requests, results, and the placement arithmetic shared by every mode.

use cairn_format::{AgNumber, FsBlock};

use crate::AllocError;

/// How to choose among free extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The best extent close to the target (most data and metadata allocations).
    Near,
    /// Any extent of the wanted length: the smallest that fits.
    Size,
    /// Exactly at the target (extending a file in place), or nothing. Only the target's AG
    /// is tried.
    Exact,
    /// In the middle of the longest free extent (the target's AG first), at least as much
    /// room left before it as taken: for a stream whose exact continuation another stream
    /// took. The blocks before the middle stay free for that other stream to grow into, and
    /// the ones after it for this one, where near mode would put the two back to back again.
    Apart,
}

/// One allocation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    /// The block to allocate at or near; its AG is tried first.
    pub target: FsBlock,
    pub min_len: u32,
    pub max_len: u32,
    /// The start must be a multiple of this (1: any).
    pub alignment: u32,
    /// The length must be a multiple of this (1: any).
    pub len_multiple: u32,
    /// Free blocks that must remain in the AG afterwards (for the rest of the transaction).
    pub min_left: u32,
    /// Lowest AG this transaction may still lock (AGs are locked in ascending order).
    pub lowest_ag: AgNumber,
    /// May take the AG's reserved blocks (`Allocator::with_ag_reserve`): set only by the
    /// metadata a freeing operation must be able to grow (the inode trees).
    pub use_reserve: bool,
    /// Only the target's AG may be tried (an inode chunk for that AG's AGI, a block of
    /// that AG's inode trees): no other AG's header is locked for nothing.
    pub target_ag_only: bool,
}

impl Request {
    /// A near-mode request for `min_len..=max_len` blocks at `target`.
    pub fn near(target: FsBlock, min_len: u32, max_len: u32) -> Request {
        Request {
            mode: Mode::Near,
            target,
            min_len,
            max_len,
            alignment: 1,
            len_multiple: 1,
            min_left: 0,
            lowest_ag: AgNumber(0),
            use_reserve: false,
            target_ag_only: false,
        }
    }

    /// The same request, allowed into the AG's reserved blocks.
    #[must_use]
    pub fn with_reserve(mut self) -> Request {
        self.use_reserve = true;
        self
    }

    /// The same request, tried in the target's AG only.
    #[must_use]
    pub fn in_target_ag_only(mut self) -> Request {
        self.target_ag_only = true;
        self
    }

    #[must_use]
    pub fn with_mode(mut self, mode: Mode) -> Request {
        self.mode = mode;
        self
    }

    #[must_use]
    pub fn with_alignment(mut self, alignment: u32, len_multiple: u32) -> Request {
        self.alignment = alignment;
        self.len_multiple = len_multiple;
        self
    }

    #[must_use]
    pub fn with_min_left(mut self, min_left: u32) -> Request {
        self.min_left = min_left;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), AllocError> {
        let bad = |why| Err(AllocError::BadRequest { why });
        if self.min_len == 0 {
            return bad("min_len is zero");
        }
        if self.min_len > self.max_len {
            return bad("min_len above max_len");
        }
        if self.alignment == 0 || self.len_multiple == 0 {
            return bad("alignment and length multiple must be at least 1");
        }
        if self.min_len.next_multiple_of(self.len_multiple) > self.max_len {
            return bad("no length in min_len..=max_len is a multiple of len_multiple");
        }
        Ok(())
    }
}

/// Blocks handed out: AG-relative start in an AG, and the filesystem address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub ag: AgNumber,
    pub start: u32,
    pub length: u32,
    pub fs_start: FsBlock,
}

/// Where a request lands inside one usable (busy-trimmed) free range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub start: u32,
    pub length: u32,
    /// Distance from the target (0 when the range covers it).
    pub distance: u64,
}

impl Placement {
    /// Whether `self` beats `other`: longer (up to the wanted length) first, then nearer.
    pub fn beats(&self, other: &Option<Placement>) -> bool {
        match other {
            None => true,
            Some(other) => {
                (self.length, std::cmp::Reverse(self.distance))
                    > (other.length, std::cmp::Reverse(other.distance))
            }
        }
    }
}

/// The best place for `min_len..=wanted` blocks (aligned, a multiple of `len_multiple`) in
/// the free range `start..start + length`, as close to `target` as it allows; `None` if the
/// range is too short.
pub(crate) fn place(
    request: &Request,
    wanted: u32,
    target: u32,
    (start, length): (u32, u32),
) -> Option<Placement> {
    let end = u64::from(start) + u64::from(length);
    let first = u64::from(start).next_multiple_of(u64::from(request.alignment));
    if first >= end {
        return None;
    }
    let room = (end - first).min(u64::from(wanted)) as u32;
    let got = room - room % request.len_multiple;
    if got < request.min_len || got == 0 {
        return None;
    }
    // Slide the extent towards the target within the range, keeping alignment.
    let last_start = end - u64::from(got);
    let align = u64::from(request.alignment);
    let last_aligned = last_start - last_start % align;
    let want = u64::from(target).clamp(first, last_aligned.max(first));
    let at = want - want % align;
    let at = if at < first { first } else { at };
    let distance = if u64::from(target) < at {
        at - u64::from(target)
    } else if u64::from(target) >= at + u64::from(got) {
        u64::from(target) + 1 - (at + u64::from(got))
    } else {
        0
    };
    Some(Placement {
        start: at as u32,
        length: got,
        distance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks placement: sliding towards the target, alignment, multiples and refusals.
    #[test]
    fn placement_arithmetic() {
        let r = Request::near(FsBlock(0), 4, 8);
        assert_eq!(
            place(&r, 8, 50, (10, 100)),
            Some(Placement {
                start: 50,
                length: 8,
                distance: 0
            })
        );
        assert_eq!(
            place(&r, 8, 0, (10, 100)).map(|p| (p.start, p.distance)),
            Some((10, 10))
        );
        assert_eq!(
            place(&r, 8, 500, (10, 100)).map(|p| (p.start, p.distance)),
            Some((102, 391))
        );
        assert_eq!(place(&r, 8, 0, (10, 3)), None);
        let aligned = r.with_alignment(16, 4);
        let p = place(&aligned, 8, 40, (10, 30)).unwrap();
        assert_eq!((p.start % 16, p.length % 4), (0, 0));
        assert!(p.start >= 10 && p.start + p.length <= 40);
        assert_eq!(place(&aligned, 8, 0, (17, 10)), None);
        assert!(r.validate().is_ok());
        assert!(Request::near(FsBlock(0), 5, 4).validate().is_err());
        assert!(
            Request::near(FsBlock(0), 5, 7)
                .with_alignment(1, 8)
                .validate()
                .is_err()
        );
    }
}
