// MindIE's scheduler call order, driven by the adapter's own answers. Each step re-enacts what
// MindIE-LLM's Scheduler and FcfsPolicy (src/scheduler/policy/fcfs_policy.cpp, policy_helper.cpp at
// commit 8b4871a) ask the block manager, in their order, and acts on the adapter's answers alone
// (no model decides anything here):
//
//   PREFILL_FIRST  ApplyToWaitingQueue: per waiting group, the recompute guard
//                  (ceil(len/bs) == free blocks with output tokens: stop), GetSeqNumCachedTokens for
//                  the budget, CanAllocate (LATER: stop; NEVER: MindIE throws), the token/seq
//                  budget, then Allocate.
//   DECODE_FIRST   ApplyToRunningQueue: per running group, the budget, then while !CanAppendSlot
//                  preempt the newest running group (or the group itself when none is left):
//                  SWAP when swaps this step < maxPreemptCount and CanSwapOut (PolicyHelper::SwapOut
//                  asks CanSwapOut again, then SwapOut), else RECOMPUTE (Free, back to waiting);
//                  then AppendSlot for each running sequence. Then, only when nothing was
//                  preempted, ApplyToSwappedQueue: per swapped group CanSwapIn(group, 0) (LATER: stop;
//                  NEVER: MindIE throws), the budget, SwapIn, and at once AppendSlot for the token
//                  the sequence generated before it was preempted -- with no CanAppendSlot between.
//   MIX            running, swapped (when nothing was preempted), then waiting, in one step.
//
// After the policy: the queues are rebuilt as Scheduler::BackfillConcurrentQueue does (recompute
// victims to the back of waiting, scheduled decodes sorted by id then prefills to running, swapped
// out groups to swapped, leftovers to the front of their queue); for every scheduled sequence
// GetBlockIds and AccessAllblocksInSeq, for prefills GetCommonComputedBlockIds; then
// MarkBlocksAsComputed. The "model" then computes every scheduled sequence and samples one token,
// which stays pending (not in the block table) until the next step appends it, as in MindIE.
//
// A wrong "yes" from a Can* method surfaces as the exception MindIE's scheduler would see from the
// call that follows; every exception out of the adapter is counted (and the group recomputed so the
// run goes on). The test requires zero, and that kvs_cache_check stays clean and every scheduled
// sequence's block table covers its tokens. Usage: test_fcfs [seed] [steps].
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <string>

#include "harness.h"

using namespace harness;

namespace {

enum class Mode { PREFILL_FIRST, DECODE_FIRST, MIX };

struct Budget {
    size_t maxTokens, maxSeqs, tokens = 0, seqs = 0;
    bool CanSchedule(size_t t, size_t s) const { return tokens + t <= maxTokens && seqs + s <= maxSeqs; }
    void Add(size_t t, size_t s) {
        tokens += t;
        seqs += s;
    }
};

struct Counts {
    size_t steps[3] = {0, 0, 0};
    size_t admitted = 0, appends = 0, swapIns = 0, appendsAfterSwapIn = 0, swapOuts = 0, recomputes = 0;
    size_t finished = 0, exceptions = 0;
    std::map<std::string, size_t> byCall;
};

struct Fcfs {
    std::mt19937_64 rng;
    size_t ps, maxPreemptCount, maxLen;
    KvshareBlockManager m;
    std::vector<std::vector<TokenId>> systems;
    std::deque<SequenceGroupSPtr> waiting, running, swapped;
    SequenceId nextId = 1;
    Counts c;

    Fcfs(uint64_t seed, size_t ps_, size_t npu, size_t cpu, size_t spec, size_t maxPreempt)
        : rng(seed), ps(ps_), maxPreemptCount(maxPreempt), maxLen(ps_ * 12), m(Config(ps_, npu, cpu, true, spec)) {
        for (int i = 0; i < 3; ++i) {
            systems.push_back(Range(10000 * (i + 1), ps * (1 + static_cast<size_t>(i)) + static_cast<size_t>(i)));
        }
    }

    size_t Uniform(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

    // Runs one block-manager call; an exception is counted under `what` and reported as false.
    template <typename F>
    bool Call(const char *what, F f) {
        try {
            f();
            return true;
        } catch (const std::exception &e) {
            ++c.exceptions;
            if (c.byCall[what]++ < 3) {
                std::fprintf(stderr, "test_fcfs: %s threw: %s\n", what, e.what());
            }
            return false;
        }
    }

    void NewRequest() {
        std::vector<TokenId> prompt = systems[Uniform(systems.size())];
        size_t extra = 1 + Uniform(2 * ps);
        for (size_t i = 0; i < extra; ++i) {
            prompt.push_back(static_cast<TokenId>(Uniform(50)));
        }
        auto s = MakeSeq(nextId++, prompt, Uniform(4) == 0 ? 7 : 0);
        waiting.push_back(MakeGroup({s}));
    }

    // FcfsPolicy::PreemptByRecompute: the sequence waits again with prompt + output recomputed.
    void Recompute(const SequenceGroupSPtr &g) {
        for (const auto &s : g->seqs_) {
            s->status_ = SequenceStatus::WAITING;
            m.Free(s->seqId_);
            s->data_.numComputedTokens_ = 0;
            s->data_.stage_ = SequenceStage::PREFILL;
        }
        ++c.recomputes;
    }

    // A group whose call threw: recompute it so the run goes on (the exception is counted).
    void Abandon(const SequenceGroupSPtr &g, std::vector<SequenceGroupSPtr> &preempted) {
        Recompute(g);
        preempted.push_back(g);
    }

    static size_t NewTokens(const SequenceSPtr &s, size_t cached) {
        size_t len = s->GetLen();
        size_t fresh = len - s->data_.numComputedTokens_;
        size_t uncached = cached >= fresh ? 0 : fresh - cached;
        return uncached == 0 && cached > 0 ? 1 : uncached;
    }

    struct Out {
        std::vector<SequenceGroupSPtr> prefills, decodes, preempted, swappedOut;
    };

    void ApplyToWaiting(Budget &b, Out &o) {
        while (!waiting.empty()) {
            SequenceGroupSPtr g = waiting.front();
            const SequenceSPtr &s = g->firstSeq;
            if (CeilDiv(s->GetLen(), ps) == m.GetNumFreeNpuBlocks() && !s->data_.outputTokenIds.empty()) {
                break;
            }
            size_t cached = 0;
            if (!Call("GetSeqNumCachedTokens", [&] { cached = m.GetSeqNumCachedTokens(s); })) {
                break;
            }
            size_t uncached = NewTokens(s, cached);
            AllocStatus st = AllocStatus::LATER;
            if (!Call("CanAllocate", [&] { st = m.CanAllocate(g); })) {
                break;
            }
            if (st == AllocStatus::LATER) {
                break;
            }
            if (st == AllocStatus::NEVER) {  // MindIE throws "Prompt sequence too long."
                ++c.exceptions;
                ++c.byCall["CanAllocate NEVER"];
                waiting.pop_front();
                continue;
            }
            if (uncached == 0 || !b.CanSchedule(uncached, 1)) {
                break;
            }
            waiting.pop_front();
            if (!Call("Allocate", [&] { CHECK(m.Allocate(g)); })) {
                waiting.push_front(g);
                break;
            }
            s->status_ = SequenceStatus::RUNNING;
            ++c.admitted;
            o.prefills.push_back(g);
            b.Add(uncached, 1);
        }
    }

    bool AppendSlots(const SequenceGroupSPtr &g) {
        for (const auto &s : g->GetSequences(SequenceStatus::RUNNING)) {
            if (!Call("AppendSlot", [&] { (void)m.AppendSlot(s); })) {
                return false;
            }
            ++c.appends;
        }
        return true;
    }

    void ApplyToRunning(Budget &b, Out &o) {
        size_t swapNum = 0;
        while (!running.empty()) {
            SequenceGroupSPtr g = running.front();
            if (!b.CanSchedule(1, 1)) {
                break;
            }
            running.pop_front();
            bool canAppend = true;
            for (;;) {
                bool can = false;
                if (!Call("CanAppendSlot", [&] { can = m.CanAppendSlot(g); })) {
                    can = false;
                }
                if (can) {
                    break;
                }
                SequenceGroupSPtr victim;
                if (!running.empty()) {
                    victim = running.back();
                    running.pop_back();
                } else {
                    victim = g;
                    canAppend = false;
                }
                bool swap = false;
                if (swapNum < maxPreemptCount) {
                    Call("CanSwapOut", [&] { swap = m.CanSwapOut(victim); });
                }
                if (swap) {
                    ++swapNum;
                    bool again = false;  // PolicyHelper::SwapOut asks once more, then swaps
                    Call("CanSwapOut", [&] { again = m.CanSwapOut(victim); });
                    if (again && Call("SwapOut", [&] { (void)m.SwapOut(victim); })) {
                        victim->firstSeq->status_ = SequenceStatus::SWAPPED;
                        ++c.swapOuts;
                        o.swappedOut.push_back(victim);
                    } else {
                        if (!again) {  // MindIE throws "Aborted due to the lack of CPU swap space."
                            ++c.exceptions;
                            ++c.byCall["SwapOut (no CPU space)"];
                        }
                        Abandon(victim, o.preempted);
                    }
                } else {
                    Recompute(victim);
                    o.preempted.push_back(victim);
                }
                if (!canAppend) {
                    break;
                }
            }
            if (!canAppend) {
                continue;
            }
            if (!AppendSlots(g)) {
                Abandon(g, o.preempted);
                continue;
            }
            o.decodes.push_back(g);
            b.Add(1, 1);
        }
    }

    void ApplyToSwapped(Budget &b, Out &o) {
        while (!swapped.empty()) {
            SequenceGroupSPtr g = swapped.front();
            AllocStatus st = AllocStatus::LATER;
            if (!Call("CanSwapIn", [&] { st = m.CanSwapIn(g, 0); })) {
                break;
            }
            if (st == AllocStatus::LATER) {
                break;
            }
            if (st == AllocStatus::NEVER) {  // MindIE throws "Sequence too long."
                ++c.exceptions;
                ++c.byCall["CanSwapIn NEVER"];
                break;
            }
            if (!b.CanSchedule(1, 1)) {
                break;
            }
            swapped.pop_front();
            if (!Call("SwapIn", [&] { (void)m.SwapIn(g); })) {
                swapped.push_front(g);
                break;
            }
            g->firstSeq->status_ = SequenceStatus::RUNNING;
            ++c.swapIns;
            if (!AppendSlots(g)) {
                ++c.byCall["AppendSlot after SwapIn"];
                Abandon(g, o.preempted);
                continue;
            }
            ++c.appendsAfterSwapIn;
            o.decodes.push_back(g);
            b.Add(1, 1);
        }
    }

    void Step() {
        for (size_t i = Uniform(3); i > 0; --i) {
            if (Uniform(2) == 0) {
                NewRequest();
            }
        }
        Mode mode = Mode::DECODE_FIRST;
        size_t draw = Uniform(4);
        if (!waiting.empty() && draw == 0) {
            mode = Mode::PREFILL_FIRST;
        } else if (draw == 1) {
            mode = Mode::MIX;
        }
        ++c.steps[static_cast<int>(mode)];
        Budget b{8 * ps, 6};
        Out o;
        // The policy works on the queues' contents; what it leaves goes back to the front.
        if (mode == Mode::PREFILL_FIRST) {
            ApplyToWaiting(b, o);
        } else {
            ApplyToRunning(b, o);
            if (o.preempted.empty() && o.swappedOut.empty()) {
                ApplyToSwapped(b, o);
            }
            if (mode == Mode::MIX) {
                ApplyToWaiting(b, o);
            }
        }
        // Scheduler::BackfillConcurrentQueue.
        for (const auto &g : o.preempted) {
            waiting.push_back(g);
        }
        std::sort(o.decodes.begin(), o.decodes.end(),
                  [](const SequenceGroupSPtr &x, const SequenceGroupSPtr &y) {
                      return x->firstSeq->seqId_ < y->firstSeq->seqId_;
                  });
        std::vector<SequenceGroupSPtr> scheduled = o.decodes;
        scheduled.insert(scheduled.end(), o.prefills.begin(), o.prefills.end());
        std::deque<SequenceGroupSPtr> leftovers;
        leftovers.swap(running);
        for (const auto &g : scheduled) {
            running.push_back(g);
        }
        for (auto it = leftovers.rbegin(); it != leftovers.rend(); ++it) {
            running.push_front(*it);
        }
        for (const auto &g : o.swappedOut) {
            swapped.push_back(g);
        }
        // Metadata for the model: block tables, LRU access times, computed blocks of prefills.
        for (const auto &g : scheduled) {
            for (const auto &s : g->seqs_) {
                BlockIds ids;
                if (Call("GetBlockIds", [&] { ids = m.GetBlockIds(s->seqId_).at(0); })) {
                    CHECK(ids.size() * ps >= s->GetLen());
                }
                Call("AccessAllblocksInSeq", [&] { m.AccessAllblocksInSeq(s, static_cast<float>(c.appends)); });
            }
        }
        for (const auto &g : o.prefills) {
            Call("GetCommonComputedBlockIds", [&] { (void)m.GetCommonComputedBlockIds(g->seqs_); });
        }
        m.MarkBlocksAsComputed();
        CheckKvs(m);
        // The model runs every scheduled sequence and samples a token (pending until the next
        // step's AppendSlot); some requests finish.
        for (const auto &g : scheduled) {
            for (const auto &s : g->seqs_) {
                s->data_.UpdateNumComputedTokens(s->GetLen() - s->data_.numComputedTokens_);
                s->data_.outputTokenIds.push_back(static_cast<TokenId>(Uniform(50)));
            }
        }
        for (auto it = running.begin(); it != running.end();) {
            const SequenceSPtr &s = (*it)->firstSeq;
            if (!s->IsPrefill() && (s->GetLen() >= maxLen || Uniform(16) == 0)) {
                m.Free(s->seqId_);
                s->status_ = SequenceStatus::FINISH_STOPPED;
                ++c.finished;
                it = running.erase(it);
            } else {
                ++it;
            }
        }
        CheckKvs(m);
    }

    static size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }
};

}  // namespace

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    uint64_t seed0 = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
    size_t steps = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1000;
    Counts total;
    for (uint64_t seed = seed0; seed < seed0 + 6; ++seed) {
        size_t npu = 24 + 8 * (seed % 3);
        size_t cpu = 16 + 16 * (seed % 2);
        size_t spec = seed % 2;
        size_t maxPreempt = seed % 3 == 0 ? 1 : 1000;
        Fcfs f(seed, 4, npu, cpu, spec, maxPreempt);
        for (size_t i = 0; i < steps; ++i) {
            f.Step();
        }
        const Counts &c = f.c;
        std::printf(
            "seed %llu (npu %zu, cpu %zu, spec %zu, maxPreemptCount %zu): %zu/%zu/%zu prefill/decode/mix steps, "
            "%zu admitted, %zu AppendSlot, %zu SwapIn (%zu AppendSlot right after), %zu SwapOut, %zu recompute, "
            "%zu finished, hit rate %.3f, exceptions %zu\n",
            static_cast<unsigned long long>(seed), npu, cpu, spec, maxPreempt, c.steps[0], c.steps[1], c.steps[2],
            c.admitted, c.appends, c.swapIns, c.appendsAfterSwapIn, c.swapOuts, c.recomputes, c.finished,
            static_cast<double>(f.m.GetPrefixCacheHitRate()), c.exceptions);
        for (const auto &kv : c.byCall) {
            std::printf("  %s: %zu\n", kv.first.c_str(), kv.second);
        }
        total.admitted += c.admitted;
        total.appends += c.appends;
        total.swapIns += c.swapIns;
        total.appendsAfterSwapIn += c.appendsAfterSwapIn;
        total.swapOuts += c.swapOuts;
        total.recomputes += c.recomputes;
        total.finished += c.finished;
        total.exceptions += c.exceptions;
        CHECK(c.finished > 0);
        CHECK(c.swapIns > 0);
    }
    std::printf(
        "total: %zu admitted, %zu AppendSlot, %zu SwapIn, %zu AppendSlot right after SwapIn, %zu SwapOut, %zu "
        "recompute, %zu finished, %zu exceptions\n",
        total.admitted, total.appends, total.swapIns, total.appendsAfterSwapIn, total.swapOuts, total.recomputes,
        total.finished, total.exceptions);
    CHECK_EQ(total.exceptions, static_cast<size_t>(0));
    std::printf("test_fcfs: all passed\n");
    return 0;
}
