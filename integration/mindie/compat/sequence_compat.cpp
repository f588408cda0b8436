// kvshare project: out-of-line members of the compatibility `Sequence` / `SequenceGroup`
// declarations (tests only; a MindIE deployment uses MindIE's own `sequence` library). The
// project's own implementation of the documented behaviour.
#include "sequence.h"
#include "sequence_group.h"

namespace mindie_llm {

SequenceData::SequenceData(const std::vector<TokenId> &tPromptTokenIds) : promptTokenIds(tPromptTokenIds) {}

void SequenceData::UpdateNumComputedTokens(size_t numNewComputedTokens) {
    numComputedTokens_ += numNewComputedTokens;
    if (numComputedTokens_ >= GetLength()) {
        stage_ = SequenceStage::DECODE;
    }
}

size_t SequenceData::GetLength() { return promptTokenIds.size() + outputTokenIds.size(); }

Sequence::Sequence(SequenceId seqId, int blockSize) : seqId_(seqId), blockSize_(blockSize) {}

Sequence::Sequence(SequenceId seqId, int blockSize, const std::vector<TokenId> &inputs)
    : seqId_(seqId), blockSize_(blockSize), data_(inputs) {}

size_t Sequence::GetLen() { return data_.GetLength(); }

bool Sequence::IsPrefill() const { return data_.stage_ == SequenceStage::PREFILL; }

const std::vector<TokenId> Sequence::GetTokenIds() const {
    std::vector<TokenId> all = data_.promptTokenIds;
    all.insert(all.end(), data_.outputTokenIds.begin(), data_.outputTokenIds.end());
    return all;
}

HashValue Sequence::GetExtraHash() const { return hashValue_; }

void Sequence::SetExtraHash(HashValue hashValue) { hashValue_ = hashValue; }

SequenceGroup::SequenceGroup(RequestId &tRequestId, const std::vector<SequenceSPtr> &tSeqs)
    : requestId(tRequestId), seqs_(tSeqs), firstSeq(tSeqs.empty() ? nullptr : tSeqs.front()) {}

std::vector<SequenceSPtr> SequenceGroup::GetFirstSequence(const SequenceStatus status) {
    if (status == SequenceStatus::ALL_STATUS || (firstSeq && firstSeq->status_ == status)) {
        return seqs_;
    }
    return {};
}

std::vector<SequenceSPtr> SequenceGroup::GetSequences(const SequenceStatus status) { return GetFirstSequence(status); }

}  // namespace mindie_llm
