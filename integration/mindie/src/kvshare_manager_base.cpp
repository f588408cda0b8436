// KvshareManagerBase: the interface methods both kvshare managers answer alike (one rank, no KV
// pool, no layerwise cloud manager, the DP rank, the cached-token policy). See
// include/kvshare_mindie.h.

#include <cstdint>
#include <string>
#include <vector>

#include "adapter_common.h"
#include "kvshare.h"
#include "kvshare_mindie.h"

namespace kvshare_mindie {

using mindie_llm::SequenceStage;

using namespace detail;

KvshareManagerBase::SeqCounts KvshareManagerBase::CountsOrThrow(SequenceId seqId, const char *method) const {
    SeqCounts c{};
    if (!Lookup(seqId, c)) {
        UnknownSeq(method, seqId);
    }
    return c;
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

// ---- one rank, no KV pool, no cloud manager ----

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
