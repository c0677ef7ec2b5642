// The simulator's scheduler: runs each block of a launch as one fiber per CUDA thread and
// releases them at barriers and warp collectives (see cuda_sim.h). Included once, by
// sim_all.cpp.
#pragma once

#include <ucontext.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_sim.h"

namespace sim {

namespace {

enum class State { Ready, AtBarrier, AtCollective, Done };

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t SLOT_BYTES = 64;

struct Fiber {
    ucontext_t context;
    State state = State::Ready;
    ThreadCoords coords{};
    std::unique_ptr<char[]> stack;
    alignas(16) unsigned char slot[SLOT_BYTES];
};

struct Launch {
    std::vector<Fiber> fibers;
    ucontext_t scheduler;
    int current = -1;
    Invoke invoke = nullptr;
    void **params = nullptr;
    std::vector<unsigned char> dynamic_smem;
    std::string error;
};

Launch &launch_state() {
    static Launch launch;
    return launch;
}

std::map<std::string, Invoke> &registry() {
    static std::map<std::string, Invoke> kernels;
    return kernels;
}

Fiber &current_fiber() { return launch_state().fibers[launch_state().current]; }

void yield(State state) {
    Launch &l = launch_state();
    Fiber &f = current_fiber();
    f.state = state;
    swapcontext(&f.context, &l.scheduler);
}

void fiber_main() {
    Launch &l = launch_state();
    l.invoke(l.params);
    current_fiber().state = State::Done;
    // Returning resumes uc_link, the scheduler.
}

// Runs one block to completion; returns false (with launch_state().error set) on a hang.
bool run_block(Dim3 block, Dim3 block_dim, Dim3 grid_dim) {
    Launch &l = launch_state();
    const int n = (int)(block_dim.x * block_dim.y * block_dim.z);
    for (int i = 0; i < n; ++i) {
        Fiber &f = l.fibers[i];
        f.state = State::Ready;
        f.coords.thread = Dim3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
        f.coords.block = block;
        f.coords.block_dim = block_dim;
        f.coords.grid_dim = grid_dim;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = &l.scheduler;
        makecontext(&f.context, fiber_main, 0);
    }
    const int num_warps = (n + 31) / 32;
    for (;;) {
        for (int i = 0; i < n; ++i) {
            if (l.fibers[i].state == State::Ready) {
                l.current = i;
                swapcontext(&l.scheduler, &l.fibers[i].context);
            }
        }
        l.current = -1;
        bool released = false;
        int at_collective = 0, at_barrier = 0, done = 0;
        for (int w = 0; w < num_warps; ++w) {
            const int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
            int waiting = 0;
            for (int i = lo; i < hi; ++i) waiting += l.fibers[i].state == State::AtCollective;
            if (waiting == 0) continue;
            if (waiting == 32) {
                for (int i = lo; i < hi; ++i) l.fibers[i].state = State::Ready;
                released = true;
            } else {
                l.error = "warp " + std::to_string(w) + " of block (" + std::to_string(block.x) + ", " +
                          std::to_string(block.y) + ", " + std::to_string(block.z) + "): " + std::to_string(waiting) +
                          " of 32 lanes reached a warp collective, the others exited or wait at __syncthreads";
                return false;
            }
        }
        if (released) continue;
        for (int i = 0; i < n; ++i) {
            at_collective += l.fibers[i].state == State::AtCollective;
            at_barrier += l.fibers[i].state == State::AtBarrier;
            done += l.fibers[i].state == State::Done;
        }
        if (done == n) return true;
        if (at_barrier > 0 && at_collective == 0) {
            // Threads that exited count as arrived, as on hardware since Volta.
            for (int i = 0; i < n; ++i) {
                if (l.fibers[i].state == State::AtBarrier) l.fibers[i].state = State::Ready;
            }
            continue;
        }
        l.error = "block could not make progress";
        return false;
    }
}

}  // namespace

const ThreadCoords &coords() { return current_fiber().coords; }

void syncthreads() { yield(State::AtBarrier); }

int lane_id() {
    const ThreadCoords &c = coords();
    const unsigned linear = c.thread.x + c.block_dim.x * (c.thread.y + c.block_dim.y * c.thread.z);
    return (int)(linear % 32);
}

void begin_exchange(const void *data, size_t bytes) {
    if (bytes > SLOT_BYTES) throw std::logic_error("warp exchange larger than a slot");
    memcpy(current_fiber().slot, data, bytes);
    yield(State::AtCollective);
}

const void *lane_data(int lane) {
    Launch &l = launch_state();
    const int base = l.current - l.current % 32;
    return l.fibers[base + lane].slot;
}

void end_exchange() { yield(State::AtCollective); }

unsigned char *dynamic_smem() { return launch_state().dynamic_smem.data(); }

void register_kernel(const char *name, Invoke invoke) { registry()[name] = invoke; }

// Runs a whole grid. Returns an empty string on success, else what went wrong.
std::string run(const char *name, Dim3 grid, Dim3 block, unsigned smem_bytes, void **params) {
    auto found = registry().find(name);
    if (found == registry().end()) return std::string("no kernel named ") + name;
    const unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024) return "block of " + std::to_string(threads) + " threads";
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "empty grid";
    Launch &l = launch_state();
    if (l.fibers.size() < threads) {
        l.fibers.resize(threads);
        for (Fiber &f : l.fibers) {
            if (!f.stack) f.stack.reset(new char[STACK_BYTES]);
        }
    }
    l.invoke = found->second;
    l.params = params;
    l.error.clear();
    // Fresh dynamic shared memory per launch, poisoned so reads before writes show up.
    l.dynamic_smem.assign(smem_bytes + 16, 0xA5);
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                if (!run_block(Dim3{x, y, z}, block, grid)) return l.error;
            }
        }
    }
    return std::string();
}

}  // namespace sim
