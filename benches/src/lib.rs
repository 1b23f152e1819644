//! Benchmarks live in `benches/benches/`; this library holds shared input generators.
