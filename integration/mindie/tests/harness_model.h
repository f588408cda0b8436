// The harness's model of the block state: an independent, deliberately simple account of the
// blocks the adapter must produce (see harness.h).
#ifndef KVSHARE_MINDIE_TEST_HARNESS_MODEL_H
#define KVSHARE_MINDIE_TEST_HARNESS_MODEL_H

#include "harness_base.h"

namespace harness {

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
        size_t computed = SIZE_MAX;  // tokens whose KV is written (kvs_seq_set_computed)
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
    // Mid-step, an allocation that needs the held-back blocks releases one that nothing else
    // holds at a time (the last taken first), only as many as it lacks.
    bool ReleaseQuarantinedOne() {
        for (auto b = quarantine_.rbegin(); b != quarantine_.rend(); ++b) {
            int block = *b;
            int holds = static_cast<int>(std::count(quarantine_.begin(), quarantine_.end(), block));
            if (blocks_[block].rc != holds) {
                continue;
            }
            for (int i = 0; i < holds; ++i) {
                Release(block);
            }
            quarantine_.erase(std::remove(quarantine_.begin(), quarantine_.end(), block), quarantine_.end());
            return true;
        }
        return false;
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
        auto cost = [&]() {
            size_t cachedHits = 0;
            for (int b : hits) {
                cachedHits += blocks_[b].rc == 0;
            }
            return need + cachedHits;
        };
        while (cost() > AvailableNpu() && ReleaseQuarantinedOne()) {
        }
        if (cost() > AvailableNpu()) {
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

    // The adapter hands kvshare the tokens whose KV is computed (numComputedTokens_): only full
    // pages within them are committed or shared by content on a swap.
    // The adapter commits right after.
    void SetComputed(SequenceId id, size_t computed) {
        seqs_.at(id).computed = computed;
        Pend(id);
        Commit();
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
            while (need + cow.size() > AvailableNpu() && ReleaseQuarantinedOne()) {
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
            if (i == needTokens && copying) {
                // The lookahead slots' blocks, after the copies' destinations.
                while (need - i > AvailableNpu() && ReleaseQuarantinedOne()) {
                }
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
        if (!s.stopped && s.hashed < std::min(s.tokens.size(), s.computed) / ps_) {
            pending_.insert(id);
        }
    }

    void RegisterNow(Seq &s) {
        size_t full = std::min(s.tokens.size(), s.computed) / ps_;
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

}  // namespace harness

#endif
