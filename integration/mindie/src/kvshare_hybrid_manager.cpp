// kvshare adapter for MindIE-LLM: KV-cache groups (COMPOSITEBLOCKMANAGER, SLIDING_WINDOW) on one
// kvshare cache with one group per sub-manager.
//
// Mapping: a MindIE sequence id is a kvshare sequence id; a sub-manager is a group (TOKEN: full
// attention; SLIDING_WINDOW with requestBlockWindowSize N: a window of (N-1)*blockSize + 1
// tokens, so that once AppendSlot has released what fell out, a sequence holds exactly its last
// N blocks). kvshare is given a sequence's tokens as their KV is computed (numComputedTokens_),
// so that a full block becomes a prefix hit only once its KV is written: Allocate begins with the
// hit and room for the rest of the prompt, AppendSlot appends the tokens computed since and room
// for the rest, Free appends the last computed ones before it frees. Every call on a sequence is
// one kvshare call for all groups, which kvshare checks for every group's pool before it changes
// anything; the prefix hit is kvshare's cross-group hit (kvs_prefix_find).
//
// Pools: MindIE sizes each group's KV tensor on its own, so each group gets its own kvshare pool
// (a distinct `page_bytes` per group). kvshare gives every pool the same page count: the largest
// sub-manager's blocks plus the null page 0. A group with fewer blocks has the first pages of its
// pool (those after the null page) held by the manager for its whole life, so that its block ids
// are MindIE's own, 0 to its block count - 1: block b of group g is page b + PageOffset(g).
//
// What both managers share (block ids, swap with the host tier, the prefix cache, statistics) is
// KvshareManagerBase's; a manager of one group has a host tier of cpuBlockNum blocks and swaps as
// the block manager does. See docs/mindie.md, "KV-cache groups".
#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "adapter_common.h"
#include "kvshare.h"
#include "kvshare_mindie.h"

namespace kvshare_mindie {

using mindie_llm::KvCacheType;
using mindie_llm::SequenceStatus;

using namespace detail;

namespace {

const char *const kCtor = "KvshareHybridBlockManager";

// One sub-manager's checks (the parts kvshare cannot honour or MindIE defines as invalid).
void CheckSub(const BlockManagerConfig &c) {
    if (c.rankSize != 1 || c.hostSize != 1) {
        throw Unsupported("sequence/context parallel with KV-cache groups (rankSize " + std::to_string(c.rankSize) +
                          ", hostSize " + std::to_string(c.hostSize) + ")");
    }
    if (c.enableKvPool) {
        throw Unsupported("KV pool (enableKvPool) with KV-cache groups");
    }
    if (c.cacheType == KvCacheType::SEQUENCE) {
        throw Unsupported(
            "KV cache type SEQUENCE (one block per request, MindIE's RequestSingleBlockManager): not a "
            "token KV-cache group");
    }
    if (c.cacheType != KvCacheType::TOKEN && c.cacheType != KvCacheType::SLIDING_WINDOW) {
        throw std::invalid_argument(Prefix(kCtor) + "unknown cacheType " +
                                    std::to_string(static_cast<int32_t>(c.cacheType)));
    }
    if (c.cacheBlockSize == 0) {
        throw std::invalid_argument(Prefix(kCtor) + "cacheBlockSize must be greater than 0");
    }
    if (c.reservedBlockNum > c.npuBlockNum) {
        throw std::invalid_argument(Prefix(kCtor) + "reservedBlockNum is larger than npuBlockNum");
    }
    if (c.cacheType == KvCacheType::SLIDING_WINDOW && c.requestBlockWindowSize == 0) {
        throw std::invalid_argument(Prefix(kCtor) + "requestBlockWindowSize must be at least 1");
    }
}

// The block size of a composite's sub-managers (checked equal below), else the config's.
size_t BlockSizeOf(const BlockManagerConfig &config) {
    return config.subManagers.empty() ? config.cacheBlockSize : config.subManagers[0].cacheBlockSize;
}

}  // namespace

KvshareHybridBlockManager::KvshareHybridBlockManager(const BlockManagerConfig &config, size_t localDPRank)
    : KvshareManagerBase(localDPRank, config.enableCaching, BlockSizeOf(config), config.speculativeSlots) {
    // The groups: the sub-managers of a composite, else the config itself.
    std::vector<BlockManagerConfig> subs = config.subManagers;
    if (subs.empty()) {
        subs.push_back(config);
    } else if (config.cacheBlockSize != 0 && config.cacheBlockSize != subs[0].cacheBlockSize) {
        throw std::invalid_argument(Prefix(kCtor) + "the composite's cacheBlockSize " +
                                    std::to_string(config.cacheBlockSize) + " differs from its sub-managers' " +
                                    std::to_string(subs[0].cacheBlockSize));
    }
    if (subs.size() > KVS_MAX_GROUPS) {
        throw std::invalid_argument(Prefix(kCtor) + std::to_string(subs.size()) +
                                    " sub-managers; kvshare holds at most " + std::to_string(KVS_MAX_GROUPS) +
                                    " groups");
    }
    std::vector<kvs_group> kinds;
    size_t most = 0;
    for (const BlockManagerConfig &c : subs) {
        CheckSub(c);
        if (!c.subManagers.empty()) {
            throw Unsupported("nested composite block managers (a sub-manager with subManagers)");
        }
        if (c.cacheBlockSize != BlockSize()) {
            throw std::invalid_argument(Prefix(kCtor) + "sub-managers with different cacheBlockSize (" +
                                        std::to_string(BlockSize()) + ", " + std::to_string(c.cacheBlockSize) +
                                        "): a kvshare cache of groups has one page size");
        }
        // One page more than the blocks MindIE offers: kvshare's null page 0.
        size_t blocks = c.npuBlockNum - c.reservedBlockNum;
        if (BlockSize() > UINT32_MAX || blocks >= UINT32_MAX) {
            throw std::invalid_argument(Prefix(kCtor) + "block size or block count exceeds 2^32-2");
        }
        if (blocks == 0) {
            throw std::invalid_argument(Prefix(kCtor) + "no allocatable block (npuBlockNum - reservedBlockNum is 0)");
        }
        kvs_group g{};
        // A pool per group (pools are per distinct page_bytes): each group's tensor is its own.
        g.page_bytes = kinds.size() + 1;
        if (c.cacheType == KvCacheType::SLIDING_WINDOW) {
            size_t window = (c.requestBlockWindowSize - 1) * BlockSize() + 1;
            if (c.requestBlockWindowSize > UINT32_MAX / BlockSize() || window > UINT32_MAX) {
                throw std::invalid_argument(Prefix(kCtor) + "requestBlockWindowSize * cacheBlockSize exceeds 2^32-1");
            }
            g.kind = KVS_GROUP_KIND_SLIDING_WINDOW;
            g.window = static_cast<uint32_t>(window);
            windowBlocks_.push_back(c.requestBlockWindowSize);
        } else {
            g.kind = KVS_GROUP_KIND_FULL;
            g.window = 0;
            windowBlocks_.push_back(0);
        }
        kinds.push_back(g);
        groups_.push_back(Group{blocks, c.npuBlockNum});
        most = std::max(most, blocks);
    }
    kvs_config hc = kvs_config_default();
    hc.page_size = static_cast<uint32_t>(BlockSize());
    hc.num_device_pages = static_cast<uint32_t>(most + 1);
    // A host tier for swapping, which needs one group (see KvshareManagerBase).
    hc.num_host_pages = subs.size() == 1 ? static_cast<uint32_t>(subs[0].cpuBlockNum) : 0;
    if (subs.size() == 1 && subs[0].cpuBlockNum >= UINT32_MAX) {
        throw std::invalid_argument(Prefix(kCtor) + "cpuBlockNum exceeds 2^32-2");
    }
    hc.enable_prefix_caching = CachingEnabled();
    hc.reserve_null_page = true;
    // Full pages become prefix hits when Allocate / AppendSlot hand kvshare their computed
    // tokens (no commit step), and the engine writes every scheduled slot itself.
    hc.defer_commit = false;
    hc.skip_cached_writes = false;
    hc.demote_to_host = false;
    hc.enable_events = false;
    hc.match_unit = 0;
    hc.groups = kinds.data();
    hc.num_groups = kinds.size();
    // Global CPU ids (one group) start after its blocks, as MindIE's.
    CreateCache(hc, groups_[0].blocks, groups_[0].blocks, kCtor);
    // A group with fewer blocks than the pool holds the pool's first pages for good: a fresh
    // pool hands out its pages in id order, which the check below makes sure of.
    for (size_t g = 0; g < groups_.size(); ++g) {
        size_t extra = most - groups_[g].blocks;
        if (extra == 0) {
            continue;
        }
        std::vector<uint32_t> pages(extra);
        kvs_status st = kvs_pages_alloc(Cache(), g, extra, pages.data(), pages.size());
        bool inOrder = st == KVS_STATUS_OK;
        for (size_t i = 0; inOrder && i < extra; ++i) {
            inOrder = pages[i] == i + 1;
        }
        if (!inOrder) {
            std::string why = st != KVS_STATUS_OK ? std::string(kvs_status_str(st)) + ": " + kvs_last_error_message()
                                                  : std::string("a fresh pool did not hand out its first pages");
            throw std::runtime_error(Prefix(kCtor) + "cannot size group " + std::to_string(g) + " to " +
                                     std::to_string(groups_[g].blocks) + " blocks: " + why);
        }
        SetHeldPages(g, extra);
    }
}

mindie_llm::BlockSpaceManagerSPtr CreateKvshareHybridBlockManager(const BlockManagerConfig &config,
                                                                  size_t localDPRank) {
    return std::make_shared<KvshareHybridBlockManager>(config, localDPRank);
}

// The tokens the block tables cover (the sequence's length at Allocate or its last AppendSlot),
// as MindIE counts them; kvshare holds the computed ones.
bool KvshareHybridBlockManager::Lookup(SequenceId seqId, SeqCounts &out) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    SeqShape s{};
    Live live{};
    if (!Tracked(seqId, live) || !Shape(seqId, s)) {
        return false;
    }
    out = SeqCounts{live.tokens, s.matchedTokens};
    return true;
}

// kvshare's cross-group hit: the longest prefix every group serves. Nothing acquired, no
// statistics counted.
size_t KvshareHybridBlockManager::Hit(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra, size_t max,
                                      const char *method) const {
    size_t hit = 0;
    Check(kvs_prefix_find(Cache(), tokens.data(), tokens.size(), extra, max, nullptr, 0, 0, &hit), method);
    return hit;
}

size_t KvshareHybridBlockManager::ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                                                    const char *method) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return Hit(tokens, extra, tokens.size() - 1, method);
}

size_t KvshareHybridBlockManager::FreePages(size_t g) const {
    return AvailableDevicePages(g) + (g == 0 ? QuarantineFree() : 0);
}

// ---- admission and growth ----

AllocStatus KvshareHybridBlockManager::CanAllocate(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAllocate");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<SequenceSPtr> waiting = seqGroup->GetFirstSequence(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return AllocStatus::NEVER;
    }
    // Each waiting sequence begins on its own (no fork) and takes, in the worst case (no hit), a
    // block per position of its prompt in every group: kvshare releases a window group's early
    // blocks only from the next AppendSlot on, as vLLM does. A group that needs more than a
    // group's blocks can never be allocated.
    size_t perSeq = CeilDiv(NumTokens(*waiting[0]), BlockSize());
    size_t all = seqGroup->GetSequences(SequenceStatus::WAITING).size() * perSeq;
    AllocStatus st = AllocStatus::OK;
    for (size_t g = 0; g < groups_.size(); ++g) {
        if (all > groups_[g].blocks) {
            return AllocStatus::NEVER;
        }
        if (all > FreePages(g)) {
            st = AllocStatus::LATER;
        }
    }
    return st;
}

// Blocks each group takes to hold `slots` token slots in a table of `positions` positions (every
// group's table has the same positions; nothing the adapter appends to is shared, so no copy).
size_t KvshareHybridBlockManager::GrowBlocks(size_t positions, size_t slots) const {
    size_t want = CeilDiv(slots, BlockSize());
    return want > positions ? want - positions : 0;
}

void KvshareHybridBlockManager::TakeRoom(size_t need, const char *method) {
    for (size_t g = 0; g < groups_.size(); ++g) {
        size_t free = FreePages(g);
        if (need > free) {
            throw std::runtime_error(Prefix(method) + kvs_status_str(KVS_STATUS_NO_SPACE) +
                                     ": not enough free NPU blocks in group " + std::to_string(g) + ": need " +
                                     std::to_string(need) + ", free " + std::to_string(free));
        }
    }
    // The held-back pages (group 0's) one at a time, only as many as the allocation lacks.
    while (need > AvailableDevicePages(0) && ReleaseQuarantinedPage()) {
    }
}
bool KvshareHybridBlockManager::Allocate(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "Allocate");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<SequenceSPtr> waiting = seqGroup->GetSequences(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return false;
    }
    for (const auto &seq : waiting) {
        RequireSeq(seq, "Allocate");
        SeqShape s{};
        if (Shape(seq->seqId_, s) || NumTokens(*seq) == 0) {
            return false;  // as MindIE: a table exists already, or nothing to allocate
        }
    }
    // All or nothing. First every sequence takes its hit (kvshare's cross-group hit), and nothing
    // else, so that no sequence's new blocks evict what the next one's hit needs (the group's
    // sequences share a prompt: each gets the hit GetSeqNumCachedTokens reported); then every
    // sequence gets room for the rest of its prompt, whose tokens come with AppendSlot as they are
    // computed.
    std::vector<SequenceId> begun;
    auto undo = [&]() {
        for (SequenceId id : begun) {
            (void)kvs_seq_free(Cache(), KvsId(id));
        }
    };
    std::vector<std::vector<int32_t>> prompts;
    std::vector<size_t> hitOf;
    for (const auto &seq : waiting) {
        Extra extra(seq->hashValue_);
        size_t hit = 0;
        ::kvs_seq_info info{};
        kvs_status st = KVS_STATUS_OK;
        try {
            prompts.push_back(Tokens32(*seq, 0, "Allocate"));
            hit = Hit(prompts.back(), extra.ptr, prompts.back().size() - 1, "Allocate");
            st = kvs_seq_begin(Cache(), KvsId(seq->seqId_), prompts.back().data(), hit, extra.ptr, hit, 0, &info);
        } catch (...) {
            undo();
            throw;
        }
        if (st != KVS_STATUS_OK || info.matched_tokens != hit) {
            std::string msg = Prefix("Allocate") + (st != KVS_STATUS_OK ? std::string(kvs_status_str(st)) + ": " +
                                                                              kvs_last_error_message()
                                                                        : "matched " +
                                                                              std::to_string(info.matched_tokens) +
                                                                              " tokens where the lookup found " +
                                                                              std::to_string(hit));
            if (st == KVS_STATUS_OK) {
                (void)kvs_seq_free(Cache(), KvsId(seq->seqId_));
            }
            undo();
            throw std::runtime_error(msg);
        }
        begun.push_back(seq->seqId_);
        hitOf.push_back(hit);
    }
    // The room, every group's checked before any grows (MindIE's allocator throws without room).
    size_t need = 0;
    for (size_t i = 0; i < waiting.size(); ++i) {
        need += GrowBlocks(hitOf[i] / BlockSize(), prompts[i].size());
    }
    try {
        TakeRoom(need, "Allocate");
    } catch (...) {
        undo();
        throw;
    }
    for (size_t i = 0; i < waiting.size(); ++i) {
        size_t copies = 0;
        kvs_status st = kvs_seq_append(Cache(), KvsId(waiting[i]->seqId_), prompts[i].data(), 0,
                                       prompts[i].size() - hitOf[i], nullptr, 0, &copies);
        if (st != KVS_STATUS_OK) {
            std::string msg = Prefix("Allocate") + kvs_status_str(st) + ": " + kvs_last_error_message();
            undo();
            throw std::runtime_error(msg);
        }
    }
    uint64_t hits = 0;
    uint64_t misses = 0;
    for (size_t i = 0; i < waiting.size(); ++i) {
        uint64_t full = prompts[i].size() / BlockSize();
        uint64_t hitBlocks = hitOf[i] / BlockSize();
        hits += hitBlocks;
        misses += full - hitBlocks;
    }
    for (const auto &seq : waiting) {
        Track(seq);
    }
    CountHits(hits, misses);
    return true;
}

KvshareHybridBlockManager::Growth KvshareHybridBlockManager::GrowthOf(const mindie_llm::Sequence &seq,
                                                                      const SeqShape &s) const {
    size_t len = NumTokens(seq);
    size_t held = static_cast<size_t>(s.numTokens);
    size_t computed = std::max(held, std::min(seq.data_.numComputedTokens_, len));
    // Room for the tokens not computed yet (and the speculative slots) past the computed ones.
    size_t room = std::max(len, computed) + SpeculativeSlots() - computed;
    return Growth{held, computed, room, GrowBlocks(static_cast<size_t>(s.numPages), computed + room)};
}

bool KvshareHybridBlockManager::CanAppendSlot(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAppendSlot");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    size_t need = 0;
    for (const auto &seq : seqGroup->GetSequences(SequenceStatus::RUNNING)) {
        RequireSeq(seq, "CanAppendSlot");
        SeqShape s{};
        if (!Shape(seq->seqId_, s) || s.onHost) {
            return false;  // as MindIE (unknown); swapped out: AppendSlot would throw
        }
        need += GrowthOf(*seq, s).blocks;
    }
    // Conservative: the blocks AppendSlot's release of out-of-window blocks returns are not counted.
    for (size_t g = 0; g < groups_.size(); ++g) {
        if (need > FreePages(g)) {
            return false;
        }
    }
    return true;
}

std::vector<std::pair<BlockId, BlockId>> KvshareHybridBlockManager::AppendSlot(const SequenceSPtr &seq) {
    RequireSeq(seq, "AppendSlot");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    SeqShape s = ShapeOrThrow(seq->seqId_, "AppendSlot");
    if (s.onHost) {
        throw std::runtime_error(Prefix("AppendSlot") + kvs_status_str(KVS_STATUS_SEQ_WRONG_TIER) + ": sequence " +
                                 std::to_string(seq->seqId_) + " is swapped out");
    }
    Growth grow = GrowthOf(*seq, s);
    std::vector<int32_t> tokens = Tokens32(*seq, grow.held, "AppendSlot");
    tokens.resize(grow.computed - grow.held);
    TakeRoom(grow.blocks, "AppendSlot");
    // Hand kvshare the tokens computed since (their full blocks become prefix hits) with room for
    // the rest, then release what no window reads any more (vLLM's allocate_new_blocks and
    // cache_blocks, then remove_skipped_blocks: a block registered before its release stays
    // matchable). What a window reads follows the tokens whose KV is computed
    // (numComputedTokens_: this step computes from there on), not the tokens the tables cover: a
    // chunked prefill holds its whole prompt from Allocate on and computes it a chunk per step.
    size_t copies = 0;
    Check(kvs_seq_append(Cache(), KvsId(seq->seqId_), tokens.data(), tokens.size(), grow.room, nullptr, 0, &copies),
          "AppendSlot");
    Check(kvs_seq_release_skipped(Cache(), KvsId(seq->seqId_), grow.computed, nullptr), "AppendSlot");
    Track(seq);
    return {};  // no block is shared with another sequence's writes: nothing to copy
}

// ---- what the group manager does not do ----

// Each sequence of a group begins on its own (Allocate): the group manager shares blocks between
// sequences only through the prefix cache, and has no copy-on-write.
void KvshareHybridBlockManager::Fork(SequenceSPtr &, SequenceSPtr &) {
    throw Unsupported("Fork with KV-cache groups (the group manager begins every sequence on its own)");
}

void KvshareHybridBlockManager::Free(SequenceId seqId) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Live live{};
    if (Untrack(seqId, live)) {
        // The tokens computed since the last AppendSlot (the last step's) lie within the tables:
        // hand them over so that their full blocks stay prefix hits. Only a cache improvement, so
        // nothing here stops the free.
        SequenceSPtr seq = live.seq.lock();
        SeqShape s{};
        if (seq && Shape(seqId, s) && !s.onHost) {
            Growth grow = GrowthOf(*seq, s);
            if (grow.computed > grow.held && grow.computed <= live.tokens) {
                std::vector<int32_t> tokens;
                try {
                    tokens = Tokens32(*seq, grow.held, "Free");  // AppendSlot took these tokens already
                } catch (const std::out_of_range &) {
                    tokens.clear();
                }
                if (tokens.size() >= grow.computed - grow.held) {
                    size_t copies = 0;
                    (void)kvs_seq_append(Cache(), KvsId(seqId), tokens.data(), grow.computed - grow.held, 0, nullptr,
                                         0, &copies);
                }
            }
        }
    }
    FreeSeq(seqId, "Free");
}

// ---- block ids ----

std::vector<BlockIds> KvshareHybridBlockManager::GetBlockIds(SequenceId seqId) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    SeqShape s = ShapeOrThrow(seqId, "GetBlockIds");
    std::vector<BlockIds> out;
    for (size_t g = 0; g < groups_.size(); ++g) {
        BlockIds ids;
        for (BlockId b : TableIds(seqId, g, s)) {
            if (b != mindie_llm::INVALID_BLOCKID) {  // a window group's released positions (only at the front)
                ids.push_back(b);
            }
        }
        out.push_back(std::move(ids));
    }
    return out;
}

// A composite: the group with the fewest, the blocks a new sequence can count on in every group.
size_t KvshareHybridBlockManager::GetNumFreeNpuBlocks() const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    size_t free = FreePages(0);
    for (size_t g = 1; g < groups_.size(); ++g) {
        free = std::min(free, FreePages(g));
    }
    return free;
}

// A composite: the smallest sub-manager's npuBlockNum.
size_t KvshareHybridBlockManager::GetTotalNpuBlocks() const {
    size_t total = groups_[0].npuBlockNum;
    for (const Group &g : groups_) {
        total = std::min(total, g.npuBlockNum);
    }
    return total;
}

}  // namespace kvshare_mindie
