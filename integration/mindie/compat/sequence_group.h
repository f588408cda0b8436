// kvshare project: compatibility declarations for building the MindIE adapter without MindIE.
//
// The kvshare project's own text: it declares the subset of the names and signatures of
// MindIE-LLM's `src/include/dataclass/sequence_group.h` that the adapter and its tests use, not a
// copy of MindIE's header. Parallel sampling (`GetParallelSequences`) is not modelled here:
// `GetSequences` behaves as for a group without it. Out-of-line members are in
// sequence_compat.cpp (tests only).
#ifndef KVSHARE_MINDIE_COMPAT_SEQUENCE_GROUP_H
#define KVSHARE_MINDIE_COMPAT_SEQUENCE_GROUP_H

#include <memory>
#include <vector>

#include "basic_types.h"
#include "sequence.h"

namespace mindie_llm {

struct SequenceGroup {
    RequestId requestId;
    std::vector<SequenceSPtr> seqs_;
    SequenceSPtr firstSeq;

    SequenceGroup(RequestId &tRequestId, const std::vector<SequenceSPtr> &tSeqs);

    // All sequences when `status` is ALL_STATUS or the first sequence's status; else none.
    std::vector<SequenceSPtr> GetFirstSequence(const SequenceStatus status = SequenceStatus::ALL_STATUS);

    std::vector<SequenceSPtr> GetSequences(const SequenceStatus status = {});
};

using SequenceGroupSPtr = std::shared_ptr<SequenceGroup>;

}  // namespace mindie_llm

#endif
