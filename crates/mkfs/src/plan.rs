//! Choosing the geometry: AG count and size, log size and place, where the root inode goes.

use cairn_format::limits::{
    AG_BLOCKS_MAX, AG_BLOCKS_MIN, AG_FIRST_FREE, BLOCK_SIZE_DEFAULT, INODE_SIZE_DEFAULT,
    INODES_PER_CHUNK, LABEL_LEN_MAX, LOG_BLOCKS_MIN, LOG_BLOCKS_USABLE_MIN, LOG_BYTES_MIN,
};
use cairn_format::superblock::FEATURE_INCOMPAT_REFLINK;
use cairn_format::{AgBlock, AgNumber, Geometry, InodeNumber};

use crate::MkfsError;

/// Largest allocation group mkfs chooses by itself (XFS's limit too): larger filesystems get
/// more AGs rather than larger ones.
pub const AG_BYTES_DEFAULT_MAX: u64 = 1 << 40;
/// Default number of AGs for filesystems up to 4 * `AG_BYTES_DEFAULT_MAX`: enough for parallel
/// allocation on small machines.
pub const AG_COUNT_DEFAULT: u64 = 4;
/// Blocks mkfs puts on every AG's free list, so the first free-space tree splits never need
/// to allocate: two trees, up to three levels each, plus one spare per tree.
pub const AGFL_INITIAL_BLOCKS: u32 = 8;
/// Default log size is this fraction of the filesystem, within the bounds below.
pub const LOG_FRACTION_DEFAULT: u64 = 32;
pub const LOG_BYTES_DEFAULT_MAX: u64 = 512 << 20;
/// Free blocks that must remain in the log's AG after the log, as a share of the AG (1/8):
/// an AG that is all log would leave nowhere to put its own growth.
pub const LOG_AG_SHARE_MAX_DIVISOR: u64 = 2;

/// What the user asked for; `None` means "choose for me".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub block_size: u32,
    pub sector_size: Option<u32>,
    pub inode_size: Option<u32>,
    pub ag_count: Option<u32>,
    pub ag_bytes: Option<u64>,
    pub log_bytes: Option<u64>,
    pub fs_bytes: Option<u64>,
    pub label: String,
    /// Files may share blocks (the reflink feature); off makes images older cairn mounts.
    pub reflink: bool,
}

impl Default for Request {
    fn default() -> Self {
        Self {
            block_size: BLOCK_SIZE_DEFAULT,
            sector_size: None,
            inode_size: None,
            ag_count: None,
            ag_bytes: None,
            log_bytes: None,
            fs_bytes: None,
            label: String::new(),
            reflink: true,
        }
    }
}

/// The chosen layout, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub geometry: Geometry,
    pub label: [u8; LABEL_LEN_MAX],
    /// The AG holding the log.
    pub log_ag: u32,
    /// First block of the root directory's inode chunk, in AG 0.
    pub root_chunk: AgBlock,
    pub root_inode: InodeNumber,
    /// The superblock's incompatible feature bits.
    pub features_incompat: u64,
}

impl Plan {
    /// First AG block after the static headers and the blocks handed to the free list.
    pub fn reserved_end() -> u32 {
        AG_FIRST_FREE + AGFL_INITIAL_BLOCKS
    }
}

/// Chooses a layout for a device of `device_bytes` with logical sector `device_sector`.
pub fn plan(device_bytes: u64, device_sector: u32, request: &Request) -> Result<Plan, MkfsError> {
    let label = encode_label(&request.label)?;
    let block_size = request.block_size;
    let sector_size = request.sector_size.unwrap_or(device_sector);
    if sector_size < device_sector {
        return Err(MkfsError::Option(format!(
            "sector size {sector_size} is smaller than the device's {device_sector}-byte sector"
        )));
    }
    let inode_size = request.inode_size.unwrap_or(default_inode_size(block_size));
    let fs_bytes = request.fs_bytes.unwrap_or(device_bytes);
    if fs_bytes > device_bytes {
        return Err(MkfsError::Option(format!(
            "requested size {fs_bytes} is larger than the device ({device_bytes} bytes)"
        )));
    }
    let chunk_blocks = (INODES_PER_CHUNK * inode_size.max(1))
        .div_ceil(block_size.max(1))
        .max(1);
    let root_chunk = Plan::reserved_end().next_multiple_of(chunk_blocks);
    let log_ag_blocks_min = log_ag_blocks_min(root_chunk + chunk_blocks);
    let block_size_bytes = u64::from(block_size.max(1));
    if fs_bytes / block_size_bytes < log_ag_blocks_min {
        return Err(MkfsError::TooSmall {
            bytes: fs_bytes,
            needed: log_ag_blocks_min * block_size_bytes,
        });
    }
    let block_count = fs_bytes / block_size_bytes;
    let ag_blocks = choose_ag_blocks(block_count, block_size, log_ag_blocks_min, request)?;
    let block_count = drop_runt_ag(block_count, ag_blocks);
    let ag_count = block_count.div_ceil(u64::from(ag_blocks)) as u32;
    // A middle AG, as XFS does, but never a shorter last AG (unless it is the only one).
    let log_ag = (ag_count - 1) / 2;
    let log_first = if log_ag == 0 {
        root_chunk + chunk_blocks
    } else {
        Plan::reserved_end()
    };
    let log_start = u64::from(log_ag) * u64::from(ag_blocks) + u64::from(log_first);
    let log_ag_len = (block_count - u64::from(log_ag) * u64::from(ag_blocks)).min(ag_blocks.into());
    let log_blocks = choose_log_blocks(
        fs_bytes,
        block_size,
        log_ag_len - u64::from(log_first),
        request,
    )?;
    let geometry = Geometry::new(
        block_size,
        sector_size,
        inode_size,
        block_count,
        ag_blocks,
        log_start,
        log_blocks,
    )
    .map_err(|(field, value, why)| MkfsError::Geometry { field, value, why })?;
    let root_inode = geometry.inode_number(AgNumber(0), AgBlock(root_chunk), 0);
    Ok(Plan {
        geometry,
        label,
        log_ag,
        root_chunk: AgBlock(root_chunk),
        root_inode,
        features_incompat: match request.reflink {
            true => FEATURE_INCOMPAT_REFLINK,
            false => 0,
        },
    })
}

/// XFS's rule of thumb: 512-byte inodes, larger on large blocks so a chunk fills whole blocks.
fn default_inode_size(block_size: u32) -> u32 {
    INODE_SIZE_DEFAULT.max(block_size / INODES_PER_CHUNK)
}

fn encode_label(text: &str) -> Result<[u8; LABEL_LEN_MAX], MkfsError> {
    let bytes = text.as_bytes();
    if bytes.len() > LABEL_LEN_MAX || bytes.contains(&0) {
        return Err(MkfsError::Option(format!(
            "label '{text}' is longer than {LABEL_LEN_MAX} bytes or contains NUL"
        )));
    }
    let mut label = [0u8; LABEL_LEN_MAX];
    label[..bytes.len()].copy_from_slice(bytes);
    Ok(label)
}

/// Blocks an AG needs to hold the smallest usable log in at most half of its free area, when
/// the log starts at block `log_first` of it.
fn log_ag_blocks_min(log_first: u32) -> u64 {
    u64::from(log_first) + LOG_AG_SHARE_MAX_DIVISOR * u64::from(LOG_BLOCKS_USABLE_MIN)
}

fn choose_ag_blocks(
    block_count: u64,
    block_size: u32,
    log_ag_blocks_min: u64,
    request: &Request,
) -> Result<u32, MkfsError> {
    let block_size = u64::from(block_size);
    let wanted = match (request.ag_count, request.ag_bytes) {
        (Some(_), Some(_)) => {
            return Err(MkfsError::Option(
                "give an AG count or an AG size, not both".into(),
            ));
        }
        (Some(0), None) => return Err(MkfsError::Option("AG count must be at least 1".into())),
        (Some(count), None) => block_count.div_ceil(u64::from(count)),
        (None, Some(bytes)) => bytes / block_size,
        (None, None) => {
            let max_ag_blocks = AG_BYTES_DEFAULT_MAX / block_size;
            let count = AG_COUNT_DEFAULT.max(block_count.div_ceil(max_ag_blocks));
            // Small filesystems get fewer, larger AGs, so one of them can hold the log.
            block_count
                .div_ceil(count)
                .max(log_ag_blocks_min)
                .min(block_count)
        }
    };
    if !(u64::from(AG_BLOCKS_MIN)..=u64::from(AG_BLOCKS_MAX)).contains(&wanted) {
        return Err(MkfsError::Geometry {
            field: "ag_blocks",
            value: wanted,
            why: "AG size must be between 64 blocks and 2^31 blocks",
        });
    }
    Ok(wanted as u32)
}

/// A last AG smaller than the minimum is dropped, as XFS does, rather than refused.
fn drop_runt_ag(block_count: u64, ag_blocks: u32) -> u64 {
    let ag_blocks = u64::from(ag_blocks);
    let tail = block_count % ag_blocks;
    if tail != 0 && tail < u64::from(AG_BLOCKS_MIN) && block_count > ag_blocks {
        block_count - tail
    } else {
        block_count
    }
}

fn choose_log_blocks(
    fs_bytes: u64,
    block_size: u32,
    room_blocks: u64,
    request: &Request,
) -> Result<u32, MkfsError> {
    let block_size = u64::from(block_size);
    let room = room_blocks / LOG_AG_SHARE_MAX_DIVISOR;
    let blocks = match request.log_bytes {
        Some(bytes) => {
            let blocks = bytes / block_size;
            if blocks > room_blocks.saturating_sub(1) {
                return Err(MkfsError::Option(format!(
                    "log of {bytes} bytes does not fit in one allocation group \
                     ({} blocks free there); use fewer allocation groups (-a)",
                    room_blocks
                )));
            }
            // An explicit size is the user's choice down to the format's minimum (tests of
            // log wrap-around use tiny logs); only the default must fit the largest
            // transactions.
            if blocks < u64::from(LOG_BLOCKS_MIN) {
                return Err(MkfsError::Option(format!(
                    "a log of {blocks} blocks is smaller than the format's minimum of \
                     {LOG_BLOCKS_MIN} blocks"
                )));
            }
            return Ok(blocks as u32);
        }
        None => {
            let bytes =
                (fs_bytes / LOG_FRACTION_DEFAULT).clamp(LOG_BYTES_MIN, LOG_BYTES_DEFAULT_MAX);
            (bytes / block_size)
                .max(u64::from(LOG_BLOCKS_USABLE_MIN))
                .min(room)
        }
    };
    if blocks < u64::from(LOG_BLOCKS_USABLE_MIN) {
        return Err(MkfsError::Option(format!(
            "a log of {blocks} blocks is too small: the journal needs at least \
             {LOG_BLOCKS_USABLE_MIN} blocks ({} bytes at this block size); \
             use a larger log (-l) or fewer allocation groups (-a)",
            u64::from(LOG_BLOCKS_USABLE_MIN) * block_size
        )));
    }
    Ok(blocks as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Checks the default layouts of the sizes the issue names.
    #[test]
    fn default_layouts() {
        let small = plan(16 << 20, 4096, &Request::default()).unwrap();
        // 16 MiB: two AGs, so one of them holds the smallest usable log in half its space.
        assert_eq!(small.geometry.ag_count, 2);
        assert_eq!(small.geometry.block_count, 4096);
        assert_eq!(small.geometry.log_blocks, LOG_BLOCKS_USABLE_MIN);
        let gib = plan(1 << 30, 4096, &Request::default()).unwrap();
        assert_eq!(gib.geometry.ag_count, 4);
        assert_eq!(gib.geometry.log_blocks, (32 << 20) / 4096);
        assert_eq!(gib.log_ag, 1);
        let tib = plan(1 << 40, 4096, &Request::default()).unwrap();
        assert_eq!(tib.geometry.ag_count, 4);
        let big = plan(16 << 40, 4096, &Request::default()).unwrap();
        assert_eq!(big.geometry.ag_count, 16);
    }

    // Checks that impossible requests are refused with a reason.
    #[test]
    fn refusals() {
        assert!(matches!(
            plan(1 << 20, 4096, &Request::default()),
            Err(MkfsError::TooSmall { .. })
        ));
        let both = Request {
            ag_count: Some(2),
            ag_bytes: Some(1 << 20),
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &both).is_err());
        let below_format_minimum = Request {
            log_bytes: Some(128 << 10),
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &below_format_minimum).is_err());
        let small_log = Request {
            log_bytes: Some(1 << 20),
            ..Request::default()
        };
        assert_eq!(
            plan(1 << 30, 4096, &small_log).unwrap().geometry.log_blocks,
            256
        );
        let huge_log = Request {
            log_bytes: Some(1 << 30),
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &huge_log).is_err());
        let small_sector = Request {
            sector_size: Some(512),
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &small_sector).is_err());
        let long_label = Request {
            label: "x".repeat(40),
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &long_label).is_err());
        let bad_block = Request {
            block_size: 3000,
            ..Request::default()
        };
        assert!(plan(1 << 30, 4096, &bad_block).is_err());
    }

    proptest! {
        // Any size and AG count either plans a valid geometry or gives an error.
        #[test]
        fn plans_are_valid(
            mib in 4u64..100_000,
            ag_count in proptest::option::of(1u32..64),
            block_log in 9u32..17,
        ) {
            let request = Request { block_size: 1 << block_log, ag_count, ..Request::default() };
            if let Ok(p) = plan(mib << 20, 512, &request) {
                let g = p.geometry;
                prop_assert!(g.block_count <= (mib << 20) / u64::from(g.block_size));
                prop_assert!(g.inode_is_valid(p.root_inode.0));
                prop_assert!(g.log_blocks >= LOG_BLOCKS_USABLE_MIN);
                let log_ag = (g.log_start / u64::from(g.ag_blocks)) as u32;
                prop_assert_eq!(log_ag, p.log_ag);
            }
        }
    }
}
