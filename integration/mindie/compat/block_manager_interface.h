// kvshare project: compatibility declarations for building the MindIE adapter without MindIE.
//
// The kvshare project's own text (Apache-2.0): it declares the names and signatures of
// MindIE-LLM's block-manager interface (`src/include/block_manager/block_manager_interface.h`,
// namespace `mindie_llm`) as listed in the project's design notes, so that the adapter compiles
// and its tests run without a MindIE checkout. It is not a copy of MindIE's header; a deployment
// builds the identical adapter source against MindIE's real headers instead
// (docs/mindie.md). The signatures must stay exactly those of the MindIE version
// the adapter targets (commit 8b4871ad31f5 of Ascend/MindIE-LLM).
#ifndef KVSHARE_MINDIE_COMPAT_BLOCK_MANAGER_INTERFACE_H
#define KVSHARE_MINDIE_COMPAT_BLOCK_MANAGER_INTERFACE_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "basic_types.h"
#include "sequence.h"
#include "sequence_group.h"

namespace mindie_llm {

using SequenceGroupSPtr = std::shared_ptr<SequenceGroup>;
using SequenceSPtr = std::shared_ptr<Sequence>;

enum class BlockManagerType : int32_t {
    SELFATTNBLOCKMANAGER,
    LWDSELFATTNBLOCKMANAGER,
    COMPOSITEBLOCKMANAGER,
    REQUESTSINGLEBLOCKMANAGER,
    REQUESTSLIDINGWINDOWBLOCKMANAGER
};

struct RankedBlockId {
    BlockId blockId;
    size_t rankId;
    bool operator==(const RankedBlockId &o) const { return blockId == o.blockId && rankId == o.rankId; }
    bool operator!=(const RankedBlockId &o) const { return !(*this == o); }
};

enum class RankBlockAllocationMode : int32_t { BALANCED, SMALL_RANK_FIRST };

enum class KvCacheType : int32_t { TOKEN = 0, SEQUENCE = 1, SLIDING_WINDOW = 2 };

struct BlockManagerConfig {
    size_t cacheBlockSize;
    size_t cpuBlockNum;
    size_t npuBlockNum;
    size_t reservedBlockNum;
    size_t speculativeSlots;
    bool enableCaching;
    size_t rankSize = 1;
    size_t hostSize = 1;
    bool enableKvPool = false;
    std::string cachePoolBackend = "";
    std::string cachePoolConfigPath = "";
    RankBlockAllocationMode allocationMode = RankBlockAllocationMode::SMALL_RANK_FIRST;
    KvCacheType cacheType = KvCacheType::TOKEN;
    std::vector<BlockManagerConfig> subManagers{};
    size_t requestBlockWindowSize = 2;
};

class BlockSpaceManager {
   public:
    BlockSpaceManager() = default;
    virtual ~BlockSpaceManager() = default;

    virtual AllocStatus CanAllocate(const SequenceGroupSPtr &seqGroup) const = 0;
    virtual bool Allocate(const SequenceGroupSPtr &seqGroup) = 0;
    virtual bool CanAppendSlot(const SequenceGroupSPtr &seqGroup) const = 0;
    virtual std::vector<std::pair<BlockId, BlockId>> AppendSlot(const SequenceSPtr &seq) = 0;
    virtual bool CanAppendSlotNew(const SequenceGroupSPtr &seqGroup) const = 0;
    virtual void AppendSlotNew(const SequenceGroupSPtr &seqGroup) = 0;
    virtual void AppendTokenToLatestRank(SequenceId seqId, const std::vector<TokenId> &tokens) = 0;
    virtual void Fork(SequenceSPtr &parentSeq, SequenceSPtr &childSeq) = 0;
    virtual bool CanSwapOut(const SequenceGroupSPtr &seqGroup) = 0;
    virtual std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapOut(const SequenceGroupSPtr &seqGroup) = 0;
    virtual AllocStatus CanSwapIn(const SequenceGroupSPtr &seqGroup, size_t numLookheadSlots) = 0;
    virtual std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> SwapIn(const SequenceGroupSPtr &seqGroup) = 0;
    virtual void Free(SequenceId seqId) = 0;
    virtual std::vector<BlockIds> GetBlockIds(SequenceId seqId) const = 0;
    virtual void GetRankedBlockIds(SequenceId seqId, std::vector<RankedBlockId> &rankedBlockIds) const = 0;
    virtual void GetRankedBlockIds(SequenceId seqId, std::vector<std::vector<BlockId>> &rankedBlockIds) const = 0;
    virtual std::vector<std::vector<HashValue>> GetRankedHashValues(SequenceId seqId) const = 0;
    virtual std::vector<HashValue> GetSeqHashValues(SequenceId seqId) const = 0;
    virtual std::vector<size_t> GetTokenCountPerRank(SequenceId seqId) const = 0;
    virtual size_t GetLatestAppendedRankId(SequenceId seqId) const = 0;
    virtual size_t GetAppendedBlockRankId(SequenceId seqId) const = 0;
    virtual bool IsAppendBlock(SequenceId seqId) = 0;
    virtual size_t GetNumFreeNpuBlocks() const = 0;
    virtual size_t GetNumFreeCpuBlocks() const = 0;
    virtual size_t GetTotalNpuBlocks() const = 0;
    virtual void AccessAllblocksInSeq(const SequenceSPtr &seq, float accessTime) = 0;
    virtual std::vector<BlockId> GetCommonComputedBlockIds(const std::vector<SequenceSPtr> &seqs) = 0;
    virtual std::vector<size_t> GetAllrankComputedBlockNum(const std::vector<SequenceSPtr> &seqs) = 0;
    virtual std::vector<BlockId> GetRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs, size_t computedLens,
                                                           uint32_t tpSize, std::string modelName) = 0;
    virtual std::vector<size_t> GetAllRankRemoteComputedBlockIds(const std::vector<SequenceSPtr> &seqs,
                                                                 std::vector<size_t> &computedBlocksNum,
                                                                 std::string modelName) = 0;
    virtual void MarkBlocksAsComputed() = 0;
    virtual float GetPrefixCacheHitRate() const = 0;
    virtual bool ResetPrefixCache() const = 0;
    virtual size_t GetNumCachedTokens(const SequenceSPtr &seq) = 0;
    virtual size_t GetSeqNumCachedTokens(const SequenceSPtr &seq) = 0;
    virtual void ReplaceTrailingPlaceHolder(const SequenceSPtr &seq, size_t trailingPlaceHolderNum,
                                            size_t replacedPlaceHolderNum) = 0;
    virtual size_t GetLocalDPRank() const = 0;
    virtual void LwdInitCloudBlockManager(const BlockManagerConfig &lwdCloudConfig, size_t localDPRank) = 0;
    virtual void LwdGetCloudRankedBlockIds(SequenceId seqId,
                                           std::vector<std::vector<BlockId>> &rankedBlockIds) const = 0;
    virtual size_t LwdGetCloudLatestAppendedRankId(SequenceId seqId) const = 0;
    virtual size_t LwdGetCloudAppendedBlockRankId(SequenceId seqId) const = 0;
    virtual std::vector<size_t> LwdGetCloudTokenCountPerRank(SequenceId seqId) const = 0;
};

using BlockSpaceManagerSPtr = std::shared_ptr<BlockSpaceManager>;

class BlockManagerFactory {
   public:
    static BlockSpaceManagerSPtr CreateBlockSpaceManager(BlockManagerType type, const BlockManagerConfig &config,
                                                         size_t localDPRank = 0);
};

}  // namespace mindie_llm

#endif
