// kvshare adapter for MindIE-LLM: the block manager (one full-attention group), what it does
// differently from the group manager: admission and Allocate with fork, AppendSlot with
// copy-on-write, Fork, Free, block ids and counts. The rest is KvshareManagerBase's.
//
// Mapping in one paragraph: a MindIE sequence id is a kvshare sequence id (cast to uint64_t), an
// NPU block id is a kvshare device page id, and a global CPU block id is a kvshare host page id
// plus the number of allocatable NPU blocks (physical CPU ids, used in swap pairs, are the host
// page ids). The cache is created with deferred commit, so a full block becomes a prefix hit only
// after MarkBlocksAsComputed (kvs_cache_commit), and without skip_cached_writes, because MindIE's
// Python side builds its slot mapping from the block tables: a prompt shares whole cached pages
// within its first len-1 tokens only, so a page the engine recomputes is always private.
#include "kvshare_mindie.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "adapter_common.h"
#include "kvshare.h"

namespace kvshare_mindie {

using mindie_llm::KvCacheType;
using mindie_llm::SequenceStatus;

using namespace detail;

KvshareBlockManager::KvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank,
                                         KvPoolLookup poolLookup)
    : KvshareManagerBase(localDPRank, config.enableCaching, config.cacheBlockSize, config.speculativeSlots),
      npuBlockNum_(config.npuBlockNum) {
    if (config.rankSize != 1 || config.hostSize != 1) {
        throw Unsupported("sequence/context parallel (rankSize " + std::to_string(config.rankSize) + ", hostSize " +
                          std::to_string(config.hostSize) + "; only 1 is supported)");
    }
    if (config.enableKvPool && !poolLookup) {
        throw Unsupported(
            "KV pool (enableKvPool) without a pool: the patched MindIE factory passes MindIE's MemPool "
            "(CreateKvshareBlockManager's poolLookup); the drop-in factory has none");
    }
    if (config.enableKvPool && !config.enableCaching) {
        throw std::invalid_argument(Prefix("constructor") +
                                    "enableKvPool needs enableCaching (MindIE's KV pool extends its prefix cache)");
    }
    if (!config.enableKvPool && poolLookup) {
        throw std::invalid_argument(Prefix("constructor") + "a pool lookup was given but enableKvPool is off");
    }
    if (config.cacheType != KvCacheType::TOKEN) {
        throw Unsupported("KV cache type other than TOKEN");
    }
    if (config.reservedBlockNum > config.npuBlockNum) {
        throw std::invalid_argument(Prefix("constructor") + "reservedBlockNum is larger than npuBlockNum");
    }
    if (config.cacheBlockSize == 0) {
        throw std::invalid_argument(Prefix("constructor") + "cacheBlockSize must be greater than 0");
    }
    size_t allocatable = config.npuBlockNum - config.reservedBlockNum;
    constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
    if (config.cacheBlockSize > kMax || allocatable > kMax || config.cpuBlockNum > kMax) {
        throw std::invalid_argument(Prefix("constructor") + "block size or block count exceeds 2^32-1");
    }
    kvs_config c = kvs_config_default();
    c.page_size = static_cast<uint32_t>(config.cacheBlockSize);
    c.num_device_pages = static_cast<uint32_t>(allocatable);
    c.num_host_pages = static_cast<uint32_t>(config.cpuBlockNum);
    // kvshare hashes full blocks even with MindIE's caching off: a swap shares the CPU block of a
    // full block that the sequences of a group share (kvshare finds it by content), as MindIE's
    // swap maps each shared block once. Prompts then share nothing (Allocate matches 0 tokens).
    c.enable_prefix_caching = true;
    c.reserve_null_page = false;
    c.defer_commit = true;
    c.skip_cached_writes = false;
    // MindIE executes only the copies its interface returns (AppendSlot's copy-on-write pairs,
    // SwapIn/SwapOut pairs); it has no channel for kvshare's queued demotion/promotion copies, so
    // CPU blocks stay what MindIE uses them for: swapped-out sequences.
    c.demote_to_host = false;
    c.enable_events = false;
    // Whole-page hits: a hit inside a page needs a partial copy executed on the NPU, and the
    // adapter has no copy channel into MindIE's worker yet (docs/mindie.md, "Prefix hits").
    c.match_unit = 0;
    // Global CPU ids start after the allocatable NPU blocks, as MindIE's.
    CreateCache(c, allocatable, allocatable, "constructor");
    SetPoolLookup(std::move(poolLookup));
}

mindie_llm::BlockSpaceManagerSPtr CreateKvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank,
                                                            KvPoolLookup poolLookup) {
    // MindIE's scheduler builds one self-attention config per kvCacheDesc and sets its cacheType:
    // a SLIDING_WINDOW one is a cache of one window group.
    if (config.cacheType == KvCacheType::SLIDING_WINDOW) {
        if (poolLookup && !config.enableKvPool) {
            throw std::invalid_argument(Prefix("constructor") + "a pool lookup was given but enableKvPool is off");
        }
        return CreateKvshareHybridBlockManager(config, localDPRank);
    }
    return std::make_shared<KvshareBlockManager>(config, localDPRank, std::move(poolLookup));
}

// ---- helpers ----

bool KvshareBlockManager::Lookup(SequenceId seqId, SeqCounts &out) const {
    SeqShape s{};
    if (!Shape(seqId, s)) {
        return false;
    }
    out = SeqCounts{s.numTokens, s.matchedTokens};
    return true;
}

// Committed pages only (deferred commit: MarkBlocksAsComputed), nothing acquired.
size_t KvshareBlockManager::ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                                              const char *method) const {
    std::vector<uint32_t> pages(tokens.size() / BlockSize() + 1);
    size_t numPages = 0;
    size_t matched = 0;
    Check(kvs_prefix_match(Cache(), 0, tokens.data(), tokens.size(), extra, tokens.size() - 1, false, pages.data(),
                           pages.size(), &numPages, &matched),
          method);
    return matched;
}

size_t KvshareBlockManager::AppendNeed(SequenceId seqId, size_t newTokens, size_t lookahead, size_t *copies) const {
    // Exactly what kvs_seq_append will take: new capacity pages for tokens + lookahead slots, plus
    // one copy-on-write page per shared page the new tokens land in (kvshare's own count).
    size_t need = 0;
    Check(kvs_seq_append_need(Cache(), KvsId(seqId), newTokens, lookahead, &need, copies), "kvs_seq_append_need");
    return need;
}

KvshareBlockManager::AppendCost KvshareBlockManager::CostOfAppend(SequenceId seqId, size_t newTokens) const {
    size_t copies = 0;
    size_t all = AppendNeed(seqId, newTokens, SpeculativeSlots(), &copies);
    if (copies == 0) {
        return AppendCost{all, 0};
    }
    // The tokens first (their copy-on-write destinations among them), the lookahead slots after.
    return AppendCost{all, AppendNeed(seqId, newTokens, 0, nullptr)};
}

size_t KvshareBlockManager::FreeDevicePages() const { return AvailableDevicePages() + QuarantineFree(); }

// ---- admission ----

AllocStatus KvshareBlockManager::CanAllocate(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAllocate");
    std::vector<SequenceSPtr> waiting = seqGroup->GetFirstSequence(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return AllocStatus::NEVER;
    }
    // Conservative like MindIE: prefix hits are not subtracted. Enough for kvs_seq_begin, which
    // needs (pages not hit) + (hit pages that are only cached) <= free + cached.
    size_t need = CeilDiv(NumTokens(*waiting.at(0)), BlockSize());
    if (DeviceBlocks() < need) {
        return AllocStatus::NEVER;
    }
    return FreeDevicePages() >= need ? AllocStatus::OK : AllocStatus::LATER;
}

bool KvshareBlockManager::Allocate(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "Allocate");
    std::vector<SequenceSPtr> waiting = seqGroup->GetFirstSequence(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return false;
    }
    SeqShape s{};
    for (const auto &seq : waiting) {
        RequireSeq(seq, "Allocate");
        if (Shape(seq->seqId_, s)) {
            return false;  // a block table already exists (MindIE refuses the same way)
        }
    }
    const SequenceSPtr &first = waiting.at(0);
    std::vector<int32_t> tokens = Tokens32(*first, 0, "Allocate");
    if (tokens.empty()) {
        return false;
    }
    Extra extra(first->hashValue_);
    ::kvs_seq_info info{};
    // Share cached pages within the first len-1 tokens only: the engine always computes at least
    // the last prompt token, and the page holding it must be private (no skip_cached_writes).
    size_t maxMatch = CachingEnabled() ? tokens.size() - 1 : 0;
    // New blocks only (the forward writes them after the step's swaps): the blocks held back for
    // this step's swap-outs may be among them when nothing else is free, released one at a time
    // until the begin fits, so that it takes every one released.
    kvs_status begun = kvs_seq_begin(Cache(), KvsId(first->seqId_), tokens.data(), tokens.size(), extra.ptr, maxMatch,
                                     0, &info);
    while (begun == KVS_STATUS_NO_SPACE && ReleaseQuarantinedPage()) {
        begun = kvs_seq_begin(Cache(), KvsId(first->seqId_), tokens.data(), tokens.size(), extra.ptr, maxMatch, 0,
                              &info);
    }
    Check(begun, "Allocate");
    // Nothing computed yet but the hit (unless MindIE counts more): no block of the prompt becomes
    // a hit before AppendSlot reports its KV computed.
    try {
        MarkComputed(first->seqId_, *first, tokens.size(), "Allocate");
    } catch (...) {
        (void)kvs_seq_free(Cache(), KvsId(first->seqId_));
        throw;
    }
    for (size_t i = 1; i < waiting.size(); ++i) {
        kvs_status st = kvs_seq_fork(Cache(), KvsId(first->seqId_), KvsId(waiting[i]->seqId_));
        if (st != KVS_STATUS_OK) {
            std::string msg = Prefix("Allocate") + kvs_status_str(st) + ": " + kvs_last_error_message();
            for (size_t k = 0; k < i; ++k) {
                (void)kvs_seq_free(Cache(), KvsId(waiting[k]->seqId_));
            }
            throw std::runtime_error(msg);
        }
    }
    for (const auto &seq : waiting) {
        Track(seq);
    }
    if (CachingEnabled()) {
        // MindIE's hit rate: one record per full prompt block, a hit when the block was cached.
        uint64_t full = tokens.size() / BlockSize();
        uint64_t hits = info.matched_tokens / BlockSize();
        CountHits(hits, full - hits);
    }
    return true;
}

// ---- decode ----

bool KvshareBlockManager::CanAppendSlot(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAppendSlot");
    size_t all = 0;
    size_t written = 0;
    for (const auto &seq : seqGroup->GetSequences(SequenceStatus::RUNNING)) {
        RequireSeq(seq, "CanAppendSlot");
        SeqShape s{};
        if (!Shape(seq->seqId_, s) || s.onHost) {
            return false;
        }
        size_t len = NumTokens(*seq);
        if (len < s.numTokens) {
            return false;
        }
        AppendCost c = CostOfAppend(seq->seqId_, len - static_cast<size_t>(s.numTokens));
        all += c.all;
        written += c.written;
    }
    return all <= FreeDevicePages() && written <= AvailableDevicePages();
}

std::vector<std::pair<BlockId, BlockId>> KvshareBlockManager::AppendSlot(const SequenceSPtr &seq) {
    RequireSeq(seq, "AppendSlot");
    SeqShape s = ShapeOrThrow(seq->seqId_, "AppendSlot");
    size_t len = NumTokens(*seq);
    if (len < s.numTokens) {
        throw std::runtime_error(Prefix("AppendSlot") + "sequence " + std::to_string(seq->seqId_) + " has " +
                                 std::to_string(len) + " tokens but its block table holds " +
                                 std::to_string(s.numTokens));
    }
    std::vector<int32_t> tokens = Tokens32(*seq, static_cast<size_t>(s.numTokens), "AppendSlot");
    uint64_t id = KvsId(seq->seqId_);
    AppendCost cost = CostOfAppend(seq->seqId_, tokens.size());
    kvs_copy copies[4];
    size_t n = 0;
    if (cost.written == 0) {
        // New blocks only: the forward writes them after the step's swaps, so the blocks held back
        // for this step's swap-outs may be among them (as many as the append lacks: it takes them
        // all, and none is left for a later copy-on-write of the step).
        while (cost.all > AvailableDevicePages() && ReleaseQuarantinedPage()) {
        }
        Check(kvs_seq_append(Cache(), id, tokens.data(), tokens.size(), SpeculativeSlots(), copies, 4, &n),
              "AppendSlot");
    } else {
        // Copy-on-write: its destinations must not be blocks this step's swap-outs read. Refused
        // before anything changes when they cannot be (CanAppendSlot answers false then).
        size_t available = AvailableDevicePages();
        if (cost.written > available || cost.all > available + QuarantineFree()) {
            throw std::runtime_error(Prefix("AppendSlot") + "not enough free NPU blocks: need " +
                                     std::to_string(cost.all) + ", " + std::to_string(cost.written) +
                                     " of them for copy-on-write outside this step's swap-outs, free " +
                                     std::to_string(available) + " (+" + std::to_string(QuarantineFree()) +
                                     " swapped out this step)");
        }
        Check(kvs_seq_append(Cache(), id, tokens.data(), tokens.size(), 0, copies, 4, &n), "AppendSlot");
        if (SpeculativeSlots() > 0) {
            while (AppendNeed(seq->seqId_, 0, SpeculativeSlots(), nullptr) > AvailableDevicePages() &&
                   ReleaseQuarantinedPage()) {
            }
            size_t none = 0;  // no token is written: nothing to copy
            Check(kvs_seq_append(Cache(), id, nullptr, 0, SpeculativeSlots(), nullptr, 0, &none), "AppendSlot");
        }
    }
    // numComputedTokens_ counts the tokens computed before this step (MindIE accumulates this
    // step's after scheduling it).
    MarkComputed(seq->seqId_, *seq, len, "AppendSlot");
    Track(seq);
    std::vector<std::pair<BlockId, BlockId>> out;
    for (size_t i = 0; i < n; ++i) {
        if (DecodeCopyKind(copies[i].kind, "AppendSlot") == CopyKind::DeviceToDevice) {
            out.emplace_back(static_cast<BlockId>(copies[i].src_page), static_cast<BlockId>(copies[i].dst_page));
        }
    }
    return out;
}

void KvshareBlockManager::Fork(SequenceSPtr &parentSeq, SequenceSPtr &childSeq) {
    RequireSeq(parentSeq, "Fork");
    RequireSeq(childSeq, "Fork");
    SeqShape s{};
    if (!Shape(parentSeq->seqId_, s)) {
        throw std::runtime_error(Prefix("Fork") + "unknown parent sequence id " + std::to_string(parentSeq->seqId_));
    }
    Check(kvs_seq_fork(Cache(), KvsId(parentSeq->seqId_), KvsId(childSeq->seqId_)), "Fork");
    Track(childSeq);
}

void KvshareBlockManager::Free(SequenceId seqId) {
    Live live{};
    (void)Untrack(seqId, live);
    // The tokens computed since the last AppendSlot (the last step's): their full blocks stay
    // prefix hits. Only a cache improvement, so nothing here stops the free.
    SequenceSPtr seq = live.seq.lock();
    SeqShape s{};
    if (seq && Shape(seqId, s) && !s.onHost) {
        try {
            MarkComputed(seqId, *seq, static_cast<size_t>(s.numTokens), "Free");
        } catch (const std::exception &) {
        }
    }
    FreeSeq(seqId, "Free");
}

void KvshareBlockManager::MarkComputed(SequenceId seqId, const mindie_llm::Sequence &seq, size_t held,
                                       const char *method) {
    Check(kvs_seq_set_computed(Cache(), KvsId(seqId), std::min(seq.data_.numComputedTokens_, held)), method);
    // Every sequence's mark is set from its first call on, so the commit registers computed
    // blocks only.
    Check(kvs_cache_commit(Cache()), method);
}

size_t KvshareBlockManager::WrittenTokens(SequenceId seqId, const SeqShape &s) const {
    Live live{};
    SequenceSPtr seq = Tracked(seqId, live) ? live.seq.lock() : nullptr;
    size_t held = static_cast<size_t>(s.numTokens);
    if (!seq) {
        return held;
    }
    // SwapOut reports what numComputedTokens_ covers; a prefix hit is written whatever it says.
    size_t computed = std::max(seq->data_.numComputedTokens_, static_cast<size_t>(s.matchedTokens));
    return std::min(held, computed);
}

void KvshareBlockManager::ReportComputed(const SequenceSPtr &seq) {
    SeqShape s = ShapeOrThrow(seq->seqId_, "SwapOut");
    MarkComputed(seq->seqId_, *seq, static_cast<size_t>(s.numTokens), "SwapOut");
}

// ---- block tables ----

std::vector<BlockIds> KvshareBlockManager::GetBlockIds(SequenceId seqId) const {
    SeqShape s = ShapeOrThrow(seqId, "GetBlockIds");
    return {TableIds(seqId, 0, s)};
}

// ---- counts ----

size_t KvshareBlockManager::GetNumFreeNpuBlocks() const { return FreeDevicePages(); }

size_t KvshareBlockManager::GetTotalNpuBlocks() const { return npuBlockNum_; }

}  // namespace kvshare_mindie
