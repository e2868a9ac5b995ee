//! Issue 34 regression tests (filled in as the fixes land).
