//! `pagoda-gpu-check`: everything the CUDA backend must prove on a GPU, in one binary that a
//! GPU host runs without Rust or a CUDA toolkit (scripts/gpu-check.sh builds, packs and runs
//! it).
//!
//! The binary (feature `cuda`) checks every CUDA op against its CPU op on fresh random
//! inputs, the whole default model on CUDA against the CPU, the release server answering a
//! chat request on CUDA, and times the attention kernels. This library holds the parts that
//! need no GPU, so they are tested everywhere: the results table, the error metrics, the
//! timing arithmetic, the server check, the whole-model comparison (run on the CPU against
//! itself in the tests) and the KV block copy check (run on the CPU in the tests).

pub mod block_copy_check;
pub mod compare;
pub mod model_check;
pub mod report;
pub mod server;
pub mod timing;
