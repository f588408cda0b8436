// MindIE's scheduler driving the adapter, checked against a model of the KV cache itself: every
// step the "engine" writes each computed token's KV (a fingerprint of the sequence's LoRA and
// its tokens up to that position: equal content, equal fingerprint) into the slot that the
// block ids from GetBlockIds give it, executes the copies the adapter returned (AppendSlot's
// copy-on-write pairs, then the swap pairs, in MindIE's worker order: router_impl.py runs
// copy_blocks before swap), and then reads back, for every token it computes, every position
// that token's attention reads in every group (full attention: all earlier positions; a window
// of N blocks: the last (N-1)*blockSize + 1), comparing each slot with the fingerprint that
// belongs there. A block released while still read, handed to two sequences of different
// content, shared before its KV was written, or swapped without its content, reads a wrong
// fingerprint; a position whose block is gone is a read of a released block. Both count as
// failures.
//
// The scheduler re-enacts MindIE-LLM's Scheduler / FcfsPolicy at commit 8b4871a, as test_fcfs.cpp
// does, acting on the adapter's answers alone:
//   - without chunked prefill: PREFILL_FIRST, DECODE_FIRST or MIX steps (ApplyToWaitingQueue:
//     recompute guard, GetSeqNumCachedTokens, CanAllocate, budget, Allocate; ApplyToRunningQueue:
//     CanAppendSlot, preemption of the newest group by swap (CanSwapOut twice) or recompute,
//     AppendSlot; ApplyToSwappedQueue when nothing was preempted: CanSwapIn, SwapIn, AppendSlot);
//   - with chunked prefill (ScheduleChunkedPrefill): running, swapped, then waiting, every
//     prefill cut to min(uncached tokens, remaining budget, prefillChunkSize); a running prefill
//     gets AppendSlot every step with no new token while numComputedTokens_ grows by its chunk,
//     and the first chunk of a waiting group counts its cached tokens as computed
//     (ScheduledSequenceGroup's tokenChunkSize_, Scheduler::AccumulateComputedTokens);
//   - groups of one to three sequences with the same prompt (each sequence samples its own
//     tokens), LoRA salts, shared system prompts and multi-turn prompts for prefix hits,
//     speculative slots, recompute and (the block manager) swap preemption;
// then GetBlockIds + AccessAllblocksInSeq for every scheduled sequence, GetCommonComputedBlockIds
// for prefills, MarkBlocksAsComputed, the forward, and a sampled token once a prefill is complete.
//
// Drives the KV-cache-group manager (KvshareHybridBlockManager: composites of TOKEN and
// SLIDING_WINDOW sub-managers, window-only configs, several TOKEN groups of different sizes,
// MindIE's own block-count sizing for window groups: 12 * max_batch_size + 2), each run a seeded
// draw of the geometry, caching on or off, whole or chunked prefills and speculative slots; the
// same engine drives KvshareBlockManager (with swap) every second run. Exceptions out of the adapter,
// wrong reads and reads of released blocks must all be 0, and a manager holds no block once every
// request is gone. Usage: test_fcfs_kv [seed] [runs] [steps] [groups|block|both].
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <string>

#include "fcfs_kv_setup.h"
#include "harness.h"

using namespace harness;
using namespace fcfs_kv;
using kvshare_mindie::KvshareHybridBlockManager;

namespace {

class Engine {
   public:
    Engine(uint64_t seed, const Setup &setup) : rng_(seed), s_(setup) {
        BlockManagerConfig c = Config(s_.bs, s_.blocks[0], s_.cpu, s_.caching, s_.spec);
        if (s_.hybrid) {
            if (s_.windows.size() == 1) {
                if (s_.windows[0] > 0) {
                    c.cacheType = KvCacheType::SLIDING_WINDOW;
                    c.requestBlockWindowSize = s_.windows[0];
                }
            } else {
                for (size_t g = 0; g < s_.windows.size(); ++g) {
                    BlockManagerConfig sub = Config(s_.bs, s_.blocks[g], 0, s_.caching, s_.spec);
                    if (s_.windows[g] > 0) {
                        sub.cacheType = KvCacheType::SLIDING_WINDOW;
                        sub.requestBlockWindowSize = s_.windows[g];
                    }
                    c.subManagers.push_back(sub);
                }
            }
            hybrid_ = std::make_shared<KvshareHybridBlockManager>(c);
            m_ = hybrid_;
            CHECK(hybrid_->WindowBlocks() == s_.windows);
        } else {
            plain_ = std::make_shared<KvshareBlockManager>(c);
            m_ = plain_;
        }
        for (size_t g = 0; g < s_.windows.size(); ++g) {
            npu_.emplace_back(s_.blocks[g] * s_.bs, 0);
        }
        cpu_.assign(s_.cpu * s_.bs, 0);
        for (int i = 0; i < 3; ++i) {
            size_t n = s_.bs * (2 + 2 * static_cast<size_t>(i)) + static_cast<size_t>(i);
            systems_.push_back(Range(10000 * (i + 1), n));
        }
    }

    Counts c;

    void Step() {
        ++c.steps;
        for (size_t i = Uniform(3); i > 0; --i) {
            if (Uniform(2) == 0) {
                NewRequest();
            }
        }
        Budget b{s_.maxTokens, s_.maxSeqs};
        Out o;
        if (s_.chunked) {
            ApplyToRunning(b, o);
            if (o.preempted.empty() && o.swappedOut.empty()) {
                ApplyToSwapped(b, o);
            }
            ApplyToWaiting(b, o);
        } else {
            Mode mode = Mode::DECODE_FIRST;
            size_t draw = Uniform(4);
            if (!waiting_.empty() && draw == 0) {
                mode = Mode::PREFILL_FIRST;
            } else if (draw == 1) {
                mode = Mode::MIX;
            }
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
        }
        Backfill(o);
        // The worker: copy_blocks, then swap (swap-ins listed before swap-outs), then the forward.
        for (const auto &p : o.cow) {
            CopyNpu(p.first, p.second);
        }
        for (const auto &p : o.swapIn) {
            CopyBlock(cpu_, static_cast<size_t>(p.first), npu_[0], static_cast<size_t>(p.second));
        }
        for (const auto &p : o.swapOut) {
            CopyBlock(npu_[0], static_cast<size_t>(p.first), cpu_, static_cast<size_t>(p.second));
        }
        Forward(o.work);
        CheckCaches();
        // Sampling: a sequence whose prompt is computed gets a token (pending until the next
        // AppendSlot); some requests finish.
        for (const Work &w : o.work) {
            w.seq->data_.UpdateNumComputedTokens(w.advance);
            if (w.seq->data_.numComputedTokens_ >= w.seq->GetLen()) {
                w.seq->data_.outputTokenIds.push_back(static_cast<TokenId>(Uniform(50)));
            }
        }
        for (auto it = running_.begin(); it != running_.end();) {
            const SequenceSPtr &s = (*it)->firstSeq;
            if (!s->IsPrefill() && (s->GetLen() >= s_.maxLen || Uniform(12) == 0)) {
                Finish(*it);
                it = running_.erase(it);
            } else {
                ++it;
            }
        }
        CheckCaches();
    }

    void Drain() {
        for (auto *q : {&waiting_, &running_, &swapped_}) {
            for (const auto &g : *q) {
                for (const auto &s : g->seqs_) {
                    m_->Free(s->seqId_);
                }
            }
            q->clear();
        }
        CheckCaches();
        if (hybrid_) {
            for (size_t g = 0; g < s_.blocks.size(); ++g) {
                // Nothing in use but the pages that size a smaller group.
                kvs_group_stats st{};
                CHECK(kvs_cache_group_stats(hybrid_->Cache(), g, &st) == KVS_STATUS_OK);
                CHECK_EQ(st.pool_pages_in_use, static_cast<uint64_t>(hybrid_->PageOffset(g) - 1));
            }
        } else {
            CHECK_EQ(Stats(*plain_).device_pages_in_use, static_cast<uint64_t>(0));
        }
    }

   private:
    struct Out {
        std::vector<SequenceGroupSPtr> prefills, decodes, preempted, swappedOut;
        std::vector<Work> work;
        std::vector<std::pair<BlockId, BlockId>> cow, swapIn, swapOut;
    };

    std::mt19937_64 rng_;
    Setup s_;
    std::shared_ptr<BlockSpaceManager> m_;
    std::shared_ptr<KvshareHybridBlockManager> hybrid_;
    std::shared_ptr<KvshareBlockManager> plain_;
    std::vector<std::vector<uint64_t>> npu_;  // per group: a fingerprint per slot (0: never written)
    std::vector<uint64_t> cpu_;               // the block manager's CPU blocks
    std::vector<std::vector<TokenId>> systems_;
    std::vector<std::vector<TokenId>> history_;
    std::deque<SequenceGroupSPtr> waiting_, running_, swapped_;
    std::map<SequenceId, size_t> slots_;  // token slots the sequence's block tables cover
    SequenceId nextId_ = 1;

    size_t Uniform(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

    template <typename F>
    bool Call(const char *what, F f) {
        try {
            f();
            return true;
        } catch (const std::exception &e) {
            ++c.exceptions;
            if (c.byCall[what]++ < 3) {
                std::fprintf(stderr, "test_fcfs_kv: %s threw: %s\n", what, e.what());
            }
            return false;
        }
    }

    // A check that failed (every kind counts in `violations`, named in `byCall`).
    void Fail(const char *what, const std::string &detail = "") {
        ++c.violations;
        if (c.byCall[what]++ < 3) {
            std::fprintf(stderr, "test_fcfs_kv: step %zu: %s%s\n", c.steps, what, detail.c_str());
        }
    }

    static std::string Where(const Work &w, size_t g, size_t p, const BlockIds &ids, size_t slots) {
        std::string s = " (sequence " + std::to_string(w.seq->seqId_) + ", group " + std::to_string(g) +
                        ", position " + std::to_string(p) + ", computing [" + std::to_string(w.from) + ", " +
                        std::to_string(w.to) + ") of " + std::to_string(w.seq->GetLen()) + ", table slots " +
                        std::to_string(slots) + ", block ids";
        for (BlockId b : ids) {
            s += " " + std::to_string(b);
        }
        return s + ")";
    }

    void NewRequest() {
        std::vector<TokenId> prompt;
        if (!history_.empty() && Uniform(4) == 0) {
            prompt = history_[Uniform(history_.size())];  // a later turn of a finished request
        } else {
            const std::vector<TokenId> &sys = systems_[Uniform(systems_.size())];
            prompt.assign(sys.begin(), sys.begin() + static_cast<std::ptrdiff_t>(1 + Uniform(sys.size())));
        }
        size_t extra = 1 + Uniform(3 * s_.bs);
        for (size_t i = 0; i < extra; ++i) {
            prompt.push_back(static_cast<TokenId>(Uniform(50)));
        }
        HashValue lora = Uniform(4) == 0 ? 7 : 0;
        size_t n = std::min(Uniform(4) == 0 ? 2 + Uniform(2) : 1, s_.maxSeqs);  // the budget's sequences
        // Every group must fit the smallest pool at all (its sequences take a block per prompt
        // position each; a group restarts from its prompt), else MindIE's scheduler throws on NEVER.
        size_t fit = *std::min_element(s_.blocks.begin(), s_.blocks.end()) / n * s_.bs;
        prompt.resize(std::min({prompt.size(), s_.maxLen - 2, fit}));
        std::vector<SequenceSPtr> seqs;
        for (size_t i = 0; i < n; ++i) {
            seqs.push_back(MakeSeq(nextId_++, prompt, lora));
        }
        waiting_.push_back(MakeGroup(seqs));
    }

    static void SetStatus(const SequenceGroupSPtr &g, SequenceStatus st) {
        for (const auto &s : g->seqs_) {
            s->status_ = st;
        }
    }

    // FcfsPolicy::PreemptByRecompute: freed, waiting again, prompt + output recomputed. A group of
    // several sequences starts over from its prompt: Allocate gives every sequence of a group the
    // first one's prompt (MindIE's own manager and KvshareBlockManager fork it), so they must
    // agree.
    void Recompute(const SequenceGroupSPtr &g) {
        for (const auto &s : g->seqs_) {
            m_->Free(s->seqId_);
            slots_.erase(s->seqId_);
            s->data_.numComputedTokens_ = 0;
            s->data_.stage_ = SequenceStage::PREFILL;
            if (g->seqs_.size() > 1) {
                s->data_.outputTokenIds.clear();
            }
        }
        SetStatus(g, SequenceStatus::WAITING);
        ++c.recomputes;
    }

    void Abandon(const SequenceGroupSPtr &g, Out &o) {
        Recompute(g);
        o.preempted.push_back(g);
    }

    void Finish(const SequenceGroupSPtr &g) {
        for (const auto &s : g->seqs_) {
            if (s->GetLen() < s_.maxLen - s_.bs) {
                history_.push_back(s->GetTokenIds());
            }
            m_->Free(s->seqId_);
            slots_.erase(s->seqId_);
            s->status_ = SequenceStatus::FINISH_STOPPED;
        }
        ++c.finished;
    }

    // PolicyHelper::GetNumComputeNewUnCachedAndCachedTokens for one sequence of the group (they
    // are alike while they prefill: the group computes one range), the chunk cut as
    // GetNumComputeChunkSize does.
    std::pair<size_t, size_t> NewTokens(const SequenceGroupSPtr &g, const Budget &b, bool &ok) {
        const SequenceSPtr &s = g->firstSeq;
        ok = true;
        if (!s->IsPrefill()) {
            return {1, 0};
        }
        size_t len = s->GetLen();
        size_t computed = s->data_.numComputedTokens_;
        size_t all = len - computed;
        size_t cached = 0;
        if (s_.caching && !Call("GetSeqNumCachedTokens", [&] { cached = m_->GetSeqNumCachedTokens(s); })) {
            ok = false;
            return {0, 0};
        }
        size_t cachedNew = cached >= computed ? cached - computed : 0;
        size_t uncached = all - std::min(all, cachedNew);
        if (uncached == 0 && cachedNew > 0) {
            uncached = 1;
            cachedNew -= 1;
        }
        if (s_.chunked) {  // each sequence of the group computes the same chunk
            uncached = std::min({uncached, b.Remaining() / g->seqs_.size(), s_.chunk});
        }
        return {uncached, cachedNew};
    }

    void Schedule(const SequenceGroupSPtr &g, size_t uncached, size_t cached, bool fromWaiting, Out &o) {
        for (const auto &s : g->seqs_) {
            size_t from = s->data_.numComputedTokens_ + cached;
            size_t to = s->IsPrefill() ? from + uncached : s->GetLen();
            if (!s->IsPrefill()) {
                from = to - 1;
            }
            // A waiting group's tokenChunkSize_ counts its cached tokens; a running one's does not.
            size_t advance = s->IsPrefill() ? uncached + (fromWaiting ? cached : 0) : 1;
            o.work.push_back({s, from, to, advance});
        }
        const SequenceSPtr &first = g->firstSeq;
        if (first->IsPrefill() && first->data_.numComputedTokens_ + cached + uncached < first->GetLen()) {
            ++c.chunks;
        }
    }

    void ApplyToWaiting(Budget &b, Out &o) {
        while (!waiting_.empty()) {
            SequenceGroupSPtr g = waiting_.front();
            const SequenceSPtr &s = g->firstSeq;
            if (CeilDiv(s->GetLen(), s_.bs) == m_->GetNumFreeNpuBlocks() && !s->data_.outputTokenIds.empty()) {
                break;
            }
            bool ok = true;
            auto [uncached, cached] = NewTokens(g, b, ok);
            if (!ok) {
                break;
            }
            AllocStatus st = AllocStatus::LATER;
            if (!Call("CanAllocate", [&] { st = m_->CanAllocate(g); })) {
                break;
            }
            if (st == AllocStatus::LATER) {
                break;
            }
            if (st == AllocStatus::NEVER) {  // MindIE throws "Prompt sequence too long."
                ++c.exceptions;
                ++c.byCall["CanAllocate NEVER"];
                waiting_.pop_front();
                continue;
            }
            size_t n = g->seqs_.size();
            if (uncached == 0 || !b.CanSchedule(uncached * n, n)) {
                break;
            }
            waiting_.pop_front();
            bool allocated = false;
            if (!Call("Allocate", [&] { allocated = m_->Allocate(g); }) || !allocated) {
                if (!allocated) {
                    Fail("Allocate returned false");
                }
                waiting_.push_front(g);
                break;
            }
            SetStatus(g, SequenceStatus::RUNNING);
            for (const auto &q : g->seqs_) {
                slots_[q->seqId_] = q->GetLen();
                size_t matched = 0;
                if (Call("GetNumCachedTokens", [&] { matched = m_->GetNumCachedTokens(q); }) && matched != cached) {
                    Fail("GetNumCachedTokens after Allocate differs from the probe before it");
                }
            }
            c.hitTokens += cached * n;
            ++c.admitted;
            c.seqsAdmitted += n;
            o.prefills.push_back(g);
            Schedule(g, uncached, cached, true, o);
            b.Add(uncached * n, n);
        }
    }

    bool AppendSlots(const SequenceGroupSPtr &g, Out &o) {
        for (const auto &s : g->GetSequences(SequenceStatus::RUNNING)) {
            std::vector<std::pair<BlockId, BlockId>> pairs;
            if (!Call("AppendSlot", [&] { pairs = m_->AppendSlot(s); })) {
                return false;
            }
            o.cow.insert(o.cow.end(), pairs.begin(), pairs.end());
            slots_[s->seqId_] = s->GetLen() + s_.spec;
            ++c.appends;
        }
        return true;
    }

    void ApplyToRunning(Budget &b, Out &o) {
        size_t swapNum = 0;
        while (!running_.empty()) {
            SequenceGroupSPtr g = running_.front();
            bool ok = true;
            auto [uncached, cached] = NewTokens(g, b, ok);
            size_t n = g->seqs_.size();
            if (!ok || !b.CanSchedule(uncached * n, n)) {
                break;
            }
            running_.pop_front();
            bool canAppend = true;
            for (;;) {
                bool can = false;
                if (!Call("CanAppendSlot", [&] { can = m_->CanAppendSlot(g); })) {
                    can = false;
                }
                if (can) {
                    break;
                }
                SequenceGroupSPtr victim;
                if (!running_.empty()) {
                    victim = running_.back();
                    running_.pop_back();
                } else {
                    victim = g;
                    canAppend = false;
                }
                Preempt(victim, swapNum, o);
                if (!canAppend) {
                    break;
                }
            }
            if (!canAppend) {
                continue;
            }
            if (!AppendSlots(g, o)) {
                Abandon(g, o);
                continue;
            }
            if (g->firstSeq->IsPrefill()) {
                o.prefills.push_back(g);
            } else {
                o.decodes.push_back(g);
            }
            Schedule(g, uncached, cached, false, o);
            b.Add(uncached * n, n);
        }
    }

    void Preempt(const SequenceGroupSPtr &victim, size_t &swapNum, Out &o) {
        bool swap = false;
        if (swapNum < s_.maxPreemptCount) {
            Call("CanSwapOut", [&] { swap = m_->CanSwapOut(victim); });
        }
        if (!swap) {
            Recompute(victim);
            o.preempted.push_back(victim);
            return;
        }
        ++swapNum;
        bool again = false;  // PolicyHelper::SwapOut asks once more, then swaps
        Call("CanSwapOut", [&] { again = m_->CanSwapOut(victim); });
        std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> pairs;
        if (again && Call("SwapOut", [&] { pairs = m_->SwapOut(victim); })) {
            SetStatus(victim, SequenceStatus::SWAPPED);
            o.swapOut.insert(o.swapOut.end(), pairs.begin(), pairs.end());
            ++c.swapOuts;
            o.swappedOut.push_back(victim);
            return;
        }
        if (!again) {  // MindIE throws "Aborted due to the lack of CPU swap space."
            ++c.exceptions;
            ++c.byCall["SwapOut (no CPU space)"];
        }
        Abandon(victim, o);
    }

    void ApplyToSwapped(Budget &b, Out &o) {
        while (!swapped_.empty()) {
            SequenceGroupSPtr g = swapped_.front();
            AllocStatus st = AllocStatus::LATER;
            if (!Call("CanSwapIn", [&] { st = m_->CanSwapIn(g, 0); })) {
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
            size_t n = g->seqs_.size();
            bool ok = true;
            auto [uncached, cached] = NewTokens(g, b, ok);
            if (!ok || uncached == 0 || !b.CanSchedule(uncached * n, n)) {
                break;
            }
            swapped_.pop_front();
            std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> pairs;
            if (!Call("SwapIn", [&] { pairs = m_->SwapIn(g); })) {
                swapped_.push_front(g);
                break;
            }
            o.swapIn.insert(o.swapIn.end(), pairs.begin(), pairs.end());
            SetStatus(g, SequenceStatus::RUNNING);
            ++c.swapIns;
            if (!AppendSlots(g, o)) {
                Abandon(g, o);
                continue;
            }
            if (g->firstSeq->IsPrefill()) {
                o.prefills.push_back(g);
            } else {
                o.decodes.push_back(g);
            }
            Schedule(g, uncached, cached, false, o);
            b.Add(uncached * n, n);
        }
    }

    // Scheduler::BackfillConcurrentQueue, then the metadata for the worker.
    void Backfill(Out &o) {
        for (const auto &g : o.preempted) {
            waiting_.push_back(g);
        }
        std::vector<SequenceGroupSPtr> scheduled = o.decodes;
        std::sort(scheduled.begin(), scheduled.end(), [](const SequenceGroupSPtr &x, const SequenceGroupSPtr &y) {
            return x->firstSeq->seqId_ < y->firstSeq->seqId_;
        });
        scheduled.insert(scheduled.end(), o.prefills.begin(), o.prefills.end());
        std::deque<SequenceGroupSPtr> leftovers;
        leftovers.swap(running_);
        for (const auto &g : scheduled) {
            running_.push_back(g);
        }
        for (auto it = leftovers.rbegin(); it != leftovers.rend(); ++it) {
            running_.push_front(*it);
        }
        for (const auto &g : o.swappedOut) {
            swapped_.push_back(g);
        }
        for (const auto &g : scheduled) {
            for (const auto &s : g->seqs_) {
                Call("AccessAllblocksInSeq", [&] { m_->AccessAllblocksInSeq(s, static_cast<float>(c.steps)); });
            }
        }
        for (const auto &g : o.prefills) {
            Call("GetCommonComputedBlockIds", [&] { (void)m_->GetCommonComputedBlockIds(g->seqs_); });
        }
        m_->MarkBlocksAsComputed();
    }

    static size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

    void CopyBlock(const std::vector<uint64_t> &from, size_t src, std::vector<uint64_t> &to, size_t dst) {
        CHECK((src + 1) * s_.bs <= from.size() && (dst + 1) * s_.bs <= to.size());
        std::copy(from.begin() + static_cast<std::ptrdiff_t>(src * s_.bs),
                  from.begin() + static_cast<std::ptrdiff_t>((src + 1) * s_.bs),
                  to.begin() + static_cast<std::ptrdiff_t>(dst * s_.bs));
        ++c.copies;
    }

    void CopyNpu(BlockId src, BlockId dst) {
        CopyBlock(npu_[0], static_cast<size_t>(src), npu_[0], static_cast<size_t>(dst));
    }

    // The fingerprint of position p of a sequence: its LoRA and tokens [0, p].
    static std::vector<uint64_t> Fingerprints(const Sequence &s) {
        std::vector<uint64_t> fp;
        uint64_t h = 0x9e3779b97f4a7c15ULL ^ (s.hashValue_ * 0xff51afd7ed558ccdULL);
        for (TokenId t : s.GetTokenIds()) {
            h ^= static_cast<uint64_t>(t) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
            h *= 0xc4ceb9fe1a85ec53ULL;
            fp.push_back(h | 1);
        }
        return fp;
    }

    // The slot of position p in group g of a sequence whose block ids are `ids`, or SIZE_MAX when
    // its block is released (a window group's list holds the newest blocks of a table of
    // cdiv(slots, bs) positions).
    size_t Slot(size_t g, const BlockIds &ids, size_t slots, size_t p) const {
        size_t positions = CeilDiv(slots, s_.bs);
        size_t first = positions >= ids.size() ? positions - ids.size() : 0;
        size_t pos = p / s_.bs;
        if (pos < first || pos - first >= ids.size()) {
            return SIZE_MAX;
        }
        BlockId b = ids[pos - first];
        if (b < 0 || static_cast<size_t>(b) >= s_.blocks[g]) {
            return SIZE_MAX;
        }
        return static_cast<size_t>(b) * s_.bs + p % s_.bs;
    }

    void Forward(const std::vector<Work> &work) {
        struct View {
            const Work *w;
            std::vector<BlockIds> ids;
            std::vector<uint64_t> fp;
            size_t slots;
        };
        std::vector<View> views;
        for (const Work &w : work) {
            View v{&w, {}, Fingerprints(*w.seq), slots_.at(w.seq->seqId_)};
            if (!Call("GetBlockIds", [&] { v.ids = m_->GetBlockIds(w.seq->seqId_); })) {
                continue;
            }
            if (v.ids.size() != s_.windows.size()) {
                Fail("GetBlockIds has a list per group");
                continue;
            }
            for (size_t g = 0; g < s_.windows.size(); ++g) {
                if (s_.windows[g] == 0 && v.ids[g].size() != CeilDiv(v.slots, s_.bs)) {
                    Fail("a TOKEN group's list is its whole table");
                }
                // Decoding, a window group holds N blocks (one more for speculative slots).
                if (s_.windows[g] > 0 && !w.seq->IsPrefill() && w.seq->GetLen() > s_.windows[g] * s_.bs &&
                    v.ids[g].size() > s_.windows[g] + (s_.spec > 0 ? 1 : 0)) {
                    Fail("a decoding sequence holds more window blocks than requestBlockWindowSize");
                }
            }
            views.push_back(std::move(v));
        }
        // One forward: every layer writes the step's KV before any attention reads.
        for (const View &v : views) {
            for (size_t p = v.w->from; p < v.w->to; ++p) {
                for (size_t g = 0; g < s_.windows.size(); ++g) {
                    size_t slot = Slot(g, v.ids[g], v.slots, p);
                    if (slot == SIZE_MAX) {
                        ++c.releasedReads;
                        Fail("a computed token's block is not in the table", Where(*v.w, g, p, v.ids[g], v.slots));
                        continue;
                    }
                    npu_[g][slot] = v.fp[p];
                    ++c.written;
                }
            }
        }
        for (const View &v : views) {
            for (size_t q = v.w->from; q < v.w->to; ++q) {
                for (size_t g = 0; g < s_.windows.size(); ++g) {
                    size_t window = s_.windows[g] == 0 ? q + 1 : (s_.windows[g] - 1) * s_.bs + 1;
                    for (size_t p = q + 1 > window ? q + 1 - window : 0; p <= q; ++p) {
                        size_t slot = Slot(g, v.ids[g], v.slots, p);
                        ++c.read;
                        if (slot == SIZE_MAX) {
                            ++c.releasedReads;
                            Fail("attention reads a released block", Where(*v.w, g, p, v.ids[g], v.slots));
                        } else if (npu_[g][slot] != v.fp[p]) {
                            ++c.wrongReads;
                            Fail("attention reads KV that is not the sequence's", Where(*v.w, g, p, v.ids[g], v.slots));
                        }
                    }
                }
            }
        }
    }

    void CheckCaches() {
        if (hybrid_) {
            kvs_status st = kvs_cache_check(hybrid_->Cache());
            if (st != KVS_STATUS_OK) {
                std::fprintf(stderr, "kvs_cache_check: %s: %s\n", kvs_status_str(st), kvs_last_error_message());
                std::exit(1);
            }
        } else {
            CheckKvs(*plain_);
        }
    }
};

}  // namespace

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    uint64_t seed0 = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
    size_t runs = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 40;
    size_t steps = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 300;
    // Which manager: "groups" (KvshareHybridBlockManager), "block" (KvshareBlockManager) or
    // "both" (the default: every second run the block manager).
    std::string which = argc > 4 ? argv[4] : "both";
    if (which != "groups" && which != "block" && which != "both") {
        std::fprintf(stderr, "usage: test_fcfs_kv [seed] [runs] [steps] [groups|block|both]\n");
        return 2;
    }
    Counts total;
    size_t chunkedRuns = 0, groupRuns = 0;
    for (uint64_t seed = seed0; seed < seed0 + runs; ++seed) {
        bool block = which == "block" || (which == "both" && seed % 2 == 0);
        Setup setup = Draw(seed, block);
        Engine e(seed, setup);
        for (size_t i = 0; i < steps; ++i) {
            e.Step();
        }
        e.Drain();
        const Counts &c = e.c;
        std::printf(
            "seed %llu, %s: %zu admitted (%zu sequences, %zu hit tokens), %zu chunks, %zu AppendSlot, %zu SwapOut, "
            "%zu SwapIn, %zu recompute, %zu finished; %zu KV writes, %zu reads, %zu copies; %zu exceptions, "
            "%zu wrong reads, %zu released reads, %zu failed checks\n",
            static_cast<unsigned long long>(seed), setup.Describe().c_str(), c.admitted, c.seqsAdmitted, c.hitTokens,
            c.chunks, c.appends, c.swapOuts, c.swapIns, c.recomputes, c.finished, c.written, c.read, c.copies,
            c.exceptions, c.wrongReads, c.releasedReads, c.violations);
        for (const auto &kv : c.byCall) {
            std::printf("  %s: %zu\n", kv.first.c_str(), kv.second);
        }
        total.Add(c);
        chunkedRuns += setup.chunked;
        groupRuns += setup.hybrid;
        CHECK(c.finished > 0);
    }
    std::printf(
        "total: %zu runs (%zu of KV-cache groups, %zu with chunked prefill), %zu steps, %zu admitted (%zu sequences, "
        "%zu hit tokens), %zu chunks, %zu AppendSlot, %zu SwapOut, %zu SwapIn, %zu recompute; %zu KV writes, %zu "
        "reads checked, %zu copies; %zu exceptions, %zu wrong reads, %zu released reads, %zu failed checks\n",
        static_cast<size_t>(runs), groupRuns, chunkedRuns, total.steps, total.admitted, total.seqsAdmitted,
        total.hitTokens, total.chunks, total.appends, total.swapOuts, total.swapIns, total.recomputes, total.written,
        total.read, total.copies, total.exceptions, total.wrongReads, total.releasedReads, total.violations);
    CHECK_EQ(total.exceptions, static_cast<size_t>(0));
    CHECK_EQ(total.wrongReads, static_cast<size_t>(0));
    CHECK_EQ(total.releasedReads, static_cast<size_t>(0));
    CHECK_EQ(total.violations, static_cast<size_t>(0));
    std::printf("test_fcfs_kv: all passed\n");
    return 0;
}
