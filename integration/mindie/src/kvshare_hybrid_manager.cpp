// kvshare adapter for MindIE-LLM: KV-cache groups (COMPOSITEBLOCKMANAGER, SLIDING_WINDOW) on
// kvshare caches, one per group.
//
// Mapping: a MindIE sequence id is a kvshare sequence id; a sub-manager is a group (TOKEN: full
// attention; SLIDING_WINDOW with requestBlockWindowSize N: a window of (N-1)*blockSize + 1
// tokens, so that once AppendSlot has released what fell out, a sequence holds exactly its last
// N blocks). kvshare is given a sequence's tokens as their KV is computed (numComputedTokens_),
// so that a full block becomes a prefix hit only once its KV is written: Allocate begins with the
// hit and room for the rest of the prompt, AppendSlot appends the tokens computed since and room
// for the rest, Free appends the last computed ones before it frees. Each group is a kvs_cache of
// that one group, with its own pool of the sub-manager's
// blocks, as MindIE sizes each group's KV tensor on its own; the prefix hit is the longest one
// every group serves. A pool has one page more than the sub-manager's blocks (kvshare's null page
// 0): MindIE block id b is kvshare page b + 1, so the ids and their count are MindIE's own. See
// docs/mindie.md, "KV-cache groups".
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

// MindIE block id of kvshare page `p` (not the null page).
BlockId ToBlockId(uint32_t p) { return static_cast<BlockId>(p) - 1; }

}  // namespace

void KvshareHybridBlockManager::CacheFree::operator()(kvs_cache *c) const { kvs_cache_free(c); }

KvshareHybridBlockManager::KvshareHybridBlockManager(const BlockManagerConfig &config, size_t localDPRank)
    : KvshareManagerBase(localDPRank, config.enableCaching), speculativeSlots_(config.speculativeSlots) {
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
        throw std::invalid_argument(Prefix(kCtor) + std::to_string(subs.size()) + " sub-managers; kvshare holds at most " +
                                    std::to_string(KVS_MAX_GROUPS) + " groups");
    }
    blockSize_ = subs[0].cacheBlockSize;
    std::vector<kvs_group> kinds;
    for (const BlockManagerConfig &c : subs) {
        CheckSub(c);
        if (!c.subManagers.empty()) {
            throw Unsupported("nested composite block managers (a sub-manager with subManagers)");
        }
        if (c.cacheBlockSize != blockSize_) {
            throw std::invalid_argument(Prefix(kCtor) + "sub-managers with different cacheBlockSize (" +
                                        std::to_string(blockSize_) + ", " + std::to_string(c.cacheBlockSize) +
                                        "): a kvshare cache of groups has one page size");
        }
        // One page more than the blocks MindIE offers: kvshare's null page 0.
        size_t blocks = c.npuBlockNum - c.reservedBlockNum;
        if (blockSize_ > UINT32_MAX || blocks >= UINT32_MAX) {
            throw std::invalid_argument(Prefix(kCtor) + "block size or block count exceeds 2^32-2");
        }
        if (blocks == 0) {
            throw std::invalid_argument(Prefix(kCtor) + "no allocatable block (npuBlockNum - reservedBlockNum is 0)");
        }
        kvs_group g{};
        g.page_bytes = 1;
        if (c.cacheType == KvCacheType::SLIDING_WINDOW) {
            size_t window = (c.requestBlockWindowSize - 1) * blockSize_ + 1;
            if (c.requestBlockWindowSize > UINT32_MAX / blockSize_ || window > UINT32_MAX) {
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
        groups_.push_back(Group{nullptr, blocks, c.npuBlockNum});
    }
    if (kvs_abi_version() != KVS_ABI_VERSION) {
        throw std::runtime_error(Prefix(kCtor) + "libkvshare ABI version " + std::to_string(kvs_abi_version()) +
                                 " differs from the header's " + std::to_string(KVS_ABI_VERSION));
    }
    for (size_t i = 0; i < groups_.size(); ++i) {
        kvs_config hc = kvs_config_default();
        hc.page_size = static_cast<uint32_t>(blockSize_);
        hc.num_device_pages = static_cast<uint32_t>(groups_[i].blocks + 1);
        hc.num_host_pages = 0;
        hc.enable_prefix_caching = CachingEnabled();
        hc.reserve_null_page = true;
        // Full pages become prefix hits when Allocate / AppendSlot hand kvshare their computed
        // tokens (no commit step), and the engine writes every scheduled slot itself.
        hc.defer_commit = false;
        hc.skip_cached_writes = false;
        hc.demote_to_host = false;
        hc.enable_events = false;
        hc.match_unit = 0;
        hc.groups = &kinds[i];
        hc.num_groups = 1;
        kvs_cache *h = nullptr;
        kvs_status st = kvs_cache_new(&hc, &h);
        if (st != KVS_STATUS_OK) {
            throw std::invalid_argument(Prefix(kCtor) + kvs_status_str(st) + ": " + kvs_last_error_message());
        }
        groups_[i].cache.reset(h);
    }
}

KvshareHybridBlockManager::~KvshareHybridBlockManager() = default;

mindie_llm::BlockSpaceManagerSPtr CreateKvshareHybridBlockManager(const BlockManagerConfig &config,
                                                                  size_t localDPRank) {
    return std::make_shared<KvshareHybridBlockManager>(config, localDPRank);
}

kvs_cache *KvshareHybridBlockManager::GroupCache(size_t group) const { return groups_.at(group).cache.get(); }

// ---- lookups ----

// Every group's cache holds the same sequences with the same tokens: the first one answers.
bool KvshareHybridBlockManager::Find(SequenceId seqId, Shape &out) const {
    ::kvs_seq_info info{};
    kvs_status st = kvs_seq_get_info(groups_[0].cache.get(), KvsId(seqId), &info);
    if (st == KVS_STATUS_SEQ_NOT_FOUND) {
        return false;
    }
    Check(st, "kvs_seq_get_info");
    out = Shape{info.num_tokens, info.num_pages, info.matched_tokens};
    return true;
}

KvshareHybridBlockManager::Shape KvshareHybridBlockManager::FindOrThrow(SequenceId seqId, const char *method) const {
    Shape s{};
    if (!Find(seqId, s)) {
        UnknownSeq(method, seqId);
    }
    return s;
}

// The tokens the block tables cover (the sequence's length at Allocate or its last AppendSlot),
// as MindIE counts them; kvshare holds the computed ones.
bool KvshareHybridBlockManager::Lookup(SequenceId seqId, SeqCounts &out) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Shape s{};
    auto it = live_.find(seqId);
    if (it == live_.end() || !Find(seqId, s)) {
        return false;
    }
    out = SeqCounts{it->second.tokens, s.matchedTokens};
    return true;
}

size_t KvshareHybridBlockManager::Hit(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra, size_t max,
                                      const char *method) const {
    // Each group's kvs_prefix_find is the longest hit it serves up to a bound; a shorter bound
    // can only shorten another group's hit, so lowering the bound to the smallest answer until
    // every group serves it ends at the longest hit all serve.
    size_t hit = max;
    for (bool lowered = true; lowered;) {
        lowered = false;
        for (const Group &g : groups_) {
            size_t n = 0;
            Check(kvs_prefix_find(g.cache.get(), tokens.data(), tokens.size(), extra, hit, nullptr, 0, 0, &n),
                  method);
            if (n < hit) {
                hit = n;
                lowered = true;
            }
        }
    }
    return hit;
}

// Nothing acquired, no statistics counted.
size_t KvshareHybridBlockManager::ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                                                    const char *method) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return Hit(tokens, extra, tokens.size() - 1, method);
}

std::vector<uint32_t> KvshareHybridBlockManager::Table(SequenceId seqId, size_t g, const Shape &shape) const {
    std::vector<uint32_t> pages(static_cast<size_t>(shape.numPages));
    size_t n = 0;
    Check(kvs_seq_pages(groups_[g].cache.get(), 0, KvsId(seqId), pages.data(), pages.size(), &n), "kvs_seq_pages");
    pages.resize(n);
    return pages;
}

size_t KvshareHybridBlockManager::FreePages(size_t g) const {
    kvs_group_stats s{};
    Check(kvs_cache_group_stats(groups_[g].cache.get(), 0, &s), "kvs_cache_group_stats");
    return static_cast<size_t>(s.pool_pages_free);
}

// ---- admission and growth ----

AllocStatus KvshareHybridBlockManager::CanAllocate(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAllocate");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<SequenceSPtr> waiting = seqGroup->GetFirstSequence(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return AllocStatus::NEVER;
    }
    // Each waiting sequence begins on its own (no fork across the groups' caches) and takes, in the worst
    // case (no hit), a block per position of its prompt in every group: kvshare releases a window
    // group's early blocks only from the next AppendSlot on, as vLLM does. A group that needs more
    // than a group's blocks can never be allocated.
    size_t perSeq = CeilDiv(NumTokens(*waiting[0]), blockSize_);
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

bool KvshareHybridBlockManager::Allocate(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "Allocate");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<SequenceSPtr> waiting = seqGroup->GetSequences(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return false;
    }
    for (const auto &seq : waiting) {
        RequireSeq(seq, "Allocate");
        Shape s{};
        if (Find(seq->seqId_, s) || NumTokens(*seq) == 0) {
            return false;  // as MindIE: a table exists already, or nothing to allocate
        }
    }
    // All or nothing. First every sequence takes its hit (the longest every group serves), and
    // nothing else, so that no sequence's new blocks evict what the next one's hit needs (the
    // group's sequences share a prompt: each gets the hit GetSeqNumCachedTokens reported); then
    // every sequence gets room for the rest of its prompt, whose tokens come with AppendSlot as
    // they are computed.
    std::vector<SequenceId> begun;  // in every group
    auto undo = [&]() {
        for (SequenceId id : begun) {
            for (const Group &g : groups_) {
                (void)kvs_seq_free(g.cache.get(), KvsId(id));
            }
        }
    };
    std::vector<std::vector<int32_t>> prompts;
    std::vector<size_t> hitOf;
    for (const auto &seq : waiting) {
        prompts.push_back(Tokens32(*seq, 0, "Allocate"));
        const std::vector<int32_t> &tokens = prompts.back();
        Extra extra(seq->hashValue_);
        size_t hit = 0;
        try {
            hit = Hit(tokens, extra.ptr, tokens.size() - 1, "Allocate");
        } catch (...) {
            undo();
            throw;
        }
        for (size_t g = 0; g < groups_.size(); ++g) {
            ::kvs_seq_info info{};
            kvs_status st = kvs_seq_begin(groups_[g].cache.get(), KvsId(seq->seqId_), tokens.data(), hit, extra.ptr,
                                          hit, 0, &info);
            if (st != KVS_STATUS_OK || info.matched_tokens != hit) {
                std::string msg = Prefix("Allocate") + (st != KVS_STATUS_OK
                                                            ? std::string(kvs_status_str(st)) + ": " +
                                                                  kvs_last_error_message()
                                                            : "group " + std::to_string(g) + " matched " +
                                                                  std::to_string(info.matched_tokens) +
                                                                  " tokens where the lookup found " +
                                                                  std::to_string(hit));
                for (size_t k = 0; k <= g; ++k) {
                    (void)kvs_seq_free(groups_[k].cache.get(), KvsId(seq->seqId_));
                }
                undo();
                throw std::runtime_error(msg);
            }
        }
        begun.push_back(seq->seqId_);
        hitOf.push_back(hit);
    }
    // The room, every group's checked before any grows (MindIE's allocator throws without room).
    for (size_t g = 0; g < groups_.size(); ++g) {
        size_t need = 0;
        for (size_t i = 0; i < waiting.size(); ++i) {
            size_t n = 0;
            kvs_status st = kvs_seq_append_need(groups_[g].cache.get(), KvsId(waiting[i]->seqId_), 0,
                                                prompts[i].size() - hitOf[i], &n, nullptr);
            if (st != KVS_STATUS_OK) {
                std::string msg = Prefix("Allocate") + kvs_status_str(st) + ": " + kvs_last_error_message();
                undo();
                throw std::runtime_error(msg);
            }
            need += n;
        }
        size_t free = FreePages(g);
        if (need > free) {
            undo();
            throw std::runtime_error(Prefix("Allocate") + kvs_status_str(KVS_STATUS_NO_SPACE) + ": group " +
                                     std::to_string(g) + " needs " + std::to_string(need) + " blocks, " +
                                     std::to_string(free) + " free");
        }
    }
    for (size_t i = 0; i < waiting.size(); ++i) {
        for (const Group &g : groups_) {
            size_t copies = 0;
            kvs_status st = kvs_seq_append(g.cache.get(), KvsId(waiting[i]->seqId_), prompts[i].data(), 0,
                                           prompts[i].size() - hitOf[i], nullptr, 0, &copies);
            if (st != KVS_STATUS_OK) {
                std::string msg = Prefix("Allocate") + kvs_status_str(st) + ": " + kvs_last_error_message();
                undo();
                throw std::runtime_error(msg);
            }
        }
    }
    uint64_t hits = 0;
    uint64_t misses = 0;
    for (size_t i = 0; i < waiting.size(); ++i) {
        uint64_t full = prompts[i].size() / blockSize_;
        uint64_t hitBlocks = hitOf[i] / blockSize_;
        hits += hitBlocks;
        misses += full - hitBlocks;
    }
    for (const auto &seq : waiting) {
        live_[seq->seqId_] = Live{NumTokens(*seq), seq};
    }
    hitBlocks_ += hits;
    missBlocks_ += misses;
    return true;
}

KvshareHybridBlockManager::Growth KvshareHybridBlockManager::GrowthOf(const mindie_llm::Sequence &seq,
                                                                      const Shape &s) const {
    size_t len = NumTokens(seq);
    size_t held = static_cast<size_t>(s.numTokens);
    size_t computed = std::max(held, std::min(seq.data_.numComputedTokens_, len));
    // Room for the tokens not computed yet (and the speculative slots) past the computed ones.
    size_t room = std::max(len, computed) + speculativeSlots_ - computed;
    return Growth{held, computed, room};
}

bool KvshareHybridBlockManager::CanAppendSlot(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAppendSlot");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<size_t> need(groups_.size(), 0);
    for (const auto &seq : seqGroup->GetSequences(SequenceStatus::RUNNING)) {
        RequireSeq(seq, "CanAppendSlot");
        Shape s{};
        if (!Find(seq->seqId_, s)) {
            return false;  // as MindIE
        }
        Growth grow = GrowthOf(*seq, s);
        for (size_t g = 0; g < groups_.size(); ++g) {
            need[g] += AppendNeed(g, seq->seqId_, grow, "CanAppendSlot");
        }
    }
    // Conservative: the blocks AppendSlot's release of out-of-window blocks returns are not counted.
    for (size_t g = 0; g < groups_.size(); ++g) {
        if (need[g] > FreePages(g)) {
            return false;
        }
    }
    return true;
}

size_t KvshareHybridBlockManager::AppendNeed(size_t g, SequenceId seqId, const Growth &grow,
                                             const char *method) const {
    size_t n = 0;
    Check(kvs_seq_append_need(groups_[g].cache.get(), KvsId(seqId), grow.computed - grow.held, grow.room, &n, nullptr),
          method);
    return n;
}

std::vector<std::pair<BlockId, BlockId>> KvshareHybridBlockManager::AppendSlot(const SequenceSPtr &seq) {
    RequireSeq(seq, "AppendSlot");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Shape s = FindOrThrow(seq->seqId_, "AppendSlot");
    Growth grow = GrowthOf(*seq, s);
    std::vector<int32_t> tokens = Tokens32(*seq, grow.held, "AppendSlot");
    tokens.resize(grow.computed - grow.held);
    // Every group's room first, so that no group grows when another cannot.
    for (size_t g = 0; g < groups_.size(); ++g) {
        size_t need = AppendNeed(g, seq->seqId_, grow, "AppendSlot");
        size_t free = FreePages(g);
        if (need > free) {
            throw std::runtime_error(Prefix("AppendSlot") + "not enough free NPU blocks in group " +
                                     std::to_string(g) + ": need " + std::to_string(need) + ", free " +
                                     std::to_string(free));
        }
    }
    // Hand kvshare the tokens computed since (their full blocks become prefix hits) with room for
    // the rest, then release what no window reads any more (vLLM's allocate_new_blocks and
    // cache_blocks, then remove_skipped_blocks: a block registered before its release stays
    // matchable). What a window reads follows the tokens whose KV is computed
    // (numComputedTokens_: this step computes from there on), not the tokens the tables cover: a
    // chunked prefill holds its whole prompt from Allocate on and computes it a chunk per step.
    for (const Group &g : groups_) {
        size_t copies = 0;
        Check(kvs_seq_append(g.cache.get(), KvsId(seq->seqId_), tokens.data(), tokens.size(), grow.room, nullptr, 0,
                             &copies),
              "AppendSlot");
        Check(kvs_seq_release_skipped(g.cache.get(), KvsId(seq->seqId_), grow.computed, nullptr), "AppendSlot");
    }
    auto it = live_.find(seq->seqId_);
    if (it != live_.end()) {
        it->second.tokens = std::max(it->second.tokens, NumTokens(*seq));
    }
    return {};  // no block is shared with another sequence's writes: nothing to copy
}

// ---- what a cache of groups does not do (yet) ----

void KvshareHybridBlockManager::Fork(SequenceSPtr &, SequenceSPtr &) {
    throw Unsupported("Fork with KV-cache groups (no fork across the groups' caches)");
}

bool KvshareHybridBlockManager::CanSwapOut(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "CanSwapOut");
    // The groups' caches have no host pages: MindIE's policy preempts by recompute instead (as it does with
    // its own RequestSingleBlockManager, whose CanSwapOut is false too).
    return false;
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareHybridBlockManager::SwapOut(
    const SequenceGroupSPtr &) {
    throw Unsupported("SwapOut with KV-cache groups (no host tier; CanSwapOut is false)");
}

AllocStatus KvshareHybridBlockManager::CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t) {
    RequireGroup(seqGroup, "CanSwapIn");
    return AllocStatus::NEVER;  // nothing is ever swapped out
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareHybridBlockManager::SwapIn(
    const SequenceGroupSPtr &) {
    throw Unsupported("SwapIn with KV-cache groups (no host tier)");
}

void KvshareHybridBlockManager::Free(SequenceId seqId) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = live_.find(seqId);
    if (it != live_.end()) {
        Live live = it->second;
        live_.erase(it);
        // The tokens computed since the last AppendSlot (the last step's) lie within the tables:
        // hand them over so that their full blocks stay prefix hits. Only a cache improvement, so
        // nothing here stops the free.
        SequenceSPtr seq = live.seq.lock();
        Shape s{};
        if (seq && Find(seqId, s)) {
            Growth grow = GrowthOf(*seq, s);
            if (grow.computed > grow.held && grow.computed <= live.tokens) {
                std::vector<int32_t> tokens;
                try {
                    tokens = Tokens32(*seq, grow.held, "Free");  // AppendSlot took these tokens already
                } catch (const std::out_of_range &) {
                    tokens.clear();
                }
                if (tokens.size() >= grow.computed - grow.held) {
                    for (const Group &g : groups_) {
                        size_t copies = 0;
                        (void)kvs_seq_append(g.cache.get(), KvsId(seqId), tokens.data(), grow.computed - grow.held,
                                             0, nullptr, 0, &copies);
                    }
                }
            }
        }
    }
    for (const Group &g : groups_) {
        kvs_status st = kvs_seq_free(g.cache.get(), KvsId(seqId));
        if (st != KVS_STATUS_SEQ_NOT_FOUND) {
            Check(st, "Free");  // unknown id or double free: a no-op, as in MindIE
        }
    }
}

// ---- block ids ----

std::vector<BlockIds> KvshareHybridBlockManager::GetBlockIds(SequenceId seqId) const {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Shape s = FindOrThrow(seqId, "GetBlockIds");
    std::vector<BlockIds> out;
    for (size_t g = 0; g < groups_.size(); ++g) {
        BlockIds ids;
        for (uint32_t p : Table(seqId, g, s)) {
            if (p != KVS_NULL_PAGE) {  // a window group's released positions (only at the front)
                ids.push_back(ToBlockId(p));
            }
        }
        out.push_back(std::move(ids));
    }
    return out;
}

void KvshareHybridBlockManager::GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const {
    if (groups_.size() != 1) {
        throw Unsupported("GetRankedBlockIds of a composite manager (one list per group: use GetBlockIds)");
    }
    BlockIds ids = GetBlockIds(seqId).at(0);
    rankedBlockIds.clear();
    for (BlockId id : ids) {
        rankedBlockIds.push_back(RankedBlockId{id, 0});
    }
}

void KvshareHybridBlockManager::GetRankedBlockIds(SequenceId seqId,
                                                  std::vector<std::vector<BlockId>> &rankedBlockIds) const {
    if (groups_.size() != 1) {
        throw Unsupported("GetRankedBlockIds of a composite manager (one list per group: use GetBlockIds)");
    }
    rankedBlockIds = {GetBlockIds(seqId).at(0)};
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

size_t KvshareHybridBlockManager::GetNumFreeCpuBlocks() const { return 0; }

// A composite: the smallest sub-manager's npuBlockNum.
size_t KvshareHybridBlockManager::GetTotalNpuBlocks() const {
    size_t total = groups_[0].npuBlockNum;
    for (const Group &g : groups_) {
        total = std::min(total, g.npuBlockNum);
    }
    return total;
}

// ---- prefix cache ----

void KvshareHybridBlockManager::AccessAllblocksInSeq(const SequenceSPtr &seq, float) {
    RequireSeq(seq, "AccessAllblocksInSeq");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Shape s{};
    if (CachingEnabled() && !Find(seq->seqId_, s)) {
        throw std::runtime_error(Prefix("AccessAllblocksInSeq") + "unknown sequence id " +
                                 std::to_string(seq->seqId_));
    }
}

std::vector<BlockId> KvshareHybridBlockManager::GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) {
    // The first group's positions (INVALID_BLOCKID where a window group skips), up to each
    // sequence's hit, then their longest common prefix.
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<BlockId> common;
    bool first = true;
    for (const auto &seq : seqs) {
        RequireSeq(seq, "GetCommonComputedBlockIds");
        Shape s = FindOrThrow(seq->seqId_, "GetCommonComputedBlockIds");
        size_t cached = GetNumCachedTokens(seq);
        std::vector<uint32_t> table = Table(seq->seqId_, 0, s);
        table.resize(std::min(table.size(), cached / blockSize_));
        std::vector<BlockId> ids;
        for (uint32_t p : table) {
            ids.push_back(p == KVS_NULL_PAGE ? mindie_llm::INVALID_BLOCKID : ToBlockId(p));
        }
        if (first) {
            common = std::move(ids);
            first = false;
            continue;
        }
        size_t j = 0;
        while (j < common.size() && j < ids.size() && common[j] == ids[j]) {
            ++j;
        }
        common.resize(j);
    }
    return common;
}

// The groups' caches register full pages when Allocate / AppendSlot schedule them (vLLM's rule: every
// sequence of one step runs in one forward, where each layer writes all K/V before attending),
// so there is nothing left to commit here.
void KvshareHybridBlockManager::MarkBlocksAsComputed() {}

float KvshareHybridBlockManager::GetPrefixCacheHitRate() const {
    if (!CachingEnabled()) {
        return -1.0F;
    }
    uint64_t hits = hitBlocks_.load();
    uint64_t total = hits + missBlocks_.load();
    return total == 0 ? 0.0F : static_cast<float>(static_cast<double>(hits) / static_cast<double>(total));
}

bool KvshareHybridBlockManager::ResetPrefixCache() const {
    if (!CachingEnabled()) {
        return true;
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (const Group &g : groups_) {
        kvs_group_stats s{};
        Check(kvs_cache_group_stats(g.cache.get(), 0, &s), "ResetPrefixCache");
        if (s.pool_pages_in_use > 0) {
            return false;  // as in MindIE: only when no block is in use
        }
    }
    for (const Group &g : groups_) {
        Check(kvs_prefix_clear(g.cache.get()), "ResetPrefixCache");
    }
    return true;
}

void KvshareHybridBlockManager::ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                                           size_t replacedPlaceHolderNum) {
    RequireSeq(seq, "ReplaceTrailingPlaceHolder");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (trailingPlaceHolderNum < replacedPlaceHolderNum || NumTokens(*seq) < trailingPlaceHolderNum) {
        throw std::runtime_error(Prefix("ReplaceTrailingPlaceHolder") +
                                 "tokenIds size is less than replacement size");
    }
    (void)FindOrThrow(seq->seqId_, "ReplaceTrailingPlaceHolder");
    // As KvshareBlockManager: pages that held a placeholder are never hashed; nothing to rewrite.
}

}  // namespace kvshare_mindie
