//! Free-space management (being written).
