// The runs of test_fcfs_kv.cpp: each run's geometry (the groups and the scheduler's settings)
// drawn from its seed, the scheduler's token budget, what a scheduled sequence computes in a
// step, and the counts a run reports.
#ifndef KVSHARE_MINDIE_TEST_FCFS_KV_SETUP_H
#define KVSHARE_MINDIE_TEST_FCFS_KV_SETUP_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "harness.h"

namespace fcfs_kv {

enum class Mode { PREFILL_FIRST, DECODE_FIRST, MIX };

struct Budget {
    size_t maxTokens, maxSeqs, tokens = 0, seqs = 0;
    bool CanSchedule(size_t t, size_t s) const { return tokens + t <= maxTokens && seqs + s <= maxSeqs; }
    size_t Remaining() const { return tokens >= maxTokens ? 0 : maxTokens - tokens; }
    void Add(size_t t, size_t s) {
        tokens += t;
        seqs += s;
    }
};

// A run's geometry: the groups (window blocks N, 0 for full attention; blocks each) and the
// scheduler's settings.
struct Setup {
    bool hybrid = true;
    std::vector<size_t> windows;  // requestBlockWindowSize per group (0: TOKEN)
    std::vector<size_t> blocks;   // npuBlockNum per group
    size_t cpu = 0;
    size_t bs = 4;
    size_t spec = 0;
    bool caching = true;
    bool chunked = false;
    size_t chunk = 0;  // prefillChunkSize
    size_t maxTokens = 0;
    size_t maxSeqs = 6;
    size_t maxPreemptCount = 1000;
    size_t maxLen = 0;  // a request finishes at this length

    std::string Describe() const {
        std::string s = hybrid ? "groups" : "block manager";
        s += " [";
        for (size_t g = 0; g < windows.size(); ++g) {
            s += (g ? ", " : "") + (windows[g] == 0 ? std::string("TOKEN") : "SW" + std::to_string(windows[g])) + " " +
                 std::to_string(blocks[g]);
        }
        s += "]";
        if (cpu > 0) {
            s += " cpu " + std::to_string(cpu);
        }
        s += caching ? ", caching" : ", no caching";
        s += chunked ? ", chunked prefill " + std::to_string(chunk) : ", whole prefills";
        s += ", spec " + std::to_string(spec);
        return s;
    }
};

struct Counts {
    size_t steps = 0, admitted = 0, seqsAdmitted = 0, chunks = 0, appends = 0, swapIns = 0, swapOuts = 0;
    size_t recomputes = 0, finished = 0, hitTokens = 0, written = 0, read = 0, copies = 0;
    size_t exceptions = 0, wrongReads = 0, releasedReads = 0, violations = 0;
    std::map<std::string, size_t> byCall;
    void Add(const Counts &o) {
        steps += o.steps;
        admitted += o.admitted;
        seqsAdmitted += o.seqsAdmitted;
        chunks += o.chunks;
        appends += o.appends;
        swapIns += o.swapIns;
        swapOuts += o.swapOuts;
        recomputes += o.recomputes;
        finished += o.finished;
        hitTokens += o.hitTokens;
        written += o.written;
        read += o.read;
        copies += o.copies;
        exceptions += o.exceptions;
        wrongReads += o.wrongReads;
        releasedReads += o.releasedReads;
        violations += o.violations;
    }
};

// What one scheduled sequence computes this step: tokens [from, to), and how much its
// numComputedTokens_ then grows.
struct Work {
    mindie_llm::SequenceSPtr seq;
    size_t from, to, advance;
};

// `blockManager`: a KvshareBlockManager run (with swap), else a KvshareHybridBlockManager one
// (with swap when it has one group).
inline Setup Draw(uint64_t seed, bool blockManager) {
    std::mt19937_64 r(seed * 7919 + 17);
    auto U = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(r); };
    Setup s;
    s.bs = 4;
    s.hybrid = !blockManager;
    s.caching = U(5) != 0;
    s.chunked = U(2) == 0;
    s.chunk = s.bs * (2 + U(4)) + U(2);
    s.maxLen = 14 * s.bs;
    s.maxTokens = s.chunked ? s.chunk * 2 + U(8) : 3 * s.maxLen;  // a group of 3 whole prompts fits
    s.spec = U(3) == 0 ? 1 : 0;
    if (!s.hybrid) {
        s.windows = {0};
        s.blocks = {24 + 8 * U(3)};
        s.cpu = 16 + 16 * U(2);
        s.maxPreemptCount = U(3) == 0 ? 1 : 1000;
        return s;
    }
    switch (U(4)) {
        case 0:  // a SLIDING_WINDOW self-attention config, with CPU blocks: one group swaps
            s.windows = {1 + U(3)};
            s.blocks = {24 + 8 * U(3)};
            s.cpu = 16 + 16 * U(2);
            s.maxPreemptCount = U(3) == 0 ? 1 : 1000;
            break;
        case 1:  // TOKEN + SLIDING_WINDOW, equal counts
            s.windows = {0, 1 + U(3)};
            s.blocks = {24 + 8 * U(3), 0};
            s.blocks[1] = s.blocks[0];
            break;
        case 2:  // MindIE's sizing: the window group 12 * max_batch_size + 2 blocks next to the TOKEN one
            s.maxSeqs = 2 + U(2);
            s.windows = {0, 1 + U(3)};
            s.blocks = {24 + 8 * U(3), 12 * s.maxSeqs + 2};
            break;
        default:  // two TOKEN groups of different sizes and a window
            s.windows = {0, 0, 1 + U(3)};
            s.blocks = {24 + 8 * U(3), 40, 16 + U(16)};
            break;
    }
    return s;
}

}  // namespace fcfs_kv

#endif  // KVSHARE_MINDIE_TEST_FCFS_KV_SETUP_H
