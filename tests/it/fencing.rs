//! Two processes, one store: fencing epochs on tree claims (issue 12, defect 12) and read-only opens (defect 16).
