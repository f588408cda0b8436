// kvshare project: compatibility declarations for building the MindIE adapter without MindIE.
//
// The kvshare project's own text: it declares the subset of the names and signatures of
// MindIE-LLM's `src/include/dataclass/sequence.h` that the adapter and its tests use (a plain
// struct with public data members), not a copy of MindIE's header. Out-of-line members are
// defined in sequence_compat.cpp, for the tests only; in a MindIE deployment they come from
// MindIE's own `sequence` library.
#ifndef KVSHARE_MINDIE_COMPAT_SEQUENCE_H
#define KVSHARE_MINDIE_COMPAT_SEQUENCE_H

#include <cstddef>
#include <memory>
#include <vector>

#include "basic_types.h"

namespace mindie_llm {

enum class SequenceStatus {
    ALL_STATUS = 0,
    WAITING = 1,
    RUNNING,
    SWAPPED,
    FINISH_STOPPED,
    FINISH_LENGTH_CAPPED,
    FINISH_ABORTED,
    FINISH_IGNORED,
    FINISH_RECOMPUTE
};

enum class SequenceStage { PREFILL, DECODE };

struct SequenceData {
    std::vector<TokenId> promptTokenIds;
    std::vector<TokenId> outputTokenIds;
    SequenceStage stage_ = SequenceStage::PREFILL;
    size_t numComputedTokens_ = 0;

    SequenceData() = default;
    explicit SequenceData(const std::vector<TokenId> &tPromptTokenIds);
    void UpdateNumComputedTokens(size_t numNewComputedTokens);
    [[nodiscard]] size_t GetLength();
};

struct Sequence {
    SequenceId seqId_{};
    int blockSize_{};
    SequenceData data_{};
    SequenceStatus status_{SequenceStatus::WAITING};
    HashValue hashValue_{INVALID_HASH_VALUE};

    Sequence(SequenceId seqId, int blockSize);
    Sequence(SequenceId seqId, int blockSize, const std::vector<TokenId> &inputs);

    [[nodiscard]] size_t GetLen();
    [[nodiscard]] bool IsPrefill() const;
    const std::vector<TokenId> GetTokenIds() const;
    HashValue GetExtraHash() const;
    void SetExtraHash(HashValue hashValue);
};

using SequenceSPtr = std::shared_ptr<Sequence>;

}  // namespace mindie_llm

#endif
