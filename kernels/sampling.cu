// The device sampler: one token (and the requested logprobs) per row of f32 logits, with the
// CPU sampler's semantics (crates/engine/src/sampler.rs), so only ids and logprobs go back to
// the host. The host flattens the batch's requests into a plan
// (crates/engine/src/device_sampling.rs): per-row parameters plus shared arrays of logit-bias
// entries, banned ids, penalty entries and grammar-mask words.
//
// Launch: one block of SAMPLE_THREADS threads per row. Per row, in the CPU sampler's order:
//   raw  = logits with the grammar mask applied and NaN as -inf (logprobs are of this);
//   work = raw, then + logit bias, banned ids to -inf, repetition / frequency / presence
//          penalties (each id is one entry, so no two threads touch one logit);
//   greedy: the first index of the maximum. A greedy row with no bias, bans or penalties
//          reads the logits once and writes nothing but its token (the fast path);
//   sampled: scores (work - max) / temperature; candidates are finite scores >= ln(min_p).
//          In the order score descending, then id ascending, top-k keeps the first k and
//          top-p the shortest prefix whose mass reaches top_p of the rest; the draw takes the
//          first candidate whose running mass exceeds uniform * total, walking the candidates
//          as the CPU sampler does: in that order once top-k or top-p sorted them, else by id
//          (then by contiguous ranges of ids, one per thread, and a walk of one range).
//
// Nothing is sorted. Each candidate gets a unique 64-bit key whose ascending order is the
// walking order (the score's order bits, inverted, then the id; or the id), and "the first key whose
// running count or mass reaches a target" is found by a radix descent over 4-bit digits: one
// pass over the row per digit, each a histogram of counts and f64 masses, reduced in a fixed
// order so the result does not depend on timing. A descent stops early once its bin holds a
// single key. Masses are exp() of f64 scores summed in f64, like the CPU sampler's, so both
// pick the same token unless the draw lands within rounding of a boundary (about 1e-15).
//
// A row whose every candidate is gone gets the token 0xffffffff (the CPU sampler's
// NoCandidate); the host turns it into that error.
#include "common.cuh"

namespace pagoda {

// One row's parameters; layout of pagoda_engine::device_sampling::DeviceSampleRow (80 bytes).
struct SampleRow {
    double uniform;
    float temperature, top_p, score_floor, repetition_penalty, presence_penalty, frequency_penalty;
    unsigned top_k;
    int num_logprobs;
    unsigned bias_start, bias_end, banned_start, banned_end, penalty_start, penalty_end, mask_start, mask_len;
    unsigned flags, reserved;
};

constexpr int SAMPLE_THREADS = 256;
constexpr int DIGIT_BITS = 4, BINS = 1 << DIGIT_BITS;
constexpr unsigned ROW_GREEDY = 1, ROW_MASKED = 2;
constexpr unsigned NO_TOKEN = 0xffffffffu;
constexpr unsigned long long NO_KEY = ~0ull;

// Order-preserving map of f32 onto u32: the order of Rust's f32::total_cmp.
__device__ __forceinline__ unsigned ordered_bits(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Ascending keys = the candidate order: score descending, then id ascending.
__device__ __forceinline__ unsigned long long order_key(float score, unsigned id) {
    return ((unsigned long long)(~ordered_bits(score)) << 32) | id;
}

// Ascending keys = highest value first, lowest index among equals: the max key is the argmax.
__device__ __forceinline__ unsigned long long argmax_key(float value, unsigned id) {
    return ((unsigned long long)ordered_bits(value) << 32) | (~id);
}

__device__ __forceinline__ float argmax_value(unsigned long long key) {
    const unsigned u = (unsigned)(key >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// The block's shared memory: per-thread digit histograms, their partial sums, and a scratch
// row for scalar reductions (aliasing the histograms, which are never live at the same time).
struct SampleShared {
    double mass[BINS * SAMPLE_THREADS];
    unsigned short count[BINS * SAMPLE_THREADS];
    double part_mass[BINS * 16];
    unsigned part_count[BINS * 16];
    double bin_mass[BINS];
    unsigned bin_count[BINS];
};

enum class Reduce { Max, Min, Sum };

// Every thread gets the reduction of `v` over the block, combined in a fixed tree order.
__device__ __forceinline__ unsigned long long block_reduce_u64(unsigned long long v, Reduce op, SampleShared &sh) {
    unsigned long long *s = reinterpret_cast<unsigned long long *>(sh.mass);
    const int t = threadIdx.x;
    __syncthreads();  // a previous reduction may still be reading `s`
    s[t] = v;
    __syncthreads();
    for (int half = SAMPLE_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) {
            const unsigned long long a = s[t], b = s[t + half];
            s[t] = op == Reduce::Max ? (a > b ? a : b) : op == Reduce::Min ? (a < b ? a : b) : a + b;
        }
        __syncthreads();
    }
    const auto total = s[0];
    __syncthreads();  // everyone has read it before `s` is reused
    return total;
}

__device__ __forceinline__ double block_sum_f64(double v, SampleShared &sh) {
    double *s = sh.mass;
    const int t = threadIdx.x;
    __syncthreads();
    s[t] = v;
    __syncthreads();
    for (int half = SAMPLE_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) s[t] = s[t] + s[t + half];
        __syncthreads();
    }
    const auto total = s[0];
    __syncthreads();  // everyone has read it before `s` is reused
    return total;
}

// A row's logits with the grammar mask applied and NaN as -inf: what logprobs are of.
struct RawRow {
    const float *logits;
    const unsigned *mask;  // null when the row has no grammar mask
    unsigned mask_len;

    __device__ __forceinline__ float at(int i) const {
        const float l = logits[i];
        if (mask != nullptr) {
            const unsigned w = (unsigned)i / 32;
            const unsigned word = w < mask_len ? mask[w] : 0u;
            if (((word >> (i % 32)) & 1u) == 0) return -INFINITY;
        }
        return isnan(l) ? -INFINITY : l;
    }
};

// The sampling candidates of a processed row: finite scores at or above the min-p floor, in
// the order the CPU sampler walks them: by id until a top-k cut or top-p sorted them, then
// score descending, id ascending.
struct Candidates {
    const float *work;
    float max, inv_t, floor;
    bool sorted;

    __device__ __forceinline__ bool at(int i, float &score) const {
        const float l = work[i];
        if (!(l > -INFINITY)) return false;
        score = (l - max) * inv_t;
        return score >= floor;
    }

    __device__ __forceinline__ unsigned long long key(float score, int i) const {
        return sorted ? order_key(score, (unsigned)i) : (unsigned long long)i;
    }
};

// Max over the row of argmax_key(value(i), i).
template <typename Row> __device__ unsigned long long row_argmax(const Row &row, int vocab, SampleShared &sh) {
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const unsigned long long k = argmax_key(row.at(i), (unsigned)i);
        best = k > best ? k : best;
    }
    return block_reduce_u64(best, Reduce::Max, sh);
}

// Total mass of the candidates with key <= limit.
__device__ double candidate_mass(const Candidates &c, int vocab, unsigned long long limit, SampleShared &sh) {
    double mass = 0.0;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        float s;
        if (c.at(i, s) && c.key(s, i) <= limit) mass += exp((double)s);
    }
    return block_sum_f64(mass, sh);
}

// The smallest candidate key K <= limit whose running weight (count, or mass) over keys <= K
// reaches `target` (>=, or > when `strict`); NO_KEY when none does.
__device__ unsigned long long select_key(const Candidates &c, int vocab, unsigned long long limit, bool by_count,
                                         double target, bool strict, SampleShared &sh) {
    const int t = threadIdx.x;
    unsigned long long prefix = 0;
    double below = 0.0;  // weight of the candidates before the current prefix
    // Ids fit in 32 bits: a descent by id starts at its top digit.
    for (int shift = (c.sorted ? 64 : 32) - DIGIT_BITS; shift >= 0; shift -= DIGIT_BITS) {
        unsigned count[BINS];
        double mass[BINS];
#pragma unroll
        for (int b = 0; b < BINS; ++b) {
            count[b] = 0;
            mass[b] = 0.0;
        }
        const int high = shift + DIGIT_BITS;  // key bits above this digit must equal the prefix's
        for (int i = t; i < vocab; i += SAMPLE_THREADS) {
            float s;
            if (!c.at(i, s)) continue;
            const unsigned long long key = c.key(s, i);
            if (key > limit || (high < 64 && (key >> high) != (prefix >> high))) continue;
            const unsigned d = (unsigned)(key >> shift) & (BINS - 1);
            const double w = by_count ? 1.0 : exp((double)s);
#pragma unroll
            for (int b = 0; b < BINS; ++b) {
                if ((unsigned)b == d) {
                    count[b] += 1;
                    mass[b] += w;
                }
            }
        }
#pragma unroll
        for (int b = 0; b < BINS; ++b) {
            sh.mass[b * SAMPLE_THREADS + t] = mass[b];
            sh.count[b * SAMPLE_THREADS + t] = (unsigned short)count[b];
        }
        __syncthreads();
        {  // thread t sums the 16 threads of segment t % 16 for bin t / 16
            const int b = t / 16, seg = t % 16;
            double m = 0.0;
            unsigned n = 0;
            for (int j = seg * (SAMPLE_THREADS / 16); j < (seg + 1) * (SAMPLE_THREADS / 16); ++j) {
                m += sh.mass[b * SAMPLE_THREADS + j];
                n += sh.count[b * SAMPLE_THREADS + j];
            }
            sh.part_mass[b * 16 + seg] = m;
            sh.part_count[b * 16 + seg] = n;
        }
        __syncthreads();
        if (t < BINS) {
            double m = 0.0;
            unsigned n = 0;
            for (int seg = 0; seg < 16; ++seg) {
                m += sh.part_mass[t * 16 + seg];
                n += sh.part_count[t * 16 + seg];
            }
            sh.bin_mass[t] = m;
            sh.bin_count[t] = n;
        }
        __syncthreads();
        // Every thread makes the same choice from the same totals.
        int chosen = -1;
        double run = below;
        for (int b = 0; b < BINS; ++b) {
            const unsigned n = sh.bin_count[b];
            if (n == 0) continue;
            const double next = run + (by_count ? (double)n : sh.bin_mass[b]);
            if (strict ? next > target : next >= target) {
                chosen = b;
                break;
            }
            run = next;
        }
        if (chosen < 0) return NO_KEY;
        below = run;
        prefix |= (unsigned long long)chosen << shift;
        if (shift == 0) return prefix;
        if (sh.bin_count[chosen] == 1) {
            // One key left under this prefix: find it directly.
            unsigned long long found = 0;
            for (int i = t; i < vocab; i += SAMPLE_THREADS) {
                float s;
                if (!c.at(i, s)) continue;
                const unsigned long long key = c.key(s, i);
                if (key <= limit && (key >> shift) == (prefix >> shift)) found = key;
            }
            return block_reduce_u64(found, Reduce::Max, sh);
        }
    }
    return prefix;
}

// The draw when candidates are walked by id (neither top-k nor top-p cut them): the first id
// whose running mass exceeds `uniform` * total. Thread t sums the masses of the t-th contiguous
// range of ids; thread 0 adds the ranges' sums left to right, which gives the total and the
// range holding the target; that range's thread walks it id by id. Three passes over the row
// at most, where the radix descent by id made ten.
__device__ unsigned draw_by_id(const Candidates &c, int vocab, double uniform, SampleShared &sh) {
    const int t = threadIdx.x;
    const int per = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(t * per, vocab), hi = min(lo + per, vocab);
    double mass = 0.0;
    for (int i = lo; i < hi; ++i) {
        float s;
        if (c.at(i, s)) mass += exp((double)s);
    }
    __syncthreads();  // a previous reduction may still be reading sh.mass
    sh.mass[t] = mass;
    __syncthreads();
    if (t == 0) {
        double total = 0.0;
        for (int j = 0; j < SAMPLE_THREADS; ++j) total += sh.mass[j];
        const double target = uniform * total;
        double run = 0.0;
        int chosen = -1;
        for (int j = 0; j < SAMPLE_THREADS; ++j) {
            if (sh.mass[j] > 0.0 && run + sh.mass[j] > target) {
                chosen = j;
                break;
            }
            run += sh.mass[j];
        }
        sh.bin_mass[0] = run;
        sh.bin_mass[1] = target;
        if (chosen < 0) {
            // Rounding left the target at the very top of the mass: the last candidate owns
            // it (its range walks to its end without reaching the target).
            chosen = SAMPLE_THREADS - 1;
            while (chosen > 0 && sh.mass[chosen] == 0.0) --chosen;
            sh.bin_mass[1] = INFINITY;
        }
        sh.bin_count[0] = (unsigned)chosen;
    }
    __syncthreads();
    if (t == (int)sh.bin_count[0]) {
        double run = sh.bin_mass[0];
        const double target = sh.bin_mass[1];
        unsigned found = NO_TOKEN, last = NO_TOKEN;
        for (int i = lo; i < hi && found == NO_TOKEN; ++i) {
            float s;
            if (!c.at(i, s)) continue;
            run += exp((double)s);
            last = (unsigned)i;
            if (run > target) found = (unsigned)i;
        }
        // Within rounding of the range's end: its last candidate owns the target.
        sh.bin_count[1] = found != NO_TOKEN ? found : last;
    }
    __syncthreads();
    const unsigned token = sh.bin_count[1];
    __syncthreads();  // everyone has read it before the shared memory is reused
    return token;
}

// Temperature, min-p, top-k, top-p and the draw over a processed row.
__device__ unsigned draw(const float *work, int vocab, const SampleRow &p, SampleShared &sh) {
    const unsigned long long best = row_argmax(RawRow{work, nullptr, 0}, vocab, sh);
    const float max = argmax_value(best);
    if (max == -INFINITY) return NO_TOKEN;
    if (max == INFINITY) return ~(unsigned)best;  // a +inf bias forces its token
    Candidates c{work, max, 1.0f / p.temperature, p.score_floor, p.top_p < 1.0f};
    unsigned long long limit = NO_KEY;
    if (p.top_k > 0) {
        unsigned n = 0;
        float s;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) n += c.at(i, s) ? 1u : 0u;
        const unsigned long long total = block_reduce_u64(n, Reduce::Sum, sh);
        if (p.top_k < total) {
            c.sorted = true;
            limit = select_key(c, vocab, limit, true, (double)p.top_k, false, sh);
        }
    }
    if (!c.sorted) return draw_by_id(c, vocab, p.uniform, sh);
    if (p.top_p < 1.0f) {
        const double target = (double)p.top_p * candidate_mass(c, vocab, limit, sh);
        const unsigned long long k = select_key(c, vocab, limit, false, target, false, sh);
        if (k != NO_KEY) limit = k;
    }
    const double target = p.uniform * candidate_mass(c, vocab, limit, sh);
    unsigned long long k = select_key(c, vocab, limit, false, target, true, sh);
    if (k == NO_KEY) {
        // Rounding left the target at the very top of the mass: the last candidate owns it.
        unsigned long long last = 0;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            float s;
            if (!c.at(i, s)) continue;
            const unsigned long long key = c.key(s, i);
            if (key <= limit && key > last) last = key;
        }
        k = block_reduce_u64(last, Reduce::Max, sh);
    }
    return (unsigned)(k & 0xffffffffu);
}

// The sampled token's logprob and the row's top `k` under the raw distribution.
__device__ void raw_logprobs(const RawRow &raw, int vocab, unsigned token, int k, float *token_logprob,
                             unsigned *top_ids, float *top_logprobs, SampleShared &sh) {
    const float max = argmax_value(row_argmax(raw, vocab, sh));
    double lse = (double)max;
    if (isfinite(max)) {
        double sum = 0.0;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) sum += exp((double)(raw.at(i) - max));
        lse = (double)max + log(block_sum_f64(sum, sh));
    }
    auto logprob = [lse](float l) { return (l == -INFINITY || !isfinite(lse)) ? -INFINITY : (float)((double)l - lse); };
    if (threadIdx.x == 0) *token_logprob = token < (unsigned)vocab ? logprob(raw.at((int)token)) : -INFINITY;
    unsigned long long prev = 0;
    for (int j = 0; j < k; ++j) {
        unsigned long long best = NO_KEY;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            const unsigned long long key = order_key(raw.at(i), (unsigned)i);
            if ((j == 0 || key > prev) && key < best) best = key;
        }
        prev = block_reduce_u64(best, Reduce::Min, sh);
        if (threadIdx.x == 0) {
            const unsigned id = (unsigned)(prev & 0xffffffffu);
            top_ids[j] = id;
            top_logprobs[j] = logprob(raw.at((int)id));
        }
    }
}

__device__ void sample_row(const float *logits, long long row_stride, int vocab, const SampleRow *rows,
                           const unsigned *bias_ids, const float *bias_values, const unsigned *banned_ids,
                           const unsigned *penalty_ids, const unsigned *penalty_counts, const unsigned *mask_words,
                           float *work_rows, unsigned *tokens, float *token_logprobs, unsigned *top_ids,
                           float *top_logprobs, int max_logprobs) {
    __shared__ SampleShared sh;
    const long long r = blockIdx.x;
    const SampleRow p = rows[r];
    const RawRow raw{logits + r * row_stride, (p.flags & ROW_MASKED) ? mask_words + p.mask_start : nullptr,
                     p.mask_len};
    const bool greedy = (p.flags & ROW_GREEDY) != 0;
    const bool sparse = p.bias_start != p.bias_end || p.banned_start != p.banned_end || p.penalty_start != p.penalty_end;
    unsigned token;
    if (greedy && !sparse) {
        const unsigned long long best = row_argmax(raw, vocab, sh);
        token = argmax_value(best) == -INFINITY ? NO_TOKEN : ~(unsigned)best;
    } else {
        float *work = work_rows + r * (long long)vocab;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) work[i] = raw.at(i);
        __syncthreads();
        for (unsigned e = p.bias_start + threadIdx.x; e < p.bias_end; e += SAMPLE_THREADS) {
            work[bias_ids[e]] += bias_values[e];
        }
        __syncthreads();
        for (unsigned e = p.banned_start + threadIdx.x; e < p.banned_end; e += SAMPLE_THREADS) {
            work[banned_ids[e]] = -INFINITY;
        }
        __syncthreads();
        for (unsigned e = p.penalty_start + threadIdx.x; e < p.penalty_end; e += SAMPLE_THREADS) {
            float l = work[penalty_ids[e]];
            if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
            const unsigned n = penalty_counts[e];
            if (n > 0 && (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)) {
                // Unfused, as the CPU computes it.
                l = __fsub_rn(l, __fadd_rn(__fmul_rn(p.frequency_penalty, (float)n), p.presence_penalty));
            }
            work[penalty_ids[e]] = l;
        }
        __syncthreads();
        if (greedy) {
            const unsigned long long best = row_argmax(RawRow{work, nullptr, 0}, vocab, sh);
            token = argmax_value(best) == -INFINITY ? NO_TOKEN : ~(unsigned)best;
        } else {
            token = draw(work, vocab, p, sh);
        }
    }
    if (threadIdx.x == 0) tokens[r] = token;
    if (p.num_logprobs >= 0) {
        raw_logprobs(raw, vocab, token, p.num_logprobs, token_logprobs + r, top_ids + r * max_logprobs,
                     top_logprobs + r * max_logprobs, sh);
    }
}

}  // namespace pagoda

extern "C" __global__ void __launch_bounds__(pagoda::SAMPLE_THREADS)
    pagoda_sample_f32(const float *logits, long long row_stride, int vocab, const pagoda::SampleRow *rows,
                      const unsigned *bias_ids, const float *bias_values, const unsigned *banned_ids,
                      const unsigned *penalty_ids, const unsigned *penalty_counts, const unsigned *mask_words,
                      float *work, unsigned *tokens, float *token_logprobs, unsigned *top_ids, float *top_logprobs,
                      int max_logprobs) {
    pagoda::sample_row(logits, row_stride, vocab, rows, bias_ids, bias_values, banned_ids, penalty_ids,
                       penalty_counts, mask_words, work, tokens, token_logprobs, top_ids, top_logprobs, max_logprobs);
}
PAGODA_ENTRY(pagoda_sample_f32)
