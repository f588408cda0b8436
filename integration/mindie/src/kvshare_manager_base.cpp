// KvshareManagerBase: what both kvshare managers answer alike, on the manager's one kvs_cache:
// sequence lookups and block ids, swap out/in with the host tier (one group), the cached-token
// policy, the prefix cache and its hit rate, MindIE's block hash values and KV-pool lookups, one
// rank, no layerwise cloud manager.
// See include/kvshare_mindie.h.

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "adapter_common.h"
#include "kvshare.h"
#include "kvshare_mindie.h"

namespace kvshare_mindie {

using mindie_llm::SequenceStage;
using mindie_llm::SequenceStatus;

using namespace detail;

Unsupported::Unsupported(const std::string &feature)
    : std::runtime_error("kvshare MindIE adapter: not supported yet: " + feature) {}

KvshareManagerBase::~KvshareManagerBase() { kvs_cache_free(cache_); }

void KvshareManagerBase::CreateCache(const kvs_config &config, size_t deviceBlocks, size_t cpuIdOffset,
                                     const char *method) {
    if (kvs_abi_version() != KVS_ABI_VERSION) {
        throw std::runtime_error(Prefix(method) + "libkvshare ABI version " + std::to_string(kvs_abi_version()) +
                                 " differs from the header's " + std::to_string(KVS_ABI_VERSION));
    }
    kvs_status st = kvs_cache_new(&config, &cache_);
    if (st != KVS_STATUS_OK) {
        throw std::invalid_argument(Prefix(method) + kvs_status_str(st) + ": " + kvs_last_error_message());
    }
    nullPage_ = config.reserve_null_page;
    deviceBlocks_ = deviceBlocks;
    cpuIdOffset_ = cpuIdOffset;
    pageOffset_.assign(config.num_groups == 0 ? 1 : config.num_groups, nullPage_ ? 1 : 0);
}

void KvshareManagerBase::SetHeldPages(size_t group, size_t pages) {
    pageOffset_.at(group) = static_cast<uint32_t>((nullPage_ ? 1 : 0) + pages);
    heldPages_ += pages;
}

KvshareManagerBase::SeqCounts KvshareManagerBase::CountsOrThrow(SequenceId seqId, const char *method) const {
    SeqCounts c{};
    if (!Lookup(seqId, c)) {
        UnknownSeq(method, seqId);
    }
    return c;
}

// ---- sequences and block ids ----

bool KvshareManagerBase::Shape(SequenceId seqId, SeqShape &out) const {
    ::kvs_seq_info info{};
    kvs_status st = kvs_seq_get_info(cache_, KvsId(seqId), &info);
    if (st == KVS_STATUS_SEQ_NOT_FOUND) {
        return false;
    }
    Check(st, "kvs_seq_get_info");
    bool onHost = DecodeTier(info.tier, "kvs_seq_get_info") == Tier::Host;
    out = SeqShape{info.num_tokens, info.num_pages, info.matched_tokens, onHost};
    return true;
}

KvshareManagerBase::SeqShape KvshareManagerBase::ShapeOrThrow(SequenceId seqId, const char *method) const {
    SeqShape s{};
    if (!Shape(seqId, s)) {
        UnknownSeq(method, seqId);
    }
    return s;
}

std::vector<uint32_t> KvshareManagerBase::Pages(SequenceId seqId, size_t group, const SeqShape &shape) const {
    std::vector<uint32_t> pages(static_cast<size_t>(shape.numPages));
    size_t n = 0;
    Check(kvs_seq_pages(cache_, group, KvsId(seqId), pages.data(), pages.size(), &n), "kvs_seq_pages");
    pages.resize(n);
    return pages;
}

// A released position shows the null page on the device and UINT32_MAX on the host; only a
// cache with the null page releases positions.
bool KvshareManagerBase::Released(uint32_t page, bool onHost) const {
    return nullPage_ && page == (onHost ? UINT32_MAX : static_cast<uint32_t>(KVS_NULL_PAGE));
}

std::vector<BlockId> KvshareManagerBase::TableIds(SequenceId seqId, size_t group, const SeqShape &shape) const {
    std::vector<BlockId> ids;
    for (uint32_t p : Pages(seqId, group, shape)) {
        if (Released(p, shape.onHost)) {
            ids.push_back(mindie_llm::INVALID_BLOCKID);
        } else if (shape.onHost) {
            ids.push_back(static_cast<BlockId>(p) + static_cast<BlockId>(cpuIdOffset_));
        } else {
            ids.push_back(static_cast<BlockId>(p) - static_cast<BlockId>(pageOffset_[group]));
        }
    }
    return ids;
}

void KvshareManagerBase::GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const {
    if (NumGroups() != 1) {
        throw Unsupported("GetRankedBlockIds of a composite manager (one list per group: use GetBlockIds)");
    }
    BlockIds ids = GetBlockIds(seqId).at(0);
    rankedBlockIds.clear();
    for (BlockId id : ids) {
        rankedBlockIds.push_back(RankedBlockId{id, 0});
    }
}

void KvshareManagerBase::GetRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const {
    if (NumGroups() != 1) {
        throw Unsupported("GetRankedBlockIds of a composite manager (one list per group: use GetBlockIds)");
    }
    rankedBlockIds = {GetBlockIds(seqId).at(0)};
}

void KvshareManagerBase::FreeSeq(SequenceId seqId, const char *method) {
    kvs_status st = kvs_seq_free(cache_, KvsId(seqId));
    if (st != KVS_STATUS_OK && st != KVS_STATUS_SEQ_NOT_FOUND) {  // unknown / already freed: no-op
        Fail(method, st);
    }
}

// ---- free pages and the blocks held back for this step's swap-outs ----

size_t KvshareManagerBase::AvailableDevicePages(size_t group) const {
    // Evictable cached blocks count as free, as in MindIE's prefix-caching allocator.
    size_t pages = 0;
    Check(kvs_cache_available(cache_, KVS_TIER_DEVICE, group, &pages), "kvs_cache_available");
    return pages;
}

size_t KvshareManagerBase::FreeHostPages() const {
    // Host pages holding swapped-out content stay cached (indexed) once released: like MindIE's
    // CPU allocator, they count as free.
    size_t pages = 0;
    Check(kvs_cache_available(cache_, KVS_TIER_HOST, 0, &pages), "kvs_cache_available");
    return pages;
}

size_t KvshareManagerBase::GetNumFreeCpuBlocks() const { return FreeHostPages(); }

size_t KvshareManagerBase::QuarantineFree() const {
    std::lock_guard<std::mutex> lock(quarantineMu_);
    // A held-back page that only this manager holds is what the swap-out freed (or what its
    // other holders freed since): free once the step ends.
    std::unordered_map<uint32_t, uint32_t> holds;
    for (uint32_t p : quarantine_) {
        ++holds[p];
    }
    size_t free = 0;
    for (const auto &h : holds) {
        free += OnlyQuarantineHolds(h.first, h.second) ? 1 : 0;
    }
    return free;
}

bool KvshareManagerBase::OnlyQuarantineHolds(uint32_t page, size_t holds) const {
    kvs_page_info info{};
    Check(kvs_page_get_info(cache_, KVS_TIER_DEVICE, 0, page, &info), "kvs_page_get_info");
    return info.refcount == holds;
}

void KvshareManagerBase::ReleaseQuarantine() {
    std::lock_guard<std::mutex> lock(quarantineMu_);
    if (quarantine_.empty()) {
        return;
    }
    // Last taken first, each sequence's table from its end: its deepest cached blocks are evicted
    // first, as when a sequence is freed.
    std::vector<uint32_t> pages(quarantine_.rbegin(), quarantine_.rend());
    Check(kvs_pages_release(cache_, 0, pages.data(), pages.size()), "kvs_pages_release");
    quarantine_.clear();
}

bool KvshareManagerBase::ReleaseQuarantinedPage() {
    std::lock_guard<std::mutex> lock(quarantineMu_);
    // The last taken first, as ReleaseQuarantine does.
    for (auto it = quarantine_.rbegin(); it != quarantine_.rend(); ++it) {
        uint32_t page = *it;
        size_t holds = static_cast<size_t>(std::count(quarantine_.begin(), quarantine_.end(), page));
        if (!OnlyQuarantineHolds(page, holds)) {
            continue;
        }
        std::vector<uint32_t> pages(holds, page);
        Check(kvs_pages_release(cache_, 0, pages.data(), pages.size()), "kvs_pages_release");
        quarantine_.erase(std::remove(quarantine_.begin(), quarantine_.end(), page), quarantine_.end());
        return true;
    }
    return false;
}

// ---- swap (one group) ----

size_t KvshareManagerBase::CostOfSwapOut(const std::vector<SequenceSPtr> &seqs, const char *method,
                                         bool *onHost) const {
    size_t free = FreeHostPages();
    size_t need = 0;
    for (const auto &seq : seqs) {
        RequireSeq(seq, method);
        SeqShape s = ShapeOrThrow(seq->seqId_, method);
        if (s.onHost) {
            *onHost = true;
            return 0;
        }
        // New host pages (full blocks whose content the CPU holds already are shared), plus the
        // cached host pages it shares, which leave the evictable count.
        size_t pages = 0;
        size_t available = 0;
        Check(kvs_seq_swap_out_need(cache_, KvsId(seq->seqId_), &pages, &available), method);
        need += pages + (free - available);
    }
    *onHost = false;
    return need;
}

bool KvshareManagerBase::CanSwapOut(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "CanSwapOut");
    if (!Swaps()) {
        return false;  // MindIE's policy preempts by recompute instead
    }
    std::vector<SequenceSPtr> seqs = seqGroup->GetFirstSequence(SequenceStatus::RUNNING);
    bool onHost = false;
    size_t need = CostOfSwapOut(seqs, "CanSwapOut", &onHost);
    return !onHost && need <= FreeHostPages() && BlocksToResume(seqs, "CanSwapOut") <= deviceBlocks_;
}

void KvshareManagerBase::Track(const SequenceSPtr &seq) {
    size_t tokens = NumTokens(*seq);
    std::lock_guard<std::mutex> lock(liveMu_);
    auto it = live_.find(seq->seqId_);
    if (it == live_.end()) {
        live_.emplace(seq->seqId_, Live{tokens, seq});
    } else {
        it->second = Live{std::max(it->second.tokens, tokens), seq};
    }
}

bool KvshareManagerBase::Tracked(SequenceId seqId, Live &out) const {
    std::lock_guard<std::mutex> lock(liveMu_);
    auto it = live_.find(seqId);
    if (it == live_.end()) {
        return false;
    }
    out = it->second;
    return true;
}

bool KvshareManagerBase::Untrack(SequenceId seqId, Live &out) {
    std::lock_guard<std::mutex> lock(liveMu_);
    auto it = live_.find(seqId);
    if (it == live_.end()) {
        return false;
    }
    out = std::move(it->second);
    live_.erase(it);
    return true;
}

size_t KvshareManagerBase::WrittenTokens(SequenceId, const SeqShape &s) const {
    return static_cast<size_t>(s.numTokens);
}

void KvshareManagerBase::ReportComputed(const SequenceSPtr &) {}

size_t KvshareManagerBase::BlocksToResume(const std::vector<SequenceSPtr> &seqs, const char *method) const {
    // At least CanSwapIn's worst case once swapped out: the CPU shares a full block by content,
    // so a full block the group's sequences share comes back as one block, but a partial (or
    // empty) block each sequence holds comes back as one per sequence; plus each sequence's
    // pending append (its full length and the speculative slots past its table). A window group
    // also holds a prompt's every block until its first AppendSlot.
    std::unordered_set<uint32_t> full;  // blocks of full positions: the CPU shares them by content
    size_t own = 0;                      // other held positions: a CPU block per sequence each
    size_t extra = 0;
    for (const auto &seq : seqs) {
        SeqShape s = ShapeOrThrow(seq->seqId_, method);
        std::vector<uint32_t> table = Pages(seq->seqId_, 0, s);
        for (size_t i = 0; i < table.size(); ++i) {
            if (Released(table[i], false)) {
                continue;
            }
            if (i < WrittenTokens(seq->seqId_, s) / blockSize_) {
                full.insert(table[i]);
            } else {
                ++own;
            }
        }
        size_t len = std::max(NumTokens(*seq), static_cast<size_t>(s.numTokens));
        size_t slots = CeilDiv(len + speculativeSlots_, blockSize_);
        extra += slots > s.numPages ? slots - static_cast<size_t>(s.numPages) : 0;
    }
    return full.size() + own + extra;
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareManagerBase::SwapOut(
    const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "SwapOut");
    if (!Swaps()) {
        throw Unsupported("SwapOut with several KV-cache groups (MindIE's swap pairs carry no group; CanSwapOut is "
                          "false)");
    }
    std::vector<SequenceSPtr> seqs = seqGroup->GetFirstSequence(SequenceStatus::RUNNING);
    bool onHost = false;
    size_t need = CostOfSwapOut(seqs, "SwapOut", &onHost);
    if (onHost) {
        // MindIE's allocator refuses blocks of the wrong device with std::invalid_argument.
        throw std::invalid_argument(Prefix("SwapOut") + "a sequence of the group is already swapped out");
    }
    // Refuse the whole group before moving anything.
    size_t free = FreeHostPages();
    if (need > free) {
        throw std::runtime_error(Prefix("SwapOut") + "not enough free CPU blocks: need " + std::to_string(need) +
                                 ", free " + std::to_string(free));
    }
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> out;
    for (const auto &seq : seqs) {
        // Its computed blocks first: the CPU shares them by content (BlocksToResume counts so).
        ReportComputed(seq);
        SeqShape s = ShapeOrThrow(seq->seqId_, "SwapOut");
        std::vector<kvs_copy> copies(static_cast<size_t>(s.numPages));
        size_t n = 0;
        // Hold the device blocks until the step ends: the worker copies them to the CPU after the
        // step's copy-on-write pairs, which must not write into them (see ReleaseQuarantine).
        std::vector<uint32_t> pages;
        for (uint32_t p : Pages(seq->seqId_, 0, s)) {
            if (!Released(p, false)) {
                pages.push_back(p);
            }
        }
        Check(kvs_pages_acquire(cache_, 0, pages.data(), pages.size()), "SwapOut");
        kvs_status st = kvs_seq_swap_out(cache_, KvsId(seq->seqId_), copies.data(), copies.size(), &n);
        std::vector<uint32_t> copied;
        // Blocks whose content the CPU held already are shared: no pair, nothing to copy.
        for (size_t i = 0; st == KVS_STATUS_OK && i < n; ++i) {
            if (DecodeCopyKind(copies[i].kind, "SwapOut") == CopyKind::DeviceToHost) {
                out.emplace_back(static_cast<PhysicalBlockId>(copies[i].src_page) - pageOffset_[0],
                                 static_cast<PhysicalBlockId>(copies[i].dst_page));
                copied.push_back(copies[i].src_page);
            }
        }
        // The blocks the swap reads stay held, also those another sequence holds too: it may free
        // them later in the step (a group's other sequences, swapped out next, share a full
        // block's CPU copy instead of reading it again).
        std::vector<uint32_t> held;
        std::vector<uint32_t> rest;
        for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
            if (std::find(copied.begin(), copied.end(), *it) != copied.end()) {
                held.insert(held.begin(), *it);
            } else {
                rest.push_back(*it);
            }
        }
        Check(kvs_pages_release(cache_, 0, rest.data(), rest.size()), "SwapOut");
        Check(st, "SwapOut");
        std::lock_guard<std::mutex> lock(quarantineMu_);
        quarantine_.insert(quarantine_.end(), held.begin(), held.end());
    }
    return out;
}

KvshareManagerBase::SwapInCost KvshareManagerBase::CostOfSwapIn(const std::vector<SequenceSPtr> &seqs,
                                                                 size_t lookahead, bool withPending,
                                                                 const char *method) const {
    // Swap-in copies run before the step's swap-outs: never into a block one of them reads.
    SwapInCost c{0, 0, AvailableDevicePages()};
    size_t perSeq = 0;                  // the sequences' swap-ins counted one by one
    std::unordered_set<uint32_t> held;  // distinct CPU blocks of the group's tables
    for (const auto &seq : seqs) {
        RequireSeq(seq, method);
        SeqShape s = ShapeOrThrow(seq->seqId_, method);
        if (!s.onHost) {
            throw std::invalid_argument(Prefix(method) + "sequence " + std::to_string(seq->seqId_) +
                                        " is not swapped out");
        }
        size_t pages = static_cast<size_t>(s.numPages);
        size_t extra = 0;
        if (withPending) {
            // MindIE's scheduler follows SwapIn with AppendSlot for the token the sequence generated
            // before it was preempted (FcfsPolicy::ApplyToSwappedQueue, no CanAppendSlot in
            // between), so the answer must cover the sequence's full length (GetLen(), as MindIE
            // sizes it) plus the lookahead that append reserves, not only the tokens kvshare holds.
            size_t len = std::max(NumTokens(*seq), static_cast<size_t>(s.numTokens));
            size_t slots = CeilDiv(len + std::max(lookahead, speculativeSlots_), blockSize_);
            extra = slots > pages ? slots - pages : 0;
        }
        size_t copied = 0;
        size_t available = 0;
        Check(kvs_seq_swap_in_need(cache_, KvsId(seq->seqId_), &copied, &available), method);
        perSeq += copied + (c.free - available);
        for (uint32_t p : Pages(seq->seqId_, 0, s)) {
            if (!Released(p, true)) {
                held.insert(p);
            }
        }
        c.pages += extra;
        c.worst += extra;
    }
    // Sequences of one group (n > 1 sampling, beams) share CPU blocks: a full block they share is
    // one CPU block, which the first swap-in copies (or shares from the NPU cache) and the others
    // then share. Each distinct CPU block becomes at most one NPU block, so the group never takes
    // more than their number: the per-sequence sum is exact for one sequence and for sequences
    // that share nothing, the distinct count when they share blocks nobody caches on the NPU.
    c.pages += std::min(perSeq, held.size());
    c.worst += held.size();
    return c;
}

AllocStatus KvshareManagerBase::CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t numLookheadSlots) {
    RequireGroup(seqGroup, "CanSwapIn");
    if (!Swaps()) {
        return AllocStatus::NEVER;  // nothing is ever swapped out
    }
    SwapInCost c = CostOfSwapIn(seqGroup->GetFirstSequence(SequenceStatus::SWAPPED), numLookheadSlots, true,
                                "CanSwapIn");
    if (c.worst > deviceBlocks_) {
        return AllocStatus::NEVER;
    }
    // Pages still cached on the device are shared back instead of copied (kvs_seq_swap_in_need).
    return c.pages <= c.free ? AllocStatus::OK : AllocStatus::LATER;
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareManagerBase::SwapIn(
    const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "SwapIn");
    if (!Swaps()) {
        throw Unsupported("SwapIn with several KV-cache groups (MindIE's swap pairs carry no group)");
    }
    std::vector<SequenceSPtr> seqs = seqGroup->GetFirstSequence(SequenceStatus::SWAPPED);
    // The whole group is refused before anything moves (the swap alone: the pending token's
    // append is AppendSlot's business).
    SwapInCost c = CostOfSwapIn(seqs, 0, false, "SwapIn");
    if (c.pages > c.free) {
        throw std::runtime_error(Prefix("SwapIn") + "not enough free NPU blocks: need " + std::to_string(c.pages) +
                                 ", free " + std::to_string(c.free));
    }
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> out;
    uint64_t hits = 0;
    uint64_t misses = 0;
    for (const auto &seq : seqs) {
        SeqShape s = ShapeOrThrow(seq->seqId_, "SwapIn");
        // MindIE re-allocates every full block at SwapIn through its prefix-caching allocator and
        // records a hit (the content is cached on the NPU: kvshare shares that page, no copy) or a
        // miss (a copy) for each held one.
        std::vector<uint32_t> table = Pages(seq->seqId_, 0, s);
        uint64_t full = 0;
        for (size_t i = 0; i < table.size() && i < s.numTokens / blockSize_; ++i) {
            full += Released(table[i], true) ? 0 : 1;
        }
        std::vector<kvs_copy> copies(static_cast<size_t>(s.numPages));
        size_t n = 0;
        Check(kvs_seq_swap_in(cache_, KvsId(seq->seqId_), copies.data(), copies.size(), &n), "SwapIn");
        uint64_t copiedFull = 0;
        for (size_t i = 0; i < n; ++i) {
            if (DecodeCopyKind(copies[i].kind, "SwapIn") == CopyKind::HostToDevice) {
                out.emplace_back(static_cast<PhysicalBlockId>(copies[i].src_page),
                                 static_cast<PhysicalBlockId>(copies[i].dst_page) - pageOffset_[0]);
                copiedFull += copies[i].num_tokens == blockSize_ ? 1 : 0;
            }
        }
        hits += full - copiedFull;
        misses += copiedFull;
    }
    if (enableCaching_) {
        CountHits(hits, misses);
    }
    return out;
}

// ---- prefix cache ----

void KvshareManagerBase::AccessAllblocksInSeq(const SequenceSPtr &seq, float) {
    RequireSeq(seq, "AccessAllblocksInSeq");
    // kvshare keeps its own LRU order (pages become evictable when released, a sequence's last
    // page first); the scheduler's timestamps are not needed. Unknown ids are refused as MindIE
    // does when prefix caching is on.
    SeqCounts c{};
    if (enableCaching_ && !Lookup(seq->seqId_, c)) {
        throw std::runtime_error(Prefix("AccessAllblocksInSeq") + "unknown sequence id " +
                                 std::to_string(seq->seqId_));
    }
}

// The longest common prefix of `lists` (empty for none).
static std::vector<BlockId> CommonPrefix(std::vector<std::vector<BlockId>> lists) {
    if (lists.empty()) {
        return {};
    }
    std::vector<BlockId> common = std::move(lists[0]);
    for (size_t k = 1; k < lists.size(); ++k) {
        size_t j = 0;
        while (j < common.size() && j < lists[k].size() && common[j] == lists[k][j]) {
            ++j;
        }
        common.resize(j);
    }
    return common;
}

std::vector<BlockId> KvshareManagerBase::GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) {
    // The first group's positions (INVALID_BLOCKID where a window group released one), up to
    // each sequence's hit, then their longest common prefix.
    std::vector<std::vector<BlockId>> lists;
    for (const auto &seq : seqs) {
        RequireSeq(seq, "GetCommonComputedBlockIds");
        SeqShape s = ShapeOrThrow(seq->seqId_, "GetCommonComputedBlockIds");
        size_t cached = GetNumCachedTokens(seq);
        if (cached % blockSize_ != 0) {
            throw std::runtime_error(Prefix("GetCommonComputedBlockIds") +
                                     "the number of cached tokens is not a multiple of the block size");
        }
        std::vector<BlockId> ids = TableIds(seq->seqId_, 0, s);
        ids.resize(std::min(ids.size(), cached / blockSize_));
        lists.push_back(std::move(ids));
    }
    return CommonPrefix(std::move(lists));
}

void KvshareManagerBase::MarkBlocksAsComputed() {
    // The step is scheduled: its swap-outs' blocks are ordinary free blocks from the next one on.
    ReleaseQuarantine();
    // With deferred commit (the block manager), full blocks filled since the last call become
    // prefix hits; the group manager registers them as their tokens are computed, and has
    // nothing pending.
    Check(kvs_cache_commit(cache_), "MarkBlocksAsComputed");
}

void KvshareManagerBase::CountHits(uint64_t hits, uint64_t misses) {
    hitBlocks_ += hits;
    missBlocks_ += misses;
}

float KvshareManagerBase::GetPrefixCacheHitRate() const {
    if (!enableCaching_) {
        return -1.0F;  // what MindIE's manager reports without prefix caching
    }
    uint64_t hits = hitBlocks_.load();
    uint64_t total = hits + missBlocks_.load();
    return total == 0 ? 0.0F : static_cast<float>(static_cast<double>(hits) / static_cast<double>(total));
}

bool KvshareManagerBase::ResetPrefixCache() const {
    if (!enableCaching_) {
        return true;
    }
    kvs_stats s{};
    Check(kvs_cache_stats(cache_, &s), "ResetPrefixCache");
    if (s.device_pages_in_use > heldPages_ + QuarantineFree()) {
        return false;  // as in MindIE: only when no block is in use
    }
    Check(kvs_prefix_clear(cache_), "ResetPrefixCache");
    return true;
}

void KvshareManagerBase::ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                                    size_t replacedPlaceHolderNum) {
    RequireSeq(seq, "ReplaceTrailingPlaceHolder");
    // MindIE's order: the counts against the sequence's own tokens first, then the id.
    if (trailingPlaceHolderNum < replacedPlaceHolderNum || NumTokens(*seq) < trailingPlaceHolderNum) {
        throw std::runtime_error(Prefix("ReplaceTrailingPlaceHolder") +
                                 "tokenIds size is less than replacement size");
    }
    (void)CountsOrThrow(seq->seqId_, "ReplaceTrailingPlaceHolder");
    // kvshare has no call to rewrite tokens already in a sequence, so pages that held a
    // placeholder stay unhashed (never prefix hits). That only loses hits: block ids and KV are
    // unaffected. MindIE itself never calls this (USE_PREFIX_CACHE_WITH_PLACE_HOLDER is false).
}
// ---- cached tokens: MindIE's policy, the same for every kvshare manager ----

size_t KvshareManagerBase::GetNumCachedTokens(const SequenceSPtr &seq) {
    RequireSeq(seq, "GetNumCachedTokens");
    // MindIE looks the sequence up first (unordered_map::at), with or without caching.
    SeqCounts c = CountsOrThrow(seq->seqId_, "GetNumCachedTokens");
    if (!enableCaching_) {
        return 0;
    }
    // Fixed at Allocate (the matched tokens of the sequence's begin), so it stays the same over
    // the chunks of a chunked prefill; a decoding sequence has nothing left to skip.
    if (seq->data_.stage_ == SequenceStage::PREFILL || seq->data_.numComputedTokens_ == 0) {
        return static_cast<size_t>(c.matchedTokens);
    }
    return 0;
}

size_t KvshareManagerBase::GetSeqNumCachedTokens(const SequenceSPtr &seq) {
    RequireSeq(seq, "GetSeqNumCachedTokens");
    if (!enableCaching_ || seq->data_.stage_ != SequenceStage::PREFILL) {
        return 0;
    }
    SeqCounts c{};
    if (Lookup(seq->seqId_, c)) {
        return static_cast<size_t>(c.matchedTokens);
    }
    if (seq->data_.numComputedTokens_ != 0) {
        return 0;
    }
    // Not allocated yet: probe what Allocate would share now (at most len-1 tokens), without
    // taking references or counting in the statistics.
    std::vector<int32_t> tokens = Tokens32(*seq, 0, "GetSeqNumCachedTokens");
    if (tokens.empty()) {
        return 0;
    }
    Extra extra(seq->hashValue_);
    return ProbeCachedTokens(tokens, extra.ptr, "GetSeqNumCachedTokens");
}

// ---- MindIE's block hash values and KV pool; one rank, no cloud manager ----

std::vector<std::vector<HashValue>> KvshareManagerBase::GetRankedHashValues(SequenceId seqId) const {
    return {GetSeqHashValues(seqId)};
}

std::vector<HashValue> KvshareManagerBase::GetSeqHashValues(SequenceId seqId) const {
    // One value per position of the sequence's (first group's) table, over the tokens the table
    // covers, as MindIE's manager returns one per block object.
    SeqShape s = ShapeOrThrow(seqId, "GetSeqHashValues");
    Live live{};
    SequenceSPtr seq = Tracked(seqId, live) ? live.seq.lock() : nullptr;
    if (!seq) {
        throw std::runtime_error(Prefix("GetSeqHashValues") + "sequence " + std::to_string(seqId) +
                                 " is no longer alive (its tokens are needed for the hash values)");
    }
    return MindieBlockHashes(*seq, live.tokens, static_cast<size_t>(s.numPages), blockSize_);
}

std::vector<BlockId> KvshareManagerBase::GetRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs,
                                                                    size_t computedLens, uint32_t tpSize,
                                                                    std::string modelName) {
    // MindIE's scheduler asks this for a prefill, right after GetCommonComputedBlockIds
    // (`computedLens` is its length): the blocks after the local hit whose KV every tensor-parallel
    // rank's worker holds in the pool, under MindIE's keys "{hash}_{tp rank}_{tp size}_{model}",
    // continue the hit; MindIE's worker loads them into these blocks before the forward. Nothing
    // in kvshare changes: the loaded blocks are the sequence's own (allocated, not shared) and
    // become prefix hits like computed ones once MarkBlocksAsComputed follows the step.
    if (!poolLookup_) {
        throw Unsupported("KV pool (GetRemoteComputedBlockIds): this manager has no pool (enableKvPool is off)");
    }
    std::vector<std::vector<BlockId>> lists;
    for (const auto &seq : seqs) {
        RequireSeq(seq, "GetRemoteComputedBlockIds");
        SeqShape s = ShapeOrThrow(seq->seqId_, "GetRemoteComputedBlockIds");
        std::vector<BlockId> ids = TableIds(seq->seqId_, 0, s);
        if (computedLens > ids.size()) {
            throw std::out_of_range(Prefix("GetRemoteComputedBlockIds") + "computedLens " +
                                    std::to_string(computedLens) + " exceeds the " + std::to_string(ids.size()) +
                                    " blocks of sequence " + std::to_string(seq->seqId_));
        }
        std::vector<HashValue> hashes = GetSeqHashValues(seq->seqId_);
        // As a local hit: full blocks within the first len-1 tokens, so the prefill computes at
        // least one token (the one that samples the next).
        size_t tokens = static_cast<size_t>(s.numTokens);
        size_t limit = std::min(hashes.size(), tokens == 0 ? 0 : (tokens - 1) / blockSize_);
        std::vector<std::string> keys;
        for (size_t i = computedLens; i < limit && hashes[i] != mindie_llm::INVALID_HASH_VALUE; ++i) {
            for (uint32_t tp = 0; tp < tpSize; ++tp) {
                keys.push_back(std::to_string(hashes[i]) + "_" + std::to_string(tp) + "_" + std::to_string(tpSize) +
                               "_" + modelName);
            }
        }
        size_t run = 0;
        if (!keys.empty()) {
            // A pool that fails (throws, or answers another number of keys) answers no hit: the
            // engine computes those blocks, and the failure is counted.
            std::vector<bool> held;
            try {
                held = poolLookup_(keys);
            } catch (const std::exception &) {
                held.clear();
            }
            if (held.size() != keys.size()) {
                poolLookupFailures_.fetch_add(1, std::memory_order_relaxed);
                held.clear();
            }
            while (run < held.size() && held[run]) {
                ++run;
            }
            run /= tpSize;  // a block counts when every rank's entry is there
            poolHitBlocks_.fetch_add(run, std::memory_order_relaxed);
        }
        ids.resize(computedLens + run);
        lists.push_back(std::move(ids));
    }
    return CommonPrefix(std::move(lists));
}

std::vector<size_t> KvshareManagerBase::GetTokenCountPerRank(SequenceId seqId) const {
    return {static_cast<size_t>(TokensOrThrow(seqId, "GetTokenCountPerRank"))};
}

size_t KvshareManagerBase::GetLatestAppendedRankId(SequenceId seqId) const {
    (void)TokensOrThrow(seqId, "GetLatestAppendedRankId");
    return 0;
}

size_t KvshareManagerBase::GetAppendedBlockRankId(SequenceId seqId) const {
    (void)TokensOrThrow(seqId, "GetAppendedBlockRankId");
    return 0;
}

bool KvshareManagerBase::IsAppendBlock(SequenceId) {
    throw Unsupported("sequence/context parallel (IsAppendBlock)");
}

bool KvshareManagerBase::CanAppendSlotNew(const SequenceGroupSPtr &) const {
    throw Unsupported("sequence/context parallel (CanAppendSlotNew)");
}

void KvshareManagerBase::AppendSlotNew(const SequenceGroupSPtr &) {
    throw Unsupported("sequence/context parallel (AppendSlotNew)");
}

void KvshareManagerBase::AppendTokenToLatestRank(SequenceId, const std::vector<TokenId> &) {
    throw Unsupported("sequence/context parallel (AppendTokenToLatestRank)");
}

std::vector<size_t> KvshareManagerBase::GetAllrankComputedBlockNum(const std::vector<SequenceSPtr> &seqs) {
    return {GetCommonComputedBlockIds(seqs).size()};
}

std::vector<size_t> KvshareManagerBase::GetAllRankRemoteComputedBlockIds(const std::vector<SequenceSPtr> &,
                                                                          std::vector<size_t> &, std::string) {
    throw Unsupported("KV pool with sequence/context parallel (GetAllRankRemoteComputedBlockIds; one rank only)");
}

size_t KvshareManagerBase::GetLocalDPRank() const { return localDPRank_; }

void KvshareManagerBase::LwdInitCloudBlockManager(const BlockManagerConfig &, size_t) {
    throw Unsupported("layerwise cloud block manager (LwdInitCloudBlockManager)");
}

void KvshareManagerBase::LwdGetCloudRankedBlockIds(SequenceId, std::vector<std::vector<BlockId>> &) const {
    throw Unsupported("layerwise cloud block manager (LwdGetCloudRankedBlockIds)");
}

size_t KvshareManagerBase::LwdGetCloudLatestAppendedRankId(SequenceId) const {
    throw Unsupported("layerwise cloud block manager (LwdGetCloudLatestAppendedRankId)");
}

size_t KvshareManagerBase::LwdGetCloudAppendedBlockRankId(SequenceId) const {
    throw Unsupported("layerwise cloud block manager (LwdGetCloudAppendedBlockRankId)");
}

std::vector<size_t> KvshareManagerBase::LwdGetCloudTokenCountPerRank(SequenceId) const {
    throw Unsupported("layerwise cloud block manager (LwdGetCloudTokenCountPerRank)");
}

}  // namespace kvshare_mindie
