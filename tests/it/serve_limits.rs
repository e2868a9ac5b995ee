//! The service under hostile connection load (issue 12, defect 13).
