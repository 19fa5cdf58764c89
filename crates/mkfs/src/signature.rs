//! Recognises what a device already holds, so mkfs refuses to overwrite it without `-f`.

use cairn_format::{MetaKind, OnDisk, Superblock};

/// Bytes read from the start of the device to look for signatures.
pub const PROBE_BYTES: usize = 128 * 1024;

/// Describes the filesystem or partition table found in `head` (the first bytes of the device),
/// or `None` when nothing known is there.
pub fn identify(head: &[u8]) -> Option<String> {
    if let Some(found) = identify_cairn(head) {
        return Some(found);
    }
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    let known: [(usize, &[u8], &str); 9] = [
        (0, b"XFSB", "an XFS filesystem"),
        (1080, &[0x53, 0xef], "an ext2/ext3/ext4 filesystem"),
        (65600, b"_BHRfS_M", "a btrfs filesystem"),
        (4086, b"SWAPSPACE2", "a swap area"),
        (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
        (0, b"hsqs", "a squashfs image"),
        (512, b"LABELONE", "an LVM2 physical volume"),
        (512, b"EFI PART", "a GPT partition table"),
        (32769, b"CD001", "an ISO 9660 filesystem"),
    ];
    if let Some((_, _, name)) = known.iter().find(|(offset, magic, _)| at(*offset, magic)) {
        return Some((*name).to_string());
    }
    if at(510, &[0x55, 0xaa]) {
        return Some("a DOS boot sector or partition table".to_string());
    }
    None
}

fn identify_cairn(head: &[u8]) -> Option<String> {
    let magic = head.get(..4)?;
    if magic != MetaKind::Superblock.magic().to_le_bytes() {
        return None;
    }
    Some(match Superblock::decode(head) {
        Ok(sb) => {
            let bytes = sb.geometry.block_count * u64::from(sb.geometry.block_size);
            let label = sb.label_str();
            let label = if label.is_empty() {
                String::new()
            } else {
                format!(", label '{label}'")
            };
            format!(
                "a cairn filesystem ({}{label})",
                crate::size::human_size(bytes)
            )
        }
        Err(_) => "a damaged cairn filesystem".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the common signatures are recognised and blank space is not.
    #[test]
    fn recognises_signatures() {
        let mut head = vec![0u8; PROBE_BYTES];
        assert_eq!(identify(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xef;
        assert_eq!(
            identify(&head).as_deref(),
            Some("an ext2/ext3/ext4 filesystem")
        );
        let mut head = vec![0u8; PROBE_BYTES];
        head[..4].copy_from_slice(b"XFSB");
        assert_eq!(identify(&head).as_deref(), Some("an XFS filesystem"));
        let mut head = vec![0u8; 600];
        head[510] = 0x55;
        head[511] = 0xaa;
        assert!(identify(&head).unwrap().contains("partition table"));
        let mut head = vec![0u8; 600];
        head[..4].copy_from_slice(&MetaKind::Superblock.magic().to_le_bytes());
        assert_eq!(
            identify(&head).as_deref(),
            Some("a damaged cairn filesystem")
        );
        assert_eq!(identify(&[]), None);
    }
}
