// Test harness for the kvshare MindIE adapter: the comparison of the adapter with the model and
// the simulated MindIE scheduler. The checks and builders are in harness_base.h; the model, an
// independent, deliberately simple account of the block state the adapter must produce, in
// harness_model.h.
//
// The model knows nothing about kvshare's code: it keeps its own blocks (refcount, registered),
// a map from prefix keys to blocks, the cached blocks in least-recently-released order (the
// documented eviction order: free blocks first, then the cached block released longest ago), and
// per sequence the list of its blocks. After every step the tests
// compare it with what the adapter reports through MindIE's interface: free NPU/CPU block counts,
// block-table lengths, which positions of which sequences share a block (a bijection between
// model blocks and adapter block ids), cached and registered counts, copy-on-write and swap pairs,
// and kvshare's own invariant checker.
#ifndef KVSHARE_MINDIE_TEST_HARNESS_H
#define KVSHARE_MINDIE_TEST_HARNESS_H

#include "harness_model.h"

namespace harness {

// Compares the adapter with the model: counts, block tables and sharing structure, kvshare's
// invariants. Returns the model-block -> adapter-id map of device blocks.
inline std::map<int, BlockId> Compare(KvshareBlockManager &m, const Model &model, size_t npu, size_t cpu) {
    CheckKvs(m);
    CHECK_EQ(m.GetNumFreeNpuBlocks(), model.FreeNpu());
    CHECK_EQ(m.GetNumFreeCpuBlocks(), model.FreeCpu());
    kvs_stats st = Stats(m);
    CHECK_EQ(st.device_pages_cached, static_cast<uint64_t>(model.Cached()));
    CHECK_EQ(st.index_pages, static_cast<uint64_t>(model.Registered()));
    CHECK_EQ(st.num_seqs, static_cast<uint64_t>(model.Seqs().size()));
    CHECK_EQ(st.evictions, static_cast<uint64_t>(model.Evictions()));
    std::map<int, BlockId> fwd;
    std::map<BlockId, int> back;
    std::map<int, BlockId> hfwd;
    std::map<BlockId, int> hback;
    for (const auto &kv : model.Seqs()) {
        std::vector<BlockIds> tables = m.GetBlockIds(kv.first);
        CHECK_EQ(tables.size(), static_cast<size_t>(1));
        const BlockIds &ids = tables[0];
        if (kv.second.onHost) {
            // Which positions share a host block: a bijection, as for NPU blocks.
            CHECK_EQ(ids.size(), kv.second.host.size());
            for (size_t j = 0; j < ids.size(); ++j) {
                CHECK(ids[j] >= static_cast<BlockId>(npu) && ids[j] < static_cast<BlockId>(npu + cpu));
                int b = kv.second.host[j];
                auto f = hfwd.find(b);
                if (f == hfwd.end()) {
                    CHECK(hback.count(ids[j]) == 0);
                    hfwd[b] = ids[j];
                    hback[ids[j]] = b;
                } else {
                    CHECK_EQ(f->second, ids[j]);
                }
            }
            continue;
        }
        CHECK_EQ(ids.size(), kv.second.blocks.size());
        for (size_t j = 0; j < ids.size(); ++j) {
            CHECK(ids[j] >= 0 && ids[j] < static_cast<BlockId>(npu));
            int b = kv.second.blocks[j];
            auto f = fwd.find(b);
            if (f == fwd.end()) {
                CHECK(back.count(ids[j]) == 0);  // two model blocks on one adapter block
                fwd[b] = ids[j];
                back[ids[j]] = b;
            } else {
                CHECK_EQ(f->second, ids[j]);  // one model block on two adapter blocks
            }
        }
    }
    return fwd;
}

// Drives the adapter the way MindIE's scheduler does and the model alongside it, comparing them
// after every call.
struct Sim {
    size_t ps, npu, cpu, spec;
    KvshareBlockManager m;
    Model model;
    std::map<SequenceId, std::weak_ptr<Sequence>> live;  // what the adapter tracks

    Sim(size_t ps_, size_t npu_, size_t cpu_, bool caching, size_t spec = 0)
        : ps(ps_), npu(npu_), cpu(cpu_), spec(spec), m(Config(ps_, npu_, cpu_, caching, spec)), model(ps_, npu_, cpu_, caching, spec) {}

    std::map<int, BlockId> Check() { return Compare(m, model, npu, cpu); }

    // fcfs admission: CanAllocate, then Allocate; false (and nothing changed) when it must wait.
    bool Admit(const SequenceGroupSPtr &g) {
        AllocStatus st = m.CanAllocate(g);
        if (st != AllocStatus::OK) {
            Check();
            return false;
        }
        const SequenceSPtr &first = g->firstSeq;
        CHECK(model.Allocate(first->seqId_, first->GetTokenIds(), first->hashValue_));
        model.SetComputed(first->seqId_, std::min(first->data_.numComputedTokens_, first->GetLen()));
        CHECK(m.Allocate(g));
        for (size_t i = 1; i < g->seqs_.size(); ++i) {
            model.Fork(first->seqId_, g->seqs_[i]->seqId_);
        }
        for (const auto &s : g->seqs_) {
            live[s->seqId_] = s;
            s->status_ = SequenceStatus::RUNNING;
            CHECK_EQ(m.GetNumCachedTokens(s), model.At(s->seqId_).matched);
        }
        Check();
        return true;
    }

    // The prefill of `seq` ran: it moves to decode.
    static void Prefilled(const SequenceSPtr &seq) {
        seq->data_.UpdateNumComputedTokens(seq->GetLen() - seq->data_.numComputedTokens_);
    }

    // The step that computed `seq`'s scheduled tokens ran, and the next one gives it AppendSlot
    // with no new token (as MindIE does for a running prefill): its computed tokens are reported,
    // their full blocks become prefix hits.
    void Computed(const SequenceSPtr &seq) {
        Prefilled(seq);
        std::vector<Model::Copy> copies;
        CHECK(model.Append(seq->seqId_, {}, copies));
        model.SetComputed(seq->seqId_, std::min(seq->data_.numComputedTokens_, seq->GetLen()));
        live[seq->seqId_] = seq;
        CHECK(m.AppendSlot(seq).empty());
        Check();
    }

    // One decode step of `seq` (its new token appended first, as the scheduler does). The step
    // before computed every token the sequence had (MindIE accumulates numComputedTokens_).
    std::vector<std::pair<BlockId, BlockId>> Decode(const SequenceSPtr &seq, TokenId token) {
        std::map<int, BlockId> pre = Check();
        seq->data_.UpdateNumComputedTokens(seq->GetLen() - seq->data_.numComputedTokens_);
        seq->data_.outputTokenIds.push_back(token);
        std::vector<Model::Copy> copies;
        bool fits = model.Append(seq->seqId_, {token}, copies);
        if (!fits) {
            CHECK(!m.CanAppendSlot(MakeGroup({seq})));
            seq->data_.outputTokenIds.pop_back();
            return {};
        }
        model.SetComputed(seq->seqId_, std::min(seq->data_.numComputedTokens_, seq->GetLen()));
        live[seq->seqId_] = seq;
        auto pairs = m.AppendSlot(seq);
        std::map<int, BlockId> post = Check();
        CHECK_EQ(pairs.size(), copies.size());
        for (size_t i = 0; i < pairs.size(); ++i) {
            CHECK_EQ(pairs[i].first, pre.at(copies[i].src));
            CHECK_EQ(pairs[i].second, post.at(copies[i].dst));
            CHECK(pairs[i].first != pairs[i].second);
        }
        return pairs;
    }

    void Fork(SequenceSPtr parent, SequenceSPtr child) {
        child->data_ = parent->data_;
        child->hashValue_ = parent->hashValue_;
        child->status_ = parent->status_;
        m.Fork(parent, child);
        model.Fork(parent->seqId_, child->seqId_);
        live[child->seqId_] = child;
        Check();
    }

    // End of a scheduler step.
    void EndStep() {
        m.MarkBlocksAsComputed();
        model.ReleaseQuarantine();
        model.Commit();
        Check();
    }

    void Free(SequenceId id) {
        m.Free(id);
        // The adapter hands over the tokens computed since the sequence's last AppendSlot.
        auto it = live.find(id);
        if (it != live.end()) {
            SequenceSPtr seq = it->second.lock();
            if (seq && model.Has(id) && !model.At(id).onHost) {
                model.SetComputed(id, std::min(seq->data_.numComputedTokens_, model.At(id).tokens.size()));
            }
            live.erase(it);
        }
        model.Free(id);
        Check();
    }

    // Preempts a running group by swapping it out; checks the {npu, cpu} physical pairs (full
    // blocks whose content the CPU holds already are shared and need no copy).
    bool SwapOut(const SequenceGroupSPtr &g) {
        bool can = m.CanSwapOut(g);
        size_t need = 0;
        for (const auto &s : g->seqs_) {
            auto n = model.SwapOutNeed(s->seqId_);
            need += n.first + n.second;
        }
        CHECK_EQ(can, need <= model.FreeCpu());
        if (!can) {
            return false;
        }
        std::vector<BlockId> before;
        for (const auto &s : g->seqs_) {
            BlockIds ids = m.GetBlockIds(s->seqId_)[0];
            before.insert(before.end(), ids.begin(), ids.end());
        }
        auto pairs = m.SwapOut(g);
        std::vector<bool> copied;
        for (const auto &s : g->seqs_) {
            // The adapter reports the sequence's computed tokens first.
            model.SetComputed(s->seqId_, std::min(s->data_.numComputedTokens_, model.At(s->seqId_).tokens.size()));
            CHECK(model.SwapOut(s->seqId_, &copied));
            s->status_ = SequenceStatus::SWAPPED;
        }
        Check();
        std::vector<BlockId> after;
        for (const auto &s : g->seqs_) {
            BlockIds ids = m.GetBlockIds(s->seqId_)[0];
            after.insert(after.end(), ids.begin(), ids.end());
        }
        CHECK_EQ(copied.size(), before.size());
        std::set<BlockId> dsts;
        size_t k = 0;
        for (size_t i = 0; i < copied.size(); ++i) {
            if (!copied[i]) {
                continue;
            }
            CHECK(k < pairs.size());
            CHECK_EQ(pairs[k].first, before[i]);                                  // NPU id
            CHECK_EQ(pairs[k].second, after[i] - static_cast<BlockId>(npu));      // CPU physical id
            CHECK(pairs[k].second >= 0 && pairs[k].second < static_cast<BlockId>(cpu));
            CHECK(dsts.insert(pairs[k].second).second);
            ++k;
        }
        CHECK_EQ(k, pairs.size());
        return true;
    }

    // Resumes a swapped group; checks the {cpu, npu} physical pairs (pages whose content is
    // still cached on the NPU are shared and need no copy). CanSwapIn must also leave room for the
    // AppendSlot MindIE's scheduler makes right after SwapIn: the sequence's full length (its
    // pending token included) plus the speculative slots.
    bool SwapIn(const SequenceGroupSPtr &g) {
        AllocStatus st = m.CanSwapIn(g, 0);
        // Each sequence's need; a group's sequences share CPU blocks, each of which comes back
        // as one NPU block at most: the group needs at most their distinct count.
        size_t perSeq = 0;
        size_t extra = 0;
        std::set<int> held;
        for (const auto &s : g->seqs_) {
            auto n = model.SwapInNeed(s->seqId_);
            const Model::Seq &ms = model.At(s->seqId_);
            size_t pages = ms.hostPages;
            size_t slots = (s->GetLen() + spec + ps - 1) / ps;
            perSeq += n.first + n.second;
            extra += slots > pages ? slots - pages : 0;
            held.insert(ms.host.begin(), ms.host.begin() + static_cast<std::ptrdiff_t>(pages));
        }
        size_t need = std::min(perSeq, held.size()) + extra;
        CHECK((st == AllocStatus::OK) == (need <= model.AvailableNpu()));
        if (st != AllocStatus::OK) {
            return false;
        }
        std::vector<BlockId> before;
        for (const auto &s : g->seqs_) {
            BlockIds ids = m.GetBlockIds(s->seqId_)[0];
            before.insert(before.end(), ids.begin(), ids.end());
        }
        auto pairs = m.SwapIn(g);
        std::vector<bool> copied;
        for (const auto &s : g->seqs_) {
            std::vector<bool> c = model.SwapIn(s->seqId_);
            copied.insert(copied.end(), c.begin(), c.end());
            s->status_ = SequenceStatus::RUNNING;
        }
        Check();
        std::vector<BlockId> after;
        for (const auto &s : g->seqs_) {
            BlockIds ids = m.GetBlockIds(s->seqId_)[0];
            after.insert(after.end(), ids.begin(), ids.end());
        }
        size_t k = 0;
        for (size_t i = 0; i < copied.size(); ++i) {
            if (!copied[i]) {
                continue;
            }
            CHECK(k < pairs.size());
            CHECK_EQ(pairs[k].first, before[i] - static_cast<BlockId>(npu));  // CPU physical id
            CHECK_EQ(pairs[k].second, after[i]);                               // NPU id
            ++k;
        }
        CHECK_EQ(k, pairs.size());
        return true;
    }
};

}  // namespace harness

#endif
