/// A decoding or verification failure. Every variant names the structure and, where known, the
/// block it was read from, so corruption reports point at the damage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{structure} at block {block}: bad magic {found:#x} (want {expected:#x})")]
    BadMagic {
        structure: &'static str,
        block: u64,
        expected: u32,
        found: u32,
    },

    #[error("{structure} at block {block}: bad CRC {found:#010x} (computed {computed:#010x})")]
    BadCrc {
        structure: &'static str,
        block: u64,
        found: u32,
        computed: u32,
    },

    #[error("{structure} at block {block}: claims to be block {found} (misdirected write?)")]
    WrongBlock {
        structure: &'static str,
        block: u64,
        found: u64,
    },

    #[error("{structure} at block {block}: belongs to another filesystem (uuid mismatch)")]
    WrongUuid { structure: &'static str, block: u64 },

    #[error("{structure} at block {block}: owner is {found}, expected {expected}")]
    WrongOwner {
        structure: &'static str,
        block: u64,
        expected: u64,
        found: u64,
    },

    #[error("{structure} at block {block}: field {field} is {value}: {why}")]
    BadField {
        structure: &'static str,
        block: u64,
        field: &'static str,
        value: u64,
        why: &'static str,
    },

    #[error("{structure}: buffer of {found} bytes is too short (need {needed})")]
    TooShort {
        structure: &'static str,
        needed: usize,
        found: usize,
    },

    #[error("{structure} at block {block}: unsupported incompatible features {features:#x}")]
    UnsupportedFeatures {
        structure: &'static str,
        block: u64,
        features: u64,
    },
}

impl FormatError {
    /// The name of the damaged structure, for reports.
    pub fn structure(&self) -> &'static str {
        match self {
            Self::BadMagic { structure, .. }
            | Self::BadCrc { structure, .. }
            | Self::WrongBlock { structure, .. }
            | Self::WrongUuid { structure, .. }
            | Self::WrongOwner { structure, .. }
            | Self::BadField { structure, .. }
            | Self::TooShort { structure, .. }
            | Self::UnsupportedFeatures { structure, .. } => structure,
        }
    }
}
