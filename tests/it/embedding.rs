//! Filled by work in progress on issues 34 and 35.
