//! Sizes on the command line: a number with an optional binary suffix.

/// Parses `4096`, `512k`, `16M`, `1G`, `1T` (binary multiples, case-insensitive, optional
/// trailing `B` or `iB`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        Some('p') => (&body[..body.len() - 1], 50),
        _ => (body, 0),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("'{trimmed}' is not a size (examples: 4096, 512K, 16M, 1G, 1T)"))?;
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size '{trimmed}' is too large"))
}

/// Formats a byte count the way people read it: `16 MiB`, `1.5 GiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Checks the suffixes people type.
    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1TB"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999P").is_err());
        assert_eq!(human_size(16 << 20), "16 MiB");
        assert_eq!(human_size(3 << 29), "1.5 GiB");
    }

    proptest! {
        // Any input gives a value or a message, never a panic.
        #[test]
        fn never_panics(text in ".{0,12}") {
            let _ = parse_size(&text);
        }
    }
}
