// kvshare adapter for MindIE-LLM: every BlockSpaceManager method on top of kvshare's C ABI.
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

namespace {

// ---- kvshare enums carried as uint32_t fields: one decoding function per enum ----
// The header defines their values (KVS_TIER_*, KVS_COPY_KIND_*); struct fields hold them as
// uint32_t so that every C compiler agrees on the layout. Each field is decoded here, once, into
// a C++ enum, and a value the header does not define is refused (a newer library than this
// adapter was built against) instead of being read as some other case.

enum class Tier { Device, Host };

// `kvs_seq_info.tier` (a `kvs_tier` value).
Tier DecodeTier(uint32_t raw, const char *method) {
    switch (raw) {
        case KVS_TIER_DEVICE:
            return Tier::Device;
        case KVS_TIER_HOST:
            return Tier::Host;
        default:
            throw std::runtime_error(Prefix(method) + std::to_string(raw) + " is not a kvs_tier");
    }
}

enum class CopyKind { DeviceToDevice, DeviceToHost, HostToDevice };

// `kvs_copy.kind` (a `kvs_copy_kind` value).
CopyKind DecodeCopyKind(uint32_t raw, const char *method) {
    switch (raw) {
        case KVS_COPY_KIND_DEVICE_TO_DEVICE:
            return CopyKind::DeviceToDevice;
        case KVS_COPY_KIND_DEVICE_TO_HOST:
            return CopyKind::DeviceToHost;
        case KVS_COPY_KIND_HOST_TO_DEVICE:
            return CopyKind::HostToDevice;
        default:
            throw std::runtime_error(Prefix(method) + std::to_string(raw) + " is not a kvs_copy_kind");
    }
}

}  // namespace

Unsupported::Unsupported(const std::string &feature)
    : std::runtime_error("kvshare MindIE adapter: not supported yet: " + feature) {}

KvshareBlockManager::KvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank)
    : KvshareManagerBase(localDPRank, config.enableCaching),
      blockSize_(config.cacheBlockSize),
      npuBlockNum_(config.npuBlockNum),
      cpuIdOffset_(0),
      allocatableNpuBlocks_(0),
      speculativeSlots_(config.speculativeSlots) {
    if (config.rankSize != 1 || config.hostSize != 1) {
        throw Unsupported("sequence/context parallel (rankSize " + std::to_string(config.rankSize) + ", hostSize " +
                          std::to_string(config.hostSize) + "; only 1 is supported)");
    }
    if (config.enableKvPool) {
        throw Unsupported("KV pool (enableKvPool)");
    }
    if (config.cacheType != KvCacheType::TOKEN) {
        throw Unsupported("KV cache type other than TOKEN");
    }
    if (config.reservedBlockNum > config.npuBlockNum) {
        throw std::invalid_argument(Prefix("constructor") + "reservedBlockNum is larger than npuBlockNum");
    }
    if (blockSize_ == 0) {
        throw std::invalid_argument(Prefix("constructor") + "cacheBlockSize must be greater than 0");
    }
    allocatableNpuBlocks_ = config.npuBlockNum - config.reservedBlockNum;
    cpuIdOffset_ = allocatableNpuBlocks_;
    constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
    if (blockSize_ > kMax || allocatableNpuBlocks_ > kMax || config.cpuBlockNum > kMax) {
        throw std::invalid_argument(Prefix("constructor") + "block size or block count exceeds 2^32-1");
    }
    if (kvs_abi_version() != KVS_ABI_VERSION) {
        throw std::runtime_error(Prefix("constructor") + "libkvshare ABI version " +
                                 std::to_string(kvs_abi_version()) + " differs from the header's " +
                                 std::to_string(KVS_ABI_VERSION));
    }
    kvs_config c = kvs_config_default();
    c.page_size = static_cast<uint32_t>(blockSize_);
    c.num_device_pages = static_cast<uint32_t>(allocatableNpuBlocks_);
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
    kvs_status st = kvs_cache_new(&c, &cache_);
    if (st != KVS_STATUS_OK) {
        throw std::invalid_argument(Prefix("constructor") + kvs_status_str(st) + ": " + kvs_last_error_message());
    }
}

KvshareBlockManager::~KvshareBlockManager() { kvs_cache_free(cache_); }

mindie_llm::BlockSpaceManagerSPtr CreateKvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank) {
    // MindIE's scheduler builds one self-attention config per kvCacheDesc and sets its cacheType:
    // a SLIDING_WINDOW one is a cache of one window group.
    if (config.cacheType == KvCacheType::SLIDING_WINDOW) {
        return CreateKvshareHybridBlockManager(config, localDPRank);
    }
    return std::make_shared<KvshareBlockManager>(config, localDPRank);
}

// ---- helpers ----

bool KvshareBlockManager::Shape(SequenceId seqId, SeqShape &out) const {
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

KvshareBlockManager::SeqShape KvshareBlockManager::ShapeOrThrow(SequenceId seqId, const char *method) const {
    SeqShape s{};
    if (!Shape(seqId, s)) {
        UnknownSeq(method, seqId);
    }
    return s;
}

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
    std::vector<uint32_t> pages(tokens.size() / blockSize_ + 1);
    size_t numPages = 0;
    size_t matched = 0;
    Check(kvs_prefix_match(cache_, 0, tokens.data(), tokens.size(), extra, tokens.size() - 1, false, pages.data(),
                           pages.size(), &numPages, &matched),
          method);
    return matched;
}

std::vector<uint32_t> KvshareBlockManager::Pages(SequenceId seqId, const SeqShape &shape) const {
    std::vector<uint32_t> pages(static_cast<size_t>(shape.numPages));
    size_t n = 0;
    Check(kvs_seq_pages(cache_, 0, KvsId(seqId), pages.data(), pages.size(), &n), "kvs_seq_pages");
    pages.resize(n);
    return pages;
}

size_t KvshareBlockManager::AppendNeed(SequenceId seqId, size_t newTokens, size_t lookahead, size_t *copies) const {
    // Exactly what kvs_seq_append will take: new capacity pages for tokens + lookahead slots, plus
    // one copy-on-write page per shared page the new tokens land in (kvshare's own count).
    size_t need = 0;
    Check(kvs_seq_append_need(cache_, KvsId(seqId), newTokens, lookahead, &need, copies), "kvs_seq_append_need");
    return need;
}

KvshareBlockManager::AppendCost KvshareBlockManager::CostOfAppend(SequenceId seqId, size_t newTokens) const {
    size_t copies = 0;
    size_t all = AppendNeed(seqId, newTokens, speculativeSlots_, &copies);
    if (copies == 0) {
        return AppendCost{all, 0};
    }
    // The tokens first (their copy-on-write destinations among them), the lookahead slots after.
    return AppendCost{all, AppendNeed(seqId, newTokens, 0, nullptr)};
}

size_t KvshareBlockManager::AvailableDevicePages() const {
    // Evictable cached blocks count as free, as in MindIE's prefix-caching allocator.
    size_t pages = 0;
    Check(kvs_cache_available(cache_, KVS_TIER_DEVICE, 0, &pages), "kvs_cache_available");
    return pages;
}

size_t KvshareBlockManager::FreeDevicePages() const { return AvailableDevicePages() + QuarantineFree(); }

size_t KvshareBlockManager::QuarantineFree() const {
    std::lock_guard<std::mutex> lock(quarantineMu_);
    // A held-back page that only this manager holds is what the swap-out freed (or what its
    // other holders freed since): free once the step ends.
    std::unordered_map<uint32_t, uint32_t> holds;
    for (uint32_t p : quarantine_) {
        ++holds[p];
    }
    size_t free = 0;
    for (const auto &h : holds) {
        kvs_page_info info{};
        Check(kvs_page_get_info(cache_, KVS_TIER_DEVICE, 0, h.first, &info), "kvs_page_get_info");
        free += info.refcount == h.second ? 1 : 0;
    }
    return free;
}

void KvshareBlockManager::ReleaseQuarantine() {
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

size_t KvshareBlockManager::FreeHostPages() const {
    // Host pages holding swapped-out content stay cached (indexed) once released: like MindIE's
    // CPU allocator, they count as free.
    size_t pages = 0;
    Check(kvs_cache_available(cache_, KVS_TIER_HOST, 0, &pages), "kvs_cache_available");
    return pages;
}

// ---- admission ----

AllocStatus KvshareBlockManager::CanAllocate(const SequenceGroupSPtr &seqGroup) const {
    RequireGroup(seqGroup, "CanAllocate");
    std::vector<SequenceSPtr> waiting = seqGroup->GetFirstSequence(SequenceStatus::WAITING);
    if (waiting.empty()) {
        return AllocStatus::NEVER;
    }
    // Conservative like MindIE: prefix hits are not subtracted. Enough for kvs_seq_begin, which
    // needs (pages not hit) + (hit pages that are only cached) <= free + cached.
    size_t need = CeilDiv(NumTokens(*waiting.at(0)), blockSize_);
    if (allocatableNpuBlocks_ < need) {
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
    // this step's swap-outs may be among them when nothing else is free.
    kvs_status begun = kvs_seq_begin(cache_, KvsId(first->seqId_), tokens.data(), tokens.size(), extra.ptr, maxMatch,
                                     0, &info);
    if (begun == KVS_STATUS_NO_SPACE && QuarantineFree() > 0) {
        ReleaseQuarantine();
        begun = kvs_seq_begin(cache_, KvsId(first->seqId_), tokens.data(), tokens.size(), extra.ptr, maxMatch, 0,
                              &info);
    }
    Check(begun, "Allocate");
    for (size_t i = 1; i < waiting.size(); ++i) {
        kvs_status st = kvs_seq_fork(cache_, KvsId(first->seqId_), KvsId(waiting[i]->seqId_));
        if (st != KVS_STATUS_OK) {
            std::string msg = Prefix("Allocate") + kvs_status_str(st) + ": " + kvs_last_error_message();
            for (size_t k = 0; k < i; ++k) {
                (void)kvs_seq_free(cache_, KvsId(waiting[k]->seqId_));
            }
            throw std::runtime_error(msg);
        }
    }
    if (CachingEnabled()) {
        // MindIE's hit rate: one record per full prompt block, a hit when the block was cached.
        uint64_t full = tokens.size() / blockSize_;
        uint64_t hits = info.matched_tokens / blockSize_;
        hitBlocks_ += hits;
        missBlocks_ += full - hits;
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
        // for this step's swap-outs may be among them.
        if (cost.all > AvailableDevicePages()) {
            ReleaseQuarantine();
        }
        Check(kvs_seq_append(cache_, id, tokens.data(), tokens.size(), speculativeSlots_, copies, 4, &n),
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
        Check(kvs_seq_append(cache_, id, tokens.data(), tokens.size(), 0, copies, 4, &n), "AppendSlot");
        if (speculativeSlots_ > 0) {
            if (AppendNeed(seq->seqId_, 0, speculativeSlots_, nullptr) > AvailableDevicePages()) {
                ReleaseQuarantine();
            }
            size_t none = 0;  // no token is written: nothing to copy
            Check(kvs_seq_append(cache_, id, nullptr, 0, speculativeSlots_, nullptr, 0, &none), "AppendSlot");
        }
    }
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
    Check(kvs_seq_fork(cache_, KvsId(parentSeq->seqId_), KvsId(childSeq->seqId_)), "Fork");
}

// ---- swap ----

size_t KvshareBlockManager::CostOfSwapOut(const std::vector<SequenceSPtr> &seqs, const char *method,
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

bool KvshareBlockManager::CanSwapOut(const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "CanSwapOut");
    bool onHost = false;
    size_t need = CostOfSwapOut(seqGroup->GetFirstSequence(SequenceStatus::RUNNING), "CanSwapOut", &onHost);
    return !onHost && need <= FreeHostPages();
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareBlockManager::SwapOut(
    const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "SwapOut");
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
        SeqShape s = ShapeOrThrow(seq->seqId_, "SwapOut");
        std::vector<kvs_copy> copies(static_cast<size_t>(s.numPages));
        size_t n = 0;
        // Hold the device blocks until the step ends: the worker copies them to the CPU after the
        // step's copy-on-write pairs, which must not write into them (see ReleaseQuarantine).
        std::vector<uint32_t> pages = Pages(seq->seqId_, s);
        Check(kvs_pages_acquire(cache_, 0, pages.data(), pages.size()), "SwapOut");
        kvs_status st = kvs_seq_swap_out(cache_, KvsId(seq->seqId_), copies.data(), copies.size(), &n);
        std::vector<uint32_t> copied;
        // Blocks whose content the CPU held already are shared: no pair, nothing to copy.
        for (size_t i = 0; st == KVS_STATUS_OK && i < n; ++i) {
            if (DecodeCopyKind(copies[i].kind, "SwapOut") == CopyKind::DeviceToHost) {
                out.emplace_back(static_cast<PhysicalBlockId>(copies[i].src_page),
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

KvshareBlockManager::SwapInCost KvshareBlockManager::CostOfSwapIn(const std::vector<SequenceSPtr> &seqs,
                                                                 size_t lookahead, bool withPending,
                                                                 const char *method) const {
    // Swap-in copies run before the step's swap-outs: never into a block one of them reads.
    SwapInCost c{0, 0, AvailableDevicePages()};
    size_t perSeq = 0;                 // the sequences' swap-ins counted one by one
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
        for (uint32_t p : Pages(seq->seqId_, s)) {
            held.insert(p);
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

AllocStatus KvshareBlockManager::CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t numLookheadSlots) {
    RequireGroup(seqGroup, "CanSwapIn");
    SwapInCost c = CostOfSwapIn(seqGroup->GetFirstSequence(SequenceStatus::SWAPPED), numLookheadSlots, true,
                                "CanSwapIn");
    if (c.worst > allocatableNpuBlocks_) {
        return AllocStatus::NEVER;
    }
    // Pages still cached on the device are shared back instead of copied (kvs_seq_swap_in_need).
    return c.pages <= c.free ? AllocStatus::OK : AllocStatus::LATER;
}

std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> KvshareBlockManager::SwapIn(
    const SequenceGroupSPtr &seqGroup) {
    RequireGroup(seqGroup, "SwapIn");
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
        std::vector<kvs_copy> copies(static_cast<size_t>(s.numPages));
        size_t n = 0;
        Check(kvs_seq_swap_in(cache_, KvsId(seq->seqId_), copies.data(), copies.size(), &n), "SwapIn");
        uint64_t copiedFull = 0;
        for (size_t i = 0; i < n; ++i) {
            if (DecodeCopyKind(copies[i].kind, "SwapIn") == CopyKind::HostToDevice) {
                out.emplace_back(static_cast<PhysicalBlockId>(copies[i].src_page),
                                 static_cast<PhysicalBlockId>(copies[i].dst_page));
                copiedFull += copies[i].num_tokens == blockSize_ ? 1 : 0;
            }
        }
        // MindIE re-allocates every full block at SwapIn through its prefix-caching allocator and
        // records a hit (the content is cached on the NPU: kvshare shares that page, no copy) or a
        // miss (a copy) for each.
        uint64_t full = s.numTokens / blockSize_;
        hits += full - copiedFull;
        misses += copiedFull;
    }
    if (CachingEnabled()) {
        hitBlocks_ += hits;
        missBlocks_ += misses;
    }
    return out;
}

void KvshareBlockManager::Free(SequenceId seqId) {
    kvs_status st = kvs_seq_free(cache_, KvsId(seqId));
    if (st != KVS_STATUS_OK && st != KVS_STATUS_SEQ_NOT_FOUND) {  // unknown / already freed: no-op
        Fail("Free", st);
    }
}

// ---- block tables ----

std::vector<BlockIds> KvshareBlockManager::GetBlockIds(SequenceId seqId) const {
    SeqShape s = ShapeOrThrow(seqId, "GetBlockIds");
    std::vector<uint32_t> pages = Pages(seqId, s);
    BlockIds ids;
    ids.reserve(pages.size());
    BlockId offset = s.onHost ? static_cast<BlockId>(cpuIdOffset_) : 0;
    for (uint32_t p : pages) {
        ids.push_back(static_cast<BlockId>(p) + offset);
    }
    return {ids};
}

void KvshareBlockManager::GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const {
    BlockIds ids = GetBlockIds(seqId).at(0);
    rankedBlockIds.clear();
    for (BlockId id : ids) {
        rankedBlockIds.push_back(RankedBlockId{id, 0});
    }
}

void KvshareBlockManager::GetRankedBlockIds(SequenceId seqId,
                                            std::vector<std::vector<BlockId>> &rankedBlockIds) const {
    BlockIds ids = GetBlockIds(seqId).at(0);
    rankedBlockIds.clear();
    rankedBlockIds.push_back(std::move(ids));
}

// ---- counts ----

size_t KvshareBlockManager::GetNumFreeNpuBlocks() const { return FreeDevicePages(); }

size_t KvshareBlockManager::GetNumFreeCpuBlocks() const { return FreeHostPages(); }

size_t KvshareBlockManager::GetTotalNpuBlocks() const { return npuBlockNum_; }

// ---- prefix cache ----

void KvshareBlockManager::AccessAllblocksInSeq(const SequenceSPtr &seq, float) {
    RequireSeq(seq, "AccessAllblocksInSeq");
    // kvshare keeps its own LRU order (pages become evictable when released, a sequence's last
    // page first); the scheduler's timestamps are not needed. Unknown ids are refused as MindIE
    // does when prefix caching is on.
    SeqShape s{};
    if (CachingEnabled() && !Shape(seq->seqId_, s)) {
        throw std::runtime_error(Prefix("AccessAllblocksInSeq") + "unknown sequence id " +
                                 std::to_string(seq->seqId_));
    }
}

std::vector<BlockId> KvshareBlockManager::GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) {
    std::vector<BlockId> common;
    bool firstSeq = true;
    for (const auto &seq : seqs) {
        RequireSeq(seq, "GetCommonComputedBlockIds");
        BlockIds all = GetBlockIds(seq->seqId_).at(0);
        size_t cached = GetNumCachedTokens(seq);
        if (cached % blockSize_ != 0) {
            throw std::runtime_error(Prefix("GetCommonComputedBlockIds") +
                                     "the number of cached tokens is not a multiple of the block size");
        }
        all.resize(std::min(all.size(), cached / blockSize_));
        if (firstSeq) {
            common = std::move(all);
            firstSeq = false;
            continue;
        }
        size_t j = 0;
        while (j < common.size() && j < all.size() && common[j] == all[j]) {
            ++j;
        }
        common.resize(j);
    }
    return common;
}

void KvshareBlockManager::MarkBlocksAsComputed() {
    // The step is scheduled: its swap-outs' blocks are ordinary free blocks from the next one on.
    ReleaseQuarantine();
    Check(kvs_cache_commit(cache_), "MarkBlocksAsComputed");
}

float KvshareBlockManager::GetPrefixCacheHitRate() const {
    if (!CachingEnabled()) {
        return -1.0F;  // what MindIE's manager reports without prefix caching
    }
    uint64_t hits = hitBlocks_.load();
    uint64_t total = hits + missBlocks_.load();
    return total == 0 ? 0.0F : static_cast<float>(static_cast<double>(hits) / static_cast<double>(total));
}

bool KvshareBlockManager::ResetPrefixCache() const {
    if (!CachingEnabled()) {
        return true;
    }
    kvs_stats s{};
    Check(kvs_cache_stats(cache_, &s), "ResetPrefixCache");
    if (s.device_pages_in_use > QuarantineFree()) {
        return false;  // as in MindIE: only when no block is in use
    }
    Check(kvs_prefix_clear(cache_), "ResetPrefixCache");
    return true;
}

void KvshareBlockManager::ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                                     size_t replacedPlaceHolderNum) {
    RequireSeq(seq, "ReplaceTrailingPlaceHolder");
    // MindIE's order: the counts against the sequence's own tokens first, then the id.
    if (trailingPlaceHolderNum < replacedPlaceHolderNum || NumTokens(*seq) < trailingPlaceHolderNum) {
        throw std::runtime_error(Prefix("ReplaceTrailingPlaceHolder") +
                                 "tokenIds size is less than replacement size");
    }
    (void)ShapeOrThrow(seq->seqId_, "ReplaceTrailingPlaceHolder");
    // kvshare has no call to rewrite tokens already in a sequence, so pages that held a
    // placeholder stay unhashed (never prefix hits). That only loses hits: block ids and KV are
    // unaffected. MindIE itself never calls this (USE_PREFIX_CACHE_WITH_PLACE_HOLDER is false).
}

}  // namespace kvshare_mindie
