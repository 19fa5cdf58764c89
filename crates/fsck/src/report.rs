//! What a check found.

use std::fmt;

use cairn_format::FormatError;

/// One inconsistency, naming the structure and, where known, the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub structure: String,
    pub block: Option<u64>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.block {
            Some(block) => write!(f, "{} (block {block}): {}", self.structure, self.message),
            None => write!(f, "{}: {}", self.structure, self.message),
        }
    }
}

impl Problem {
    pub fn new(
        structure: impl Into<String>,
        block: Option<u64>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            structure: structure.into(),
            block,
            message: message.into(),
        }
    }

    /// A verifier's error, which already names structure and block in its message.
    pub fn from_format(block: u64, err: &FormatError) -> Self {
        Self::new(err.structure(), Some(block), err.to_string())
    }
}

/// Everything a check found and counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub problems: Vec<Problem>,
    pub blocks_checked: u64,
    pub inodes_checked: u64,
    pub free_blocks: u64,
    pub free_extents: u64,
    pub allocated_inodes: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn add(&mut self, problem: Problem) {
        self.problems.push(problem);
    }
}
