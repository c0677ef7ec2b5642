//! `pagoda-bench`: load generator and benchmarks for Pagoda.
