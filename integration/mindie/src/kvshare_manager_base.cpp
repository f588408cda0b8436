// KvshareManagerBase: the interface methods both kvshare managers answer alike (one rank, no KV
// pool, no layerwise cloud manager, the DP rank). See include/kvshare_mindie.h.

#include <cstdint>
#include <string>
#include <vector>

#include "kvshare_mindie.h"

namespace kvshare_mindie {

std::vector<std::vector<HashValue>> KvshareManagerBase::GetRankedHashValues(SequenceId) const {
    throw Unsupported("MindIE block hash values (GetRankedHashValues; used by the KV pool)");
}

std::vector<HashValue> KvshareManagerBase::GetSeqHashValues(SequenceId) const {
    throw Unsupported("MindIE block hash values (GetSeqHashValues; used by the KV pool)");
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

std::vector<BlockId> KvshareManagerBase::GetRemoteComputedBlockIds(const std::vector<SequenceSPtr> &, size_t,
                                                                    uint32_t, std::string) {
    throw Unsupported("KV pool (GetRemoteComputedBlockIds)");
}

std::vector<size_t> KvshareManagerBase::GetAllRankRemoteComputedBlockIds(const std::vector<SequenceSPtr> &,
                                                                          std::vector<size_t> &, std::string) {
    throw Unsupported("KV pool (GetAllRankRemoteComputedBlockIds)");
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
