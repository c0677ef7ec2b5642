// Every kernel in kernels/*.cu compiled for the CPU simulator, plus the C entry point the
// Rust tests launch them through. One translation unit, so the kernels' registrations are
// linked whenever the entry point is.
#define PAGODA_SIM 1

#include <mutex>

#include "runtime.h"

#include "../fp8_matmul.cu"
#include "../lora.cu"
#include "../paged_attention_combine.cu"
#include "../paged_attention_mma.cu"
#include "../paged_attention_simt.cu"
#include "../quant_matmul.cu"
#include "../reshape_and_cache.cu"
#include "../rms_norm.cu"
#include "../rotary.cu"
#include "../sampling.cu"
#include "../silu_and_mul.cu"
#include "../skinny_matmul.cu"

// Launches kernel `name` like cuLaunchKernel (params[i] points at parameter i's value) and
// runs it to completion. Returns 0, or non-zero with a message in `error` (a hang, an unknown
// kernel, a bad launch shape). Launches are serialised: shared memory is process-global.
extern "C" int pagoda_sim_launch(const char *name, const unsigned *grid, const unsigned *block, unsigned smem_bytes,
                                 void **params, char *error, size_t error_len) {
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    std::string message;
    try {
        message = sim::run(name, sim::Dim3{grid[0], grid[1], grid[2]}, sim::Dim3{block[0], block[1], block[2]},
                           smem_bytes, params);
    } catch (const std::exception &e) {
        message = e.what();
    }
    if (message.empty()) return 0;
    if (error_len > 0) {
        const size_t n = message.size() < error_len - 1 ? message.size() : error_len - 1;
        memcpy(error, message.data(), n);
        error[n] = 0;
    }
    return 1;
}
