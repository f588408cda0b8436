// kvshare adapter for MindIE-LLM: a `mindie_llm::BlockSpaceManager` whose KV-cache bookkeeping
// (blocks, refcounts, prefix cache, copy-on-write, swap) runs in kvshare (one `kvs_cache` per
// manager).
//
// Build it against MindIE's real headers (block_manager_interface.h and what it includes) or
// against the project's compatibility declarations in integration/mindie/compat/; the source is
// the same. See integration/mindie/README.md for what is supported and how to deploy it.
//
// Thread safety: like MindIE's own manager, one instance is meant to be driven by one scheduler
// thread; concurrent calls on one instance are nevertheless safe (kvshare locks internally and the
// adapter's own counters are atomic), but a multi-call sequence such as CanAllocate + Allocate
// is only consistent when nothing else changes the cache in between.
#ifndef KVSHARE_MINDIE_H
#define KVSHARE_MINDIE_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "block_manager_interface.h"

struct kvs_cache;

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

// Thrown by the methods of features the adapter does not support (the message names the
// feature). Derives from std::runtime_error, like the errors of MindIE's own manager.
class Unsupported : public std::runtime_error {
   public:
    explicit Unsupported(const std::string &feature);
};

class KvshareBlockManager : public mindie_llm::BlockSpaceManager {
   public:
    // Throws `Unsupported` for a configuration the adapter does not support (rankSize or
    // hostSize > 1, enableKvPool, a cache type other than TOKEN), std::invalid_argument for a bad
    // one (reservedBlockNum > npuBlockNum, block size 0, counts over 2^32-1, or a geometry
    // kvshare refuses) and std::runtime_error if libkvshare's ABI version differs from the
    // header's.
    explicit KvshareBlockManager(const BlockManagerConfig &config, size_t localDPRank = 0);
    ~KvshareBlockManager() override;
    KvshareBlockManager(const KvshareBlockManager &) = delete;
    KvshareBlockManager &operator=(const KvshareBlockManager &) = delete;

    AllocStatus CanAllocate(const SequenceGroupSPtr &seqGroup) const override;
    bool Allocate(const SequenceGroupSPtr &seqGroup) override;
    bool CanAppendSlot(const SequenceGroupSPtr &seqGroup) const override;
    std::vector<std::pair<BlockId, BlockId>> AppendSlot(const SequenceSPtr &seq) override;
    bool CanAppendSlotNew(const SequenceGroupSPtr &seqGroup) const override;
    void AppendSlotNew(const SequenceGroupSPtr &seqGroup) override;
    void AppendTokenToLatestRank(SequenceId seqId, const std::vector<TokenId> &tokens) override;
    void Fork(SequenceSPtr &parentSeq, SequenceSPtr &childSeq) override;
    bool CanSwapOut(const SequenceGroupSPtr &seqGroup) override;
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapOut(const SequenceGroupSPtr &seqGroup) override;
    AllocStatus CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t numLookheadSlots) override;
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapIn(const SequenceGroupSPtr &seqGroup) override;
    void Free(SequenceId seqId) override;
    std::vector<BlockIds> GetBlockIds(SequenceId seqId) const override;
    void GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const override;
    void GetRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const override;
    std::vector<std::vector<HashValue>> GetRankedHashValues(SequenceId seqId) const override;
    std::vector<HashValue> GetSeqHashValues(SequenceId seqId) const override;
    std::vector<size_t> GetTokenCountPerRank(SequenceId seqId) const override;
    size_t GetLatestAppendedRankId(SequenceId seqId) const override;
    size_t GetAppendedBlockRankId(SequenceId seqId) const override;
    bool IsAppendBlock(SequenceId seqId) override;
    size_t GetNumFreeNpuBlocks() const override;
    size_t GetNumFreeCpuBlocks() const override;
    size_t GetTotalNpuBlocks() const override;
    void AccessAllblocksInSeq(const SequenceSPtr &seq, float accessTime) override;
    std::vector<BlockId> GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) override;
    std::vector<size_t> GetAllrankComputedBlockNum(const std::vector<SequenceSPtr> &seqs) override;
    std::vector<BlockId> GetRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs, size_t computedLens,
                                                   uint32_t tpSize, std::string modelName) override;
    std::vector<size_t> GetAllRankRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs,
                                                         std::vector<size_t> &computedBlocksNum,
                                                         std::string modelName) override;
    void MarkBlocksAsComputed() override;
    float GetPrefixCacheHitRate() const override;
    bool ResetPrefixCache() const override;
    size_t GetNumCachedTokens(const SequenceSPtr &seq) override;
    size_t GetSeqNumCachedTokens(const SequenceSPtr &seq) override;
    void ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                    size_t replacedPlaceHolderNum) override;
    size_t GetLocalDPRank() const override;
    void LwdInitCloudBlockManager(const BlockManagerConfig &lwdCloudConfig, size_t localDPRank) override;
    void LwdGetCloudRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const override;
    size_t LwdGetCloudLatestAppendedRankId(SequenceId seqId) const override;
    size_t LwdGetCloudAppendedBlockRankId(SequenceId seqId) const override;
    std::vector<size_t> LwdGetCloudTokenCountPerRank(SequenceId seqId) const override;

    // Not part of MindIE's interface: the kvshare cache behind this manager (for tests and
    // diagnostics such as kvs_cache_check / kvs_cache_stats). Owned by the manager.
    kvs_cache *Cache() const { return cache_; }

   private:
    struct SeqShape {
        uint64_t numTokens;
        uint64_t numPages;
        uint64_t matchedTokens;
        bool onHost;
    };
    // Shape of a live sequence; false if kvshare has no sequence with that id.
    bool Shape(SequenceId seqId, SeqShape &out) const;
    SeqShape ShapeOrThrow(SequenceId seqId, const char *method) const;
    std::vector<uint32_t> Pages(SequenceId seqId, const SeqShape &shape) const;
    // Device pages an append of `newTokens` tokens would take (capacity plus copy-on-write).
    size_t AppendNeed(SequenceId seqId, size_t newTokens) const;
    size_t FreeDevicePages() const;
    size_t FreeHostPages() const;
    // What swapping `seqs` back in takes from the free + evictable device pages: the pages it
    // copies (plus `lookahead` slots' new pages) and the cached pages it shares (which leave
    // the evictable count). Sequences are counted one by one: exact for one sequence, an upper
    // bound for a group whose sequences share cached pages. `method` names errors.
    struct SwapInCost {
        size_t pages;         // new device pages
        size_t sharedCached;  // cached (unreferenced) device pages it would share
        size_t worst;         // pages with nothing shared (for NEVER)
        size_t free;          // free + evictable device pages when counted
    };
    // What swapping `seqs` out takes from the free + evictable host pages: new host pages plus
    // the cached host pages it shares (kvs_seq_swap_out_need); exact for one sequence, an upper
    // bound for a group. Sets *onHost (and returns 0) if a sequence is swapped out already.
    size_t CostOfSwapOut(const std::vector<SequenceSPtr> &seqs, const char *method, bool *onHost) const;
    // `withPending`: also the pages the append that follows a swap-in takes (the sequence's full
    // length, pending token included, plus max(lookahead, speculativeSlots) slots).
    SwapInCost CostOfSwapIn(const std::vector<SequenceSPtr> &seqs, size_t lookahead, bool withPending,
                            const char *method) const;

    kvs_cache *cache_ = nullptr;
    size_t blockSize_;
    size_t npuBlockNum_;
    size_t cpuIdOffset_;  // first global CPU block id (= allocatable NPU blocks)
    size_t allocatableNpuBlocks_;
    size_t speculativeSlots_;
    bool enableCaching_;
    size_t localDPRank_;
    std::atomic<uint64_t> hitBlocks_{0};
    std::atomic<uint64_t> missBlocks_{0};
};

// Creates the adapter (what a patched MindIE factory calls; see README.md). Throws as the
// constructor does.
mindie_llm::BlockSpaceManagerSPtr CreateKvshareBlockManager(const BlockManagerConfig &config,
                                                            size_t localDPRank = 0);

}  // namespace kvshare_mindie

#endif
