//! Deterministic simulator and end-to-end tests. The simulator arrives with the consensus issue.
