// Test harness for the kvshare MindIE adapter: checks, MindIE-shaped sequence builders, and an
// independent, deliberately simple model of the block state the adapter must produce.
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

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "block_manager_interface.h"
#include "kvshare.h"
#include "kvshare_mindie.h"

namespace harness {

using namespace mindie_llm;
using kvshare_mindie::KvshareBlockManager;

inline int &Failures() {
    static int n = 0;
    return n;
}

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++harness::Failures();                                                         \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                                                   \
    do {                                                                                                 \
        auto va_ = (a);                                                                                  \
        auto vb_ = (b);                                                                                  \
        if (!(va_ == vb_)) {                                                                             \
            std::ostringstream os_;                                                                      \
            os_ << va_ << " != " << vb_;                                                                 \
            std::fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%s)\n", __FILE__, __LINE__, #a, #b, \
                         os_.str().c_str());                                                             \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)

// Expects `stmt` to throw an exception of type `E` whose message contains `needle`.
#define CHECK_THROWS(E, stmt, needle)                                                                \
    do {                                                                                             \
        bool thrown_ = false;                                                                        \
        try {                                                                                        \
            stmt;                                                                                    \
        } catch (const E &e_) {                                                                      \
            thrown_ = true;                                                                          \
            if (std::string(e_.what()).find(needle) == std::string::npos) {                          \
                std::fprintf(stderr, "%s:%d: %s threw \"%s\", expected to mention \"%s\"\n", __FILE__, \
                             __LINE__, #stmt, e_.what(), needle);                                    \
                std::exit(1);                                                                        \
            }                                                                                        \
        }                                                                                            \
        if (!thrown_) {                                                                              \
            std::fprintf(stderr, "%s:%d: %s did not throw %s\n", __FILE__, __LINE__, #stmt, #E);     \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)

inline BlockManagerConfig Config(size_t blockSize, size_t npu, size_t cpu, bool caching, size_t spec = 0) {
    BlockManagerConfig c{};
    c.cacheBlockSize = blockSize;
    c.cpuBlockNum = cpu;
    c.npuBlockNum = npu;
    c.reservedBlockNum = 0;
    c.speculativeSlots = spec;
    c.enableCaching = caching;
    return c;
}

inline SequenceSPtr MakeSeq(SequenceId id, const std::vector<TokenId> &prompt, HashValue lora = 0) {
    auto s = std::make_shared<Sequence>(id, 0, prompt);
    s->hashValue_ = lora;
    return s;
}

inline SequenceGroupSPtr MakeGroup(const std::vector<SequenceSPtr> &seqs) {
    RequestId rid = "req-" + std::to_string(seqs.at(0)->seqId_);
    return std::make_shared<SequenceGroup>(rid, seqs);
}

inline std::vector<TokenId> Range(TokenId from, size_t n) {
    std::vector<TokenId> v;
    for (size_t i = 0; i < n; ++i) {
        v.push_back(from + static_cast<TokenId>(i));
    }
    return v;
}

inline std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

inline void CheckKvs(const KvshareBlockManager &m) {
    kvs_status st = kvs_cache_check(m.Cache());
    if (st != KVS_STATUS_OK) {
        std::fprintf(stderr, "kvs_cache_check: %s: %s\n", kvs_status_str(st), kvs_last_error_message());
        std::exit(1);
    }
}

inline kvs_stats Stats(const KvshareBlockManager &m) {
    kvs_stats s{};
    CHECK(kvs_cache_stats(m.Cache(), &s) == KVS_STATUS_OK);
    return s;
}

// ---- the model ----

class Model {
   public:
    struct Seq {
        std::vector<TokenId> tokens;
        std::vector<int> blocks;  // model block ids (device)
        std::vector<int> host;    // model host block ids while swapped out
        size_t hostPages = 0;
        bool onHost = false;
        HashValue lora = 0;
        size_t matched = 0;
        size_t hashed = 0;  // leading full pages offered to the index
        bool stopped = false;
    };
    struct Copy {
        int src;
        int dst;
    };

    Model(size_t ps, size_t npu, size_t cpu, bool caching, size_t spec)
        : ps_(ps), npu_(npu), cpu_(cpu), caching_(caching), spec_(spec) {}

    // Free NPU blocks as MindIE counts them: those free now plus the held-back blocks of this
    // step's swap-outs that nothing else holds.
    size_t FreeNpu() const { return AvailableNpu() + QuarantineFree(); }
    // Free + cached NPU blocks an allocation can take now.
    size_t AvailableNpu() const { return npu_ - InUse(); }
    size_t QuarantineFree() const {
        std::map<int, int> holds;
        for (int b : quarantine_) {
            ++holds[b];
        }
        size_t n = 0;
        for (const auto &h : holds) {
            n += blocks_[h.first].rc == h.second;
        }
        return n;
    }
    // The end of a step: the blocks this step's swap-outs copy from are released (last first).
    void ReleaseQuarantine() {
        for (auto b = quarantine_.rbegin(); b != quarantine_.rend(); ++b) {
            Release(*b);
        }
        quarantine_.clear();
    }
    // Free + evictable CPU blocks (host pages holding swapped-out content stay cached).
    size_t FreeCpu() const {
        size_t n = 0;
        for (const auto &b : hblocks_) {
            n += b.rc > 0;
        }
        return cpu_ - n;
    }
    size_t InUse() const {
        size_t n = 0;
        for (const auto &b : blocks_) {
            n += b.rc > 0;
        }
        return n;
    }
    size_t Cached() const {
        size_t n = 0;
        for (const auto &b : blocks_) {
            n += (b.rc == 0 && b.registered);
        }
        return n;
    }
    size_t Registered() const { return index_.size(); }
    const std::map<SequenceId, Seq> &Seqs() const { return seqs_; }
    const Seq &At(SequenceId id) const { return seqs_.at(id); }
    bool Has(SequenceId id) const { return seqs_.count(id) != 0; }

    // Pages Allocate would share and the pages it needs; false when it must fail for space.
    bool Allocate(SequenceId id, const std::vector<TokenId> &tokens, HashValue lora) {
        Seq s;
        s.tokens = tokens;
        s.lora = lora;
        size_t n = tokens.size();
        // Without caching, blocks are still hashed (swaps share by content) but never matched.
        size_t maxPages = caching_ ? (n - 1) / ps_ : 0;
        std::vector<int> hits;
        for (size_t i = 0; i < maxPages; ++i) {
            if (HasPlaceholder(tokens, i)) {
                break;
            }
            auto it = index_.find(Key(tokens, lora, i));
            if (it == index_.end()) {
                break;
            }
            hits.push_back(it->second);
        }
        size_t total = (n + ps_ - 1) / ps_;
        size_t need = total - hits.size();
        size_t cachedHits = 0;
        for (int b : hits) {
            cachedHits += blocks_[b].rc == 0;
        }
        if (need + cachedHits > AvailableNpu() && QuarantineFree() > 0) {
            ReleaseQuarantine();
        }
        if (need + cachedHits > AvailableNpu()) {
            return false;
        }
        for (int b : hits) {
            Acquire(b);
        }
        s.blocks = hits;
        for (size_t i = 0; i < need; ++i) {
            s.blocks.push_back(NewBlock());
        }
        s.matched = hits.size() * ps_;
        s.hashed = hits.size();
        seqs_[id] = s;
        Pend(id);
        return true;
    }

    void Commit() {
        std::set<SequenceId> pending;
        pending.swap(pending_);
        for (SequenceId id : pending) {
            auto it = seqs_.find(id);
            if (it != seqs_.end() && !it->second.onHost) {
                RegisterNow(it->second);
            }
        }
    }

    void Fork(SequenceId parent, SequenceId child) {
        Seq s = seqs_.at(parent);
        for (int b : s.blocks) {
            Acquire(b);
        }
        seqs_[child] = s;
        Pend(child);
    }

    // Appends tokens (with `spec_` lookahead slots); returns the copy-on-write copies, or false
    // if there is not enough room (then nothing changes).
    bool Append(SequenceId id, const std::vector<TokenId> &newTokens, std::vector<Copy> &copies) {
        Seq &s = seqs_.at(id);
        size_t old = s.tokens.size();
        size_t n = newTokens.size();
        size_t want = (old + n + spec_ + ps_ - 1) / ps_;
        size_t need = want > s.blocks.size() ? want - s.blocks.size() : 0;
        std::vector<size_t> cow;
        if (n > 0 && !s.blocks.empty()) {
            size_t last = std::min((old + n - 1) / ps_, s.blocks.size() - 1);
            for (size_t j = old / ps_; j <= last; ++j) {
                if (blocks_[s.blocks[j]].rc > 1) {
                    cow.push_back(j);
                }
            }
        }
        // Copy-on-write destinations never come from this step's swap-outs (their copies run after
        // the copy-on-write pairs); new blocks may, once released.
        size_t wantTokens = (old + n + ps_ - 1) / ps_;
        size_t needTokens = wantTokens > s.blocks.size() ? wantTokens - s.blocks.size() : 0;
        // A shared block the tokens start is replaced without a copy.
        bool copying = false;
        for (size_t j : cow) {
            copying = copying || (j == old / ps_ && old % ps_ > 0);
        }
        if (!copying) {
            if (need + cow.size() > AvailableNpu()) {
                ReleaseQuarantine();
            }
            if (need + cow.size() > AvailableNpu()) {
                return false;
            }
        } else if (needTokens + cow.size() > AvailableNpu() || need + cow.size() > FreeNpu()) {
            return false;
        }
        for (size_t j : cow) {
            int src = s.blocks[j];
            int dst = NewBlock();
            if (j == old / ps_ && old % ps_ > 0) {
                copies.push_back({src, dst});
            }
            Release(src);
            s.blocks[j] = dst;
        }
        for (size_t i = 0; i < need; ++i) {
            if (i == needTokens && copying && need - i > AvailableNpu()) {
                ReleaseQuarantine();  // the lookahead slots' blocks, after the copies' destinations
            }
            s.blocks.push_back(NewBlock());
        }
        s.tokens.insert(s.tokens.end(), newTokens.begin(), newTokens.end());
        Pend(id);
        return true;
    }

    void Free(SequenceId id) {
        auto it = seqs_.find(id);
        if (it == seqs_.end()) {
            return;
        }
        if (it->second.onHost) {
            for (auto b = it->second.host.rbegin(); b != it->second.host.rend(); ++b) {
                HRelease(*b);
            }
        } else {
            for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) {
                Release(*b);
            }
        }
        seqs_.erase(it);
    }

    // What a swap-out of `id` takes from the free + cached CPU blocks: {pages it copies, cached
    // (unreferenced) host blocks it shares}. Full hashed pages whose content a host block holds
    // already are shared.
    std::pair<size_t, size_t> SwapOutNeed(SequenceId id) const {
        const Seq &s = seqs_.at(id);
        size_t copied = 0;
        size_t cached = 0;
        for (size_t j = 0; j < s.blocks.size(); ++j) {
            auto it = j < s.hashed ? hindex_.find(Key(s.tokens, s.lora, j)) : hindex_.end();
            if (it == hindex_.end()) {
                ++copied;
            } else {
                cached += hblocks_[it->second].rc == 0;
            }
        }
        return {copied, cached};
    }

    // Swaps `id` out; false (nothing changed) without room. `copied` gets, for each page, whether
    // it was copied (false: shared host block).
    bool SwapOut(SequenceId id, std::vector<bool> *copied = nullptr) {
        auto need = SwapOutNeed(id);
        if (need.first + need.second > FreeCpu()) {
            return false;
        }
        Seq &s = seqs_.at(id);
        std::vector<int> hit(s.blocks.size(), -1);
        {
            for (size_t j = 0; j < s.hashed; ++j) {
                auto it = hindex_.find(Key(s.tokens, s.lora, j));
                if (it != hindex_.end()) {
                    hit[j] = it->second;
                    if (hblocks_[it->second].rc++ == 0) {
                        hlru_.remove(it->second);
                    }
                }
            }
        }
        s.host.clear();
        for (size_t j = 0; j < s.blocks.size(); ++j) {
            bool copy = hit[j] < 0;
            s.host.push_back(copy ? NewHostBlock() : hit[j]);
            if (copied) {
                copied->push_back(copy);
            }
        }
        {
            for (size_t j = 0; j < s.hashed; ++j) {
                std::string key = Key(s.tokens, s.lora, j);
                if (hit[j] < 0 && !hindex_.count(key) && !hblocks_[s.host[j]].registered) {
                    hindex_[key] = s.host[j];
                    hblocks_[s.host[j]].registered = true;
                }
            }
        }
        s.hostPages = s.host.size();
        // The blocks the swap copies from stay held until the step ends.
        std::vector<bool> held(s.blocks.size(), false);
        for (size_t j = s.blocks.size(); j-- > 0;) {
            held[j] = hit[j] < 0;
            if (!held[j]) {
                Release(s.blocks[j]);
            }
        }
        for (size_t j = 0; j < s.blocks.size(); ++j) {
            if (held[j]) {
                quarantine_.push_back(s.blocks[j]);
            }
        }
        s.blocks.clear();
        s.onHost = true;
        return true;
    }

    // What a swap-in of `id` takes from the free + cached NPU blocks: {pages it copies, cached
    // (unreferenced) blocks it shares}.
    std::pair<size_t, size_t> SwapInNeed(SequenceId id) const {
        const Seq &s = seqs_.at(id);
        size_t copied = 0;
        size_t cached = 0;
        for (size_t j = 0; j < s.hostPages; ++j) {
            auto it = j < s.hashed ? index_.find(Key(s.tokens, s.lora, j)) : index_.end();
            if (it == index_.end()) {
                ++copied;
            } else {
                cached += blocks_[it->second].rc == 0;
            }
        }
        return {copied, cached};
    }

    // Returns for each page whether it was copied from the host (false: shared cached page).
    std::vector<bool> SwapIn(SequenceId id) {
        Seq &s = seqs_.at(id);
        std::vector<int> hit(s.hostPages, -1);
        {
            for (size_t j = 0; j < s.hashed; ++j) {
                auto it = index_.find(Key(s.tokens, s.lora, j));
                if (it != index_.end()) {
                    hit[j] = it->second;
                }
            }
        }
        std::vector<bool> copied;
        for (size_t j = 0; j < s.hostPages; ++j) {
            if (hit[j] >= 0) {
                Acquire(hit[j]);  // every hit first, then the new blocks
            }
        }
        for (size_t j = 0; j < s.hostPages; ++j) {
            if (hit[j] >= 0) {
                s.blocks.push_back(hit[j]);
                copied.push_back(false);
            } else {
                s.blocks.push_back(NewBlock());
                copied.push_back(true);
            }
        }
        for (size_t j = 0; j < s.hashed; ++j) {
            if (hit[j] < 0) {
                Insert(Key(s.tokens, s.lora, j), s.blocks[j]);
            }
        }
        for (auto b = s.host.rbegin(); b != s.host.rend(); ++b) {
            HRelease(*b);
        }
        s.host.clear();
        s.hostPages = 0;
        s.onHost = false;
        Pend(id);
        return copied;
    }

    void ClearIndex() {
        for (auto &kv : index_) {
            blocks_[kv.second].registered = false;
        }
        index_.clear();
        lru_.clear();
        held_.clear();
        for (auto &kv : hindex_) {
            hblocks_[kv.second].registered = false;
        }
        hindex_.clear();
        hlru_.clear();
    }

    size_t Evictions() const { return evictions_; }

   private:
    struct Block {
        int rc = 0;
        bool registered = false;
    };

    static bool HasPlaceholder(const std::vector<TokenId> &t, size_t page, size_t ps) {
        for (size_t i = page * ps; i < (page + 1) * ps; ++i) {
            if (t[i] < 0) {
                return true;
            }
        }
        return false;
    }
    bool HasPlaceholder(const std::vector<TokenId> &t, size_t page) const { return HasPlaceholder(t, page, ps_); }

    std::string Key(const std::vector<TokenId> &t, HashValue lora, size_t page) const {
        std::string k = std::to_string(lora) + ":";
        for (size_t i = 0; i < (page + 1) * ps_; ++i) {
            k += std::to_string(t[i]) + ",";
        }
        return k;
    }

    std::string KeyOf(int b) const {
        for (const auto &kv : index_) {
            if (kv.second == b) {
                return kv.first;
            }
        }
        return "";
    }
    // The key of the block before the one of `key` (keys list a prefix's tokens, each followed
    // by a comma, after "lora:").
    std::string ParentKey(const std::string &key) const {
        size_t end = key.size();
        for (size_t i = 0; i < ps_ && end > 0; ++i) {
            end = key.rfind(',', end - 2);
            if (end == std::string::npos) {
                return "";
            }
            ++end;
        }
        return key.substr(0, end);
    }
    bool HasChild(int b) const {
        std::string key = KeyOf(b);
        for (const auto &kv : index_) {
            if (kv.second != b && kv.first.size() > key.size() && kv.first.compare(0, key.size(), key) == 0 &&
                ParentKey(kv.first) == key) {
                return true;
            }
        }
        return false;
    }

    int NewBlock() {
        // A never-used or free block if there is one, else the least recently released cached
        // block, which leaves the prefix index.
        size_t freeList = npu_ - InUse() - Cached();
        if (freeList == 0) {
            if (lru_.empty() && held_.empty()) {
                throw std::logic_error("model: no block left");
            }
            // Leaves first, as kvshare evicts: a cached block whose content has a registered
            // child (the next block of a cached or held prefix) is held back while a leaf is
            // left, and offered again, first, once its last child leaves the index.
            while (!lru_.empty() && HasChild(lru_.front())) {
                held_.push_back(lru_.front());
                lru_.pop_front();
            }
            std::list<int> &from = lru_.empty() ? held_ : lru_;
            int b = from.front();
            from.pop_front();
            std::string key;
            for (auto it = index_.begin(); it != index_.end(); ++it) {
                if (it->second == b) {
                    key = it->first;
                    index_.erase(it);
                    break;
                }
            }
            // Its parent, if held back and now without a child, goes back to the front.
            for (auto h = held_.begin(); h != held_.end(); ++h) {
                if (KeyOf(*h) == ParentKey(key) && !HasChild(*h)) {
                    lru_.push_front(*h);
                    held_.erase(h);
                    break;
                }
            }
            blocks_[b].registered = false;
            blocks_[b].rc = 1;
            ++evictions_;
            return b;
        }
        for (size_t b = 0; b < blocks_.size(); ++b) {
            if (blocks_[b].rc == 0 && !blocks_[b].registered) {
                blocks_[b].rc = 1;
                return static_cast<int>(b);
            }
        }
        blocks_.push_back(Block{1, false});
        return static_cast<int>(blocks_.size() - 1);
    }

    // A host block: a free one if any, else the least recently released cached one, which
    // leaves the host index.
    int NewHostBlock() {
        size_t inUse = 0;
        for (const auto &b : hblocks_) {
            inUse += b.rc > 0;
        }
        if (cpu_ - inUse - hlru_.size() == 0) {
            if (hlru_.empty()) {
                throw std::logic_error("model: no host block left");
            }
            int b = hlru_.front();
            hlru_.pop_front();
            for (auto it = hindex_.begin(); it != hindex_.end(); ++it) {
                if (it->second == b) {
                    hindex_.erase(it);
                    break;
                }
            }
            hblocks_[b].registered = false;
            hblocks_[b].rc = 1;
            return b;
        }
        for (size_t b = 0; b < hblocks_.size(); ++b) {
            if (hblocks_[b].rc == 0 && !hblocks_[b].registered) {
                hblocks_[b].rc = 1;
                return static_cast<int>(b);
            }
        }
        hblocks_.push_back(Block{1, false});
        return static_cast<int>(hblocks_.size() - 1);
    }

    void HRelease(int b) {
        if (hblocks_[b].rc <= 0) {
            throw std::logic_error("model: host refcount underflow");
        }
        if (--hblocks_[b].rc == 0 && hblocks_[b].registered) {
            hlru_.push_back(b);
        }
    }

    void Release(int b) {
        if (blocks_[b].rc <= 0) {
            throw std::logic_error("model: refcount underflow");
        }
        if (--blocks_[b].rc == 0 && blocks_[b].registered) {
            lru_.push_back(b);
        }
    }

    void Acquire(int b) {
        if (blocks_[b].rc++ == 0) {
            lru_.remove(b);
            held_.remove(b);
        }
    }

    void Insert(const std::string &key, int b) {
        if (index_.count(key) || blocks_[b].registered) {
            return;
        }
        index_[key] = b;
        blocks_[b].registered = true;
    }

    void Pend(SequenceId id) {
        const Seq &s = seqs_.at(id);
        if (!s.stopped && s.hashed < s.tokens.size() / ps_) {
            pending_.insert(id);
        }
    }

    void RegisterNow(Seq &s) {
        size_t full = s.tokens.size() / ps_;
        while (!s.stopped && s.hashed < full) {
            if (HasPlaceholder(s.tokens, s.hashed)) {
                s.stopped = true;
                break;
            }
            Insert(Key(s.tokens, s.lora, s.hashed), s.blocks[s.hashed]);
            s.hashed++;
        }
    }

    size_t ps_, npu_, cpu_;
    bool caching_;
    size_t spec_;
    std::vector<Block> blocks_;
    std::map<std::string, int> index_;
    std::map<SequenceId, Seq> seqs_;
    std::set<SequenceId> pending_;
    std::list<int> lru_;
    std::list<int> held_;  // cached parents held back from eviction
    size_t evictions_ = 0;
    std::vector<int> quarantine_;
    std::vector<Block> hblocks_;
    std::map<std::string, int> hindex_;
    std::list<int> hlru_;
};

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
        CHECK(m.Allocate(g));
        for (size_t i = 1; i < g->seqs_.size(); ++i) {
            model.Fork(first->seqId_, g->seqs_[i]->seqId_);
        }
        for (const auto &s : g->seqs_) {
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

    // One decode step of `seq` (its new token appended first, as the scheduler does).
    std::vector<std::pair<BlockId, BlockId>> Decode(const SequenceSPtr &seq, TokenId token) {
        std::map<int, BlockId> pre = Check();
        seq->data_.outputTokenIds.push_back(token);
        std::vector<Model::Copy> copies;
        bool fits = model.Append(seq->seqId_, {token}, copies);
        if (!fits) {
            CHECK(!m.CanAppendSlot(MakeGroup({seq})));
            seq->data_.outputTokenIds.pop_back();
            return {};
        }
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
        size_t need = 0;
        for (const auto &s : g->seqs_) {
            auto n = model.SwapInNeed(s->seqId_);
            size_t pages = model.At(s->seqId_).hostPages;
            size_t slots = (s->GetLen() + spec + ps - 1) / ps;
            need += n.first + n.second + (slots > pages ? slots - pages : 0);
        }
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
