// kvshare adapter for MindIE-LLM: a `mindie_llm::BlockSpaceManager` whose KV-cache bookkeeping
// (blocks, refcounts, prefix cache, copy-on-write, swap) runs in kvshare (one `kvs_cache` per
// manager).
//
// Build it against MindIE's real headers (block_manager_interface.h and what it includes) or
// against the project's compatibility declarations in integration/mindie/compat/; the source is
// the same. See docs/mindie.md for what is supported and how to deploy it.
//
// Thread safety: like MindIE's own manager, one instance is meant to be driven by one scheduler
// thread; concurrent calls on one instance are nevertheless safe (kvshare locks internally, the
// adapter's own counters are atomic, and the group manager runs its calls one at a time), but a
// multi-call sequence such as CanAllocate + Allocate is only consistent when nothing else changes
// the cache in between.
#ifndef KVSHARE_MINDIE_H
#define KVSHARE_MINDIE_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "block_manager_interface.h"

struct kvs_cache;
struct kvs_extra_keys;
struct kvs_config;

namespace kvshare_mindie {

using mindie_llm::AllocStatus;
using mindie_llm::BlockId;
using mindie_llm::BlockIds;
using mindie_llm::BlockManagerConfig;
using mindie_llm::HashValue;
using mindie_llm::PhysicalBlockId;
using mindie_llm::RankedBlockId;
using mindie_llm::SequenceGroupSPtr;
using mindie_llm::SequenceId;
using mindie_llm::SequenceSPtr;
using mindie_llm::TokenId;

// MindIE's KV pool as a manager asks it: for each key, whether the pool holds it (what
// `mindie_llm::MemPool::LookUp` answers, one `batch_exist` of MindIE's Python pool). The patched
// MindIE factory wraps MindIE's own MemPool in one (docs/mindie.md, "KV pool"). Called with the
// keys of one sequence at a time; must return one answer per key.
using KvPoolLookup = std::function<std::vector<bool>(const std::vector<std::string> &keys)>;

// Thrown by the methods of features the adapter does not support (the message names the
// feature). Derives from std::runtime_error, like the errors of MindIE's own manager.
class Unsupported : public std::runtime_error {
   public:
    explicit Unsupported(const std::string &feature);
};

// The one base of the kvshare managers: everything both answer alike, on one `kvs_cache` (one
// group for KvshareBlockManager, one per sub-manager for KvshareHybridBlockManager). Defined in
// src/kvshare_manager_base.cpp (sequence lookups, block ids, the cached-token policy, prefix
// cache, statistics, swap out/in with the host tier, MindIE's block hash values and KV-pool
// lookups, one rank, no layerwise cloud manager). Each manager supplies `Lookup`
// (what MindIE counts of a live sequence), `ProbeCachedTokens` (its prefix lookup) and the
// methods that differ: admission, growth, Fork, Free, block ids and block counts.
//
// Swapping needs one group: MindIE's swap pairs are bare block ids, and with several groups (each
// its own ids) a pair cannot say whose tensor it copies. A manager of several groups answers
// CanSwapOut false and CanSwapIn NEVER (MindIE's policy then preempts by recompute), and SwapOut /
// SwapIn throw `Unsupported`.
class KvshareManagerBase : public mindie_llm::BlockSpaceManager {
   public:
    ~KvshareManagerBase() override;
    KvshareManagerBase(const KvshareManagerBase &) = delete;
    KvshareManagerBase &operator=(const KvshareManagerBase &) = delete;

    bool CanSwapOut(const SequenceGroupSPtr &seqGroup) override;
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapOut(const SequenceGroupSPtr &seqGroup) override;
    AllocStatus CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t numLookheadSlots) override;
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapIn(const SequenceGroupSPtr &seqGroup) override;
    void GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const override;
    void GetRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const override;
    size_t GetNumFreeCpuBlocks() const override;
    void AccessAllblocksInSeq(const SequenceSPtr &seq, float accessTime) override;
    std::vector<BlockId> GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) override;
    void MarkBlocksAsComputed() override;
    float GetPrefixCacheHitRate() const override;
    bool ResetPrefixCache() const override;
    void ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                    size_t replacedPlaceHolderNum) override;
    size_t GetNumCachedTokens(const SequenceSPtr &seq) override;
    size_t GetSeqNumCachedTokens(const SequenceSPtr &seq) override;
    bool CanAppendSlotNew(const SequenceGroupSPtr &seqGroup) const override;
    void AppendSlotNew(const SequenceGroupSPtr &seqGroup) override;
    void AppendTokenToLatestRank(SequenceId seqId, const std::vector<TokenId> &tokens) override;
    std::vector<std::vector<HashValue>> GetRankedHashValues(SequenceId seqId) const override;
    std::vector<HashValue> GetSeqHashValues(SequenceId seqId) const override;
    std::vector<size_t> GetTokenCountPerRank(SequenceId seqId) const override;
    size_t GetLatestAppendedRankId(SequenceId seqId) const override;
    size_t GetAppendedBlockRankId(SequenceId seqId) const override;
    bool IsAppendBlock(SequenceId seqId) override;
    std::vector<size_t> GetAllrankComputedBlockNum(const std::vector<SequenceSPtr> &seqs) override;
    std::vector<BlockId> GetRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs, size_t computedLens,
                                                   uint32_t tpSize, std::string modelName) override;
    std::vector<size_t> GetAllRankRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs,
                                                         std::vector<size_t> &computedBlocksNum,
                                                         std::string modelName) override;
    size_t GetLocalDPRank() const override;
    void LwdInitCloudBlockManager(const BlockManagerConfig &lwdCloudConfig, size_t localDPRank) override;
    void LwdGetCloudRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const override;
    size_t LwdGetCloudLatestAppendedRankId(SequenceId seqId) const override;
    size_t LwdGetCloudAppendedBlockRankId(SequenceId seqId) const override;
    std::vector<size_t> LwdGetCloudTokenCountPerRank(SequenceId seqId) const override;

    // Not part of MindIE's interface: the kvshare cache behind this manager, one group per
    // sub-manager in order (for tests and diagnostics: kvs_cache_check, kvs_cache_stats,
    // kvs_seq_pages). Owned by the manager.
    kvs_cache *Cache() const { return cache_; }
    size_t NumGroups() const { return pageOffset_.size(); }
    // Device page p of group `group` is MindIE block p - PageOffset(group): 0 for the block
    // manager; 1 (the null page) plus the pages that size a smaller group for the group manager.
    // Throws std::out_of_range for a group the manager does not have.
    uint32_t PageOffset(size_t group) const { return pageOffset_.at(group); }
    // KV-pool lookups of GetRemoteComputedBlockIds that failed (the pool threw or answered
    // another number of keys; each answered no hit), and the blocks its answers added to local
    // hits.
    uint64_t PoolLookupFailures() const { return poolLookupFailures_.load(std::memory_order_relaxed); }
    uint64_t PoolHitBlocks() const { return poolHitBlocks_.load(std::memory_order_relaxed); }

   protected:
    KvshareManagerBase(size_t localDPRank, bool enableCaching, size_t blockSize, size_t speculativeSlots)
        : localDPRank_(localDPRank),
          enableCaching_(enableCaching),
          blockSize_(blockSize),
          speculativeSlots_(speculativeSlots) {}

    // Makes the manager's cache of `config` (throws std::runtime_error for a libkvshare of
    // another ABI, std::invalid_argument naming `method` for a config kvshare refuses). Every
    // group's page offset starts at 1 with the null page, 0 without. `deviceBlocks`: the blocks
    // a sequence can have (NEVER above); `cpuIdOffset`: MindIE's first global CPU block id.
    void CreateCache(const kvs_config &config, size_t deviceBlocks, size_t cpuIdOffset, const char *method);

    // What MindIE counts of a live sequence.
    struct SeqCounts {
        uint64_t numTokens;      // the tokens its tables cover
        uint64_t matchedTokens;  // the prefix hit fixed when it was allocated
    };
    // The counts of `seqId`; false (and `out` untouched) if the manager has no such sequence.
    virtual bool Lookup(SequenceId seqId, SeqCounts &out) const = 0;
    // Tokens of `tokens` (a prompt not allocated yet, not empty; `extra` its extra keys or null)
    // that Allocate would share now, at most len-1: a lookup that takes no references and counts
    // nothing in the statistics. Errors name `method`.
    virtual size_t ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                                     const char *method) const = 0;
    // `Lookup`, with std::out_of_range naming `method` for an unknown id (as MindIE's manager,
    // which looks sequences up with unordered_map::at).
    SeqCounts CountsOrThrow(SequenceId seqId, const char *method) const;
    uint64_t TokensOrThrow(SequenceId seqId, const char *method) const {
        return CountsOrThrow(seqId, method).numTokens;
    }

    // A kvshare sequence's shape.
    struct SeqShape {
        uint64_t numTokens;      // tokens kvshare holds
        uint64_t numPages;       // positions in each group's table
        uint64_t matchedTokens;  // its hit at kvs_seq_begin
        bool onHost;
    };
    // Shape of a live sequence; false if kvshare has no sequence with that id.
    bool Shape(SequenceId seqId, SeqShape &out) const;
    SeqShape ShapeOrThrow(SequenceId seqId, const char *method) const;
    // Tokens of a live sequence (shape `s`) whose KV kvshare counts as written once SwapOut has
    // reported them (ReportComputed): a swap shares the full blocks within them by content. All
    // it holds unless the manager marks fewer.
    virtual size_t WrittenTokens(SequenceId seqId, const SeqShape &s) const;
    // Tells kvshare the tokens of `seq` whose KV is computed, before SwapOut moves it. Nothing
    // unless the manager marks them.
    virtual void ReportComputed(const SequenceSPtr &seq);
    // Group `group`'s table of kvshare pages (device or host, as the sequence is).
    std::vector<uint32_t> Pages(SequenceId seqId, size_t group, const SeqShape &shape) const;
    // Group `group`'s table as MindIE block ids, one per position: device blocks, or global CPU
    // ids while swapped out; INVALID_BLOCKID at a position the group released.
    std::vector<BlockId> TableIds(SequenceId seqId, size_t group, const SeqShape &shape) const;
    // Whether `page` of a table on `onHost` is a released position (not a block).
    bool Released(uint32_t page, bool onHost) const;

    // Free + evictable device pages kvshare can hand out now to group `group`.
    size_t AvailableDevicePages(size_t group = 0) const;
    size_t FreeHostPages() const;
    // MindIE's worker executes a step's copy_blocks before its swaps, so a device page a SwapOut
    // of this step copies from may not be written by this step's copy-on-write pairs nor swap-in
    // copies. SwapOut takes a reference on the sequences' device pages before it swaps them out
    // and keeps it until the step ends (MarkBlocksAsComputed); an allocation that needs those
    // pages and writes no copy into them (new blocks, written by the forward after the swaps)
    // releases them one at a time, only as many as it lacks (ReleaseQuarantinedPage), so that
    // it takes every page it releases and none is left free for a later copy-on-write of the
    // step. QuarantineFree: the held-back pages nothing else holds (free once the step ends;
    // MindIE counts them as free).
    size_t QuarantineFree() const;
    void ReleaseQuarantine();
    // Releases one held-back page nothing else holds (one more available device page); false
    // when there is none.
    bool ReleaseQuarantinedPage();
    // Whether the quarantine's `holds` references are all that hold device `page` (called
    // with quarantineMu_ held).
    bool OnlyQuarantineHolds(uint32_t page, size_t holds) const;
    // The live sequences (tracked at Allocate, Fork and AppendSlot): the tokens their tables
    // cover (MindIE's length at the last of those calls) and the sequence itself, whose computed
    // tokens (numComputedTokens_) Free and SwapOut read. Thread-safe on its own.
    struct Live {
        size_t tokens;
        std::weak_ptr<mindie_llm::Sequence> seq;
    };
    // Tracks `seq` (or grows what a tracked one covers to its current length).
    void Track(const SequenceSPtr &seq);
    // The tracked entry of `seqId`; false (and `out` untouched) if there is none.
    bool Tracked(SequenceId seqId, Live &out) const;
    // Stops tracking `seqId`; false if it was not tracked, else `out` is what was tracked.
    bool Untrack(SequenceId seqId, Live &out);
    // Pages the manager holds for its whole life (the group manager's sizing pages).
    void SetHeldPages(size_t group, size_t pages);
    // The KV pool GetRemoteComputedBlockIds asks (none: the pool is off and it throws).
    void SetPoolLookup(KvPoolLookup lookup) { poolLookup_ = std::move(lookup); }

    // `kvs_seq_free`; an unknown id or a double free is a no-op, as in MindIE.
    void FreeSeq(SequenceId seqId, const char *method);
    // MindIE's hit rate: `hits` blocks shared, `misses` computed or copied.
    void CountHits(uint64_t hits, uint64_t misses);
    bool CachingEnabled() const { return enableCaching_; }
    size_t BlockSize() const { return blockSize_; }
    size_t SpeculativeSlots() const { return speculativeSlots_; }
    size_t DeviceBlocks() const { return deviceBlocks_; }

   private:
    // Whether the manager can swap (one group).
    bool Swaps() const { return NumGroups() == 1; }
    // What swapping `seqs` out takes from the free + evictable host pages: new host pages plus
    // the cached host pages it shares (kvs_seq_swap_out_need); exact for one sequence, an upper
    // bound for a group. Sets *onHost (and returns 0) if a sequence is swapped out already.
    size_t CostOfSwapOut(const std::vector<SequenceSPtr> &seqs, const char *method, bool *onHost) const;
    // The device blocks a running group would need to swap back in and take its pending append
    // with nothing cached on the device; CanSwapOut says no above the device's blocks (CanSwapIn
    // would say NEVER).
    size_t BlocksToResume(const std::vector<SequenceSPtr> &seqs, const char *method) const;
    // What swapping `seqs` back in takes from the free + evictable device pages: the pages it
    // copies and the cached pages it shares (which leave the evictable count), plus the pages of
    // the append that follows (`withPending`: the sequence's full length, pending token included,
    // plus max(lookahead, speculativeSlots) slots). Blocks the group's sequences share count once:
    // exact for one sequence, an upper bound for a group. `method` names errors.
    struct SwapInCost {
        size_t pages;  // device pages it takes from the free + evictable ones
        size_t worst;  // with nothing cached on the device: its distinct blocks (for NEVER)
        size_t free;   // free + evictable device pages when counted
    };
    SwapInCost CostOfSwapIn(const std::vector<SequenceSPtr> &seqs, size_t lookahead, bool withPending,
                            const char *method) const;

    kvs_cache *cache_ = nullptr;
    size_t localDPRank_;
    bool enableCaching_;
    size_t blockSize_;
    size_t speculativeSlots_;
    bool nullPage_ = false;
    size_t deviceBlocks_ = 0;
    size_t cpuIdOffset_ = 0;  // first global CPU block id
    std::vector<uint32_t> pageOffset_;
    size_t heldPages_ = 0;
    std::atomic<uint64_t> hitBlocks_{0};
    std::atomic<uint64_t> missBlocks_{0};
    std::unordered_map<SequenceId, Live> live_;
    mutable std::mutex liveMu_;
    // Device pages held back since this step's swap-outs (each once per reference taken).
    std::vector<uint32_t> quarantine_;
    mutable std::mutex quarantineMu_;
    KvPoolLookup poolLookup_;
    std::atomic<uint64_t> poolLookupFailures_{0};
    std::atomic<uint64_t> poolHitBlocks_{0};
};

class KvshareBlockManager : public KvshareManagerBase {
   public:
    // Throws `Unsupported` for a configuration the adapter does not support (rankSize or
    // hostSize > 1, enableKvPool without a `poolLookup`, a cache type other than TOKEN),
    // std::invalid_argument for a bad one (reservedBlockNum > npuBlockNum, block size 0, counts
    // over 2^32-1, enableKvPool without enableCaching, a `poolLookup` with enableKvPool off, or a
    // geometry kvshare refuses) and std::runtime_error if libkvshare's ABI version differs from
    // the header's. With enableKvPool, GetRemoteComputedBlockIds asks `poolLookup`.
    explicit KvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank = 0,
                                 KvPoolLookup poolLookup = {});

    AllocStatus CanAllocate(const SequenceGroupSPtr &seqGroup) const override;
    bool Allocate(const SequenceGroupSPtr &seqGroup) override;
    bool CanAppendSlot(const SequenceGroupSPtr &seqGroup) const override;
    std::vector<std::pair<BlockId, BlockId>> AppendSlot(const SequenceSPtr &seq) override;
    void Fork(SequenceSPtr &parentSeq, SequenceSPtr &childSeq) override;
    void Free(SequenceId seqId) override;
    std::vector<BlockIds> GetBlockIds(SequenceId seqId) const override;
    size_t GetNumFreeNpuBlocks() const override;
    size_t GetTotalNpuBlocks() const override;

   private:
    bool Lookup(SequenceId seqId, SeqCounts &out) const override;
    size_t ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                             const char *method) const override;
    // Device pages an append of `newTokens` tokens and `lookahead` slots would take (capacity
    // plus copy-on-write), and in *copies the copy-on-write pairs it would return.
    size_t AppendNeed(SequenceId seqId, size_t newTokens, size_t lookahead, size_t *copies) const;
    // What AppendSlot of `newTokens` takes: `all` device pages, of which `written` must come from
    // pages no swap-out of this step reads (the append's tokens with copy-on-write: 0 without).
    struct AppendCost {
        size_t all;
        size_t written;
    };
    AppendCost CostOfAppend(SequenceId seqId, size_t newTokens) const;
    // Free + evictable device pages as MindIE counts them: those kvshare can hand out now plus
    // the held-back pages of this step's swap-outs that nothing else holds (QuarantineFree).
    size_t FreeDevicePages() const;
    // A block becomes a prefix hit once its KV is computed: kvshare is told the tokens
    // numComputedTokens_ covers (kvs_seq_set_computed, at most the `held` tokens its table
    // holds), then commits. A chunked prefill holds its whole prompt from Allocate on and
    // computes it a chunk per step.
    void MarkComputed(SequenceId seqId, const mindie_llm::Sequence &seq, size_t held, const char *method);
    size_t WrittenTokens(SequenceId seqId, const SeqShape &s) const override;
    void ReportComputed(const SequenceSPtr &seq) override;

    size_t npuBlockNum_;
};

// MindIE's KV-cache groups on one kvshare cache: a COMPOSITEBLOCKMANAGER (`config.subManagers`,
// one kvshare group per sub-manager, in order), a REQUESTSLIDINGWINDOWBLOCKMANAGER, or a
// self-attention config whose `cacheType` is SLIDING_WINDOW. A TOKEN sub-manager is a
// full-attention group; a SLIDING_WINDOW one is a sliding-window group in which each sequence
// holds at most `requestBlockWindowSize` (N) blocks: kvshare window (N-1)*cacheBlockSize + 1
// tokens, released as its KV is computed (AppendSlot calls kvs_seq_release_skipped with the
// sequence's numComputedTokens_). kvshare is given a sequence's tokens as their KV is computed
// (by numComputedTokens_, at AppendSlot and Free), with room for the rest, so a block is a prefix
// hit only once its KV is written. Each group has its own pool (its own page_bytes) offering its
// sub-manager's npuBlockNum - reservedBlockNum block ids, 0 on, as MindIE sizes each group's KV
// tensor on its own; a prefix hit is kvshare's cross-group hit. GetBlockIds returns one list per
// group: the whole table of a TOKEN group, the held blocks (oldest first, the last at the table's
// last position) of a SLIDING_WINDOW group. What MindIE at 8b4871a does not define (it declares
// these types but its factory refuses them) is documented in docs/mindie.md ("KV-cache groups"),
// as are the methods this manager refuses (Fork; swapping with several groups, see
// KvshareManagerBase; SP/CP; KV pool). A manager of one group swaps with a host tier of the
// config's cpuBlockNum blocks, as KvshareBlockManager does.
class KvshareHybridBlockManager : public KvshareManagerBase {
   public:
    // Throws `Unsupported` for what the adapter does not support (SEQUENCE cache type, rankSize or
    // hostSize > 1, enableKvPool, nested subManagers), std::invalid_argument for a bad config
    // (sub-managers with different block sizes, block size 0, requestBlockWindowSize 0,
    // reservedBlockNum > npuBlockNum, no allocatable block, counts over 2^32-2), and
    // std::runtime_error if libkvshare's ABI version differs from the header's.
    explicit KvshareHybridBlockManager(const BlockManagerConfig &config, size_t localDPRank = 0);

    AllocStatus CanAllocate(const SequenceGroupSPtr &seqGroup) const override;
    bool Allocate(const SequenceGroupSPtr &seqGroup) override;
    bool CanAppendSlot(const SequenceGroupSPtr &seqGroup) const override;
    std::vector<std::pair<BlockId, BlockId>> AppendSlot(const SequenceSPtr &seq) override;
    void Fork(SequenceSPtr &parentSeq, SequenceSPtr &childSeq) override;
    void Free(SequenceId seqId) override;
    std::vector<BlockIds> GetBlockIds(SequenceId seqId) const override;
    size_t GetNumFreeNpuBlocks() const override;
    size_t GetTotalNpuBlocks() const override;

    // Not part of MindIE's interface: blocks a SLIDING_WINDOW group lets one sequence hold (its
    // requestBlockWindowSize); 0 for a TOKEN group. One entry per group.
    const std::vector<size_t> &WindowBlocks() const { return windowBlocks_; }

   private:
    bool Lookup(SequenceId seqId, SeqCounts &out) const override;
    size_t ProbeCachedTokens(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra,
                             const char *method) const override;
    // kvshare's cross-group prefix hit of `tokens`, at most `max` (read-only).
    size_t Hit(const std::vector<int32_t> &tokens, const kvs_extra_keys *extra, size_t max, const char *method) const;
    // Group `g`'s free + evictable blocks as MindIE counts them (with this step's swapped-out
    // blocks nothing else holds: swapping needs one group).
    size_t FreePages(size_t g) const;
    // Blocks every group takes to grow a table of `positions` positions to `slots` slots.
    size_t GrowBlocks(size_t positions, size_t slots) const;
    // std::runtime_error (NO_SPACE) naming `method` unless every group has `need` free blocks;
    // then makes them available (the held-back blocks of this step's swap-outs go first when
    // kvshare cannot hand out enough without them: the new blocks are written after the swaps).
    void TakeRoom(size_t need, const char *method);
    // What AppendSlot hands kvshare: the tokens computed since (`held` to `computed`, from the
    // sequence's numComputedTokens_) and room for the rest and the speculative slots.
    struct Growth {
        size_t held;      // tokens kvshare holds
        size_t computed;  // tokens it holds afterwards
        size_t room;      // slots past them
        size_t blocks;    // blocks it takes in every group
    };
    Growth GrowthOf(const mindie_llm::Sequence &seq, const SeqShape &s) const;

    struct Group {
        size_t blocks;  // npuBlockNum - reservedBlockNum: ids 0..blocks-1
        size_t npuBlockNum;
    };
    std::vector<Group> groups_;
    std::vector<size_t> windowBlocks_;
    // Multi-call methods (Allocate's hit then begin) run one at a time.
    mutable std::recursive_mutex mu_;
};

// The manager for a self-attention config (what the patched MindIE factory calls for
// SELFATTNBLOCKMANAGER, and the drop-in factory too; see docs/mindie.md): a KvshareHybridBlockManager
// of one window group when `config.cacheType` is SLIDING_WINDOW (MindIE's scheduler sets a
// one-desc config's cacheType), a KvshareBlockManager otherwise. Throws as their constructors do.
// `poolLookup`: MindIE's KV pool, for a config with enableKvPool (the patched factory passes
// MindIE's MemPool; the drop-in factory has none, so it refuses enableKvPool).
mindie_llm::BlockSpaceManagerSPtr CreateKvshareBlockManager(const BlockManagerConfig &config,
                                                            size_t localDPRank = 0,
                                                            KvPoolLookup poolLookup = {});

// The manager for KV-cache groups (what the factory gives COMPOSITEBLOCKMANAGER,
// REQUESTSLIDINGWINDOWBLOCKMANAGER and a SLIDING_WINDOW self-attention config). Throws as its
// constructor does.
mindie_llm::BlockSpaceManagerSPtr CreateKvshareHybridBlockManager(const BlockManagerConfig &config,
                                                                  size_t localDPRank = 0);

}  // namespace kvshare_mindie

#endif
