// Helpers shared by the adapter's managers (kvshare_manager_base.cpp, kvshare_block_manager.cpp,
// kvshare_hybrid_manager.cpp): error messages, kvshare status checks, kvshare enum decoding, token
// conversion, the LoRA extra key. Internal header.
#ifndef KVSHARE_MINDIE_ADAPTER_COMMON_H
#define KVSHARE_MINDIE_ADAPTER_COMMON_H

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvshare.h"
#include "kvshare_mindie.h"

namespace kvshare_mindie {
namespace detail {

inline std::string Prefix(const char *method) { return std::string("kvshare MindIE adapter: ") + method + ": "; }

[[noreturn]] inline void Fail(const char *method, kvs_status st) {
    throw std::runtime_error(Prefix(method) + kvs_status_str(st) + ": " + kvs_last_error_message());
}

inline void Check(kvs_status st, const char *method) {
    if (st != KVS_STATUS_OK) {
        Fail(method, st);
    }
}

// ---- kvshare enums carried as uint32_t fields: one decoding function per enum ----
// The header defines their values (KVS_TIER_*, KVS_COPY_KIND_*); struct fields hold them as
// uint32_t so that every C compiler agrees on the layout. Each field is decoded here, once, into
// a C++ enum, and a value the header does not define is refused (a newer library than this
// adapter was built against) instead of being read as some other case.

enum class Tier { Device, Host };

// `kvs_seq_info.tier` (a `kvs_tier` value).
inline Tier DecodeTier(uint32_t raw, const char *method) {
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
inline CopyKind DecodeCopyKind(uint32_t raw, const char *method) {
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

inline uint64_t KvsId(SequenceId id) { return static_cast<uint64_t>(id); }

inline size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

inline size_t NumTokens(const mindie_llm::Sequence &seq) {
    return seq.data_.promptTokenIds.size() + seq.data_.outputTokenIds.size();
}

// Tokens [from, len) of prompt + output as kvshare's int32 ids. A token outside int32 is refused
// (kvshare ids are int32; MindIE's TokenId is long). Placeholders (-1) pass through unchanged and
// kvshare never hashes a page holding one (nor any later page of the sequence).
inline std::vector<int32_t> Tokens32(const mindie_llm::Sequence &seq, size_t from, const char *method) {
    const auto &prompt = seq.data_.promptTokenIds;
    const auto &output = seq.data_.outputTokenIds;
    size_t total = prompt.size() + output.size();
    std::vector<int32_t> out;
    out.reserve(total > from ? total - from : 0);
    for (size_t i = from; i < total; ++i) {
        TokenId t = i < prompt.size() ? prompt[i] : output[i - prompt.size()];
        if (t < static_cast<TokenId>(INT32_MIN) || t > static_cast<TokenId>(INT32_MAX)) {
            throw std::out_of_range(Prefix(method) + "token id " + std::to_string(t) + " at position " +
                                    std::to_string(i) + " of sequence " + std::to_string(seq.seqId_) +
                                    " does not fit kvshare's int32 token ids");
        }
        out.push_back(static_cast<int32_t>(t));
    }
    return out;
}

// The LoRA salt (Sequence::hashValue_, MindIE's "extra hash") as a kvshare extra key; none for 0.
struct Extra {
    kvs_extra_keys keys{};
    const kvs_extra_keys *ptr = nullptr;
    Extra(const Extra &) = delete;
    Extra &operator=(const Extra &) = delete;
    explicit Extra(HashValue h) {
        if (h != mindie_llm::INVALID_HASH_VALUE) {
            keys.lora_id = h;
            ptr = &keys;
        }
    }
};

// MindIE's block hash values: the chain MindIE's prefix cache computes for a sequence's blocks
// (`PrefixCachingBlockObj::PrefixHash`) and that keys its KV pool. Per block: a seed of 0, the
// previous block's value folded in (none for the first block), then each token id, then the
// sequence's extra hash (its LoRA salt), each folded as
//     seed ^= v + 0x9e3779b97f4a7c15 + (seed << 6) + (seed >> 2);  a seed of 0 becomes 1
// with v the integer itself (std::hash of an integer). MindIE's worker computes the same chain
// from a request's input ids (its extra hash is always 0) to name the pool entries it writes.
inline void MindieHashCombine(HashValue &seed, uint64_t v) {
    seed ^= v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
    if (seed == mindie_llm::INVALID_HASH_VALUE) {
        seed = 1;
    }
}

// One value per position of a table of `numBlocks` blocks over the first `numTokens` tokens of
// `seq` (prompt then output): the chain above for each full block, INVALID_HASH_VALUE for a
// block that is not full, for a block holding a placeholder token and for every block after one
// (MindIE hashes only full blocks of known tokens; a placeholder ends the chain here as it ends
// kvshare's hashing).
inline std::vector<HashValue> MindieBlockHashes(const mindie_llm::Sequence &seq, size_t numTokens, size_t numBlocks,
                                                size_t blockSize) {
    const auto &prompt = seq.data_.promptTokenIds;
    const auto &output = seq.data_.outputTokenIds;
    numTokens = std::min(numTokens, prompt.size() + output.size());
    std::vector<HashValue> out(numBlocks, mindie_llm::INVALID_HASH_VALUE);
    HashValue prev = mindie_llm::INVALID_HASH_VALUE;
    size_t full = blockSize == 0 ? 0 : std::min(numBlocks, numTokens / blockSize);
    for (size_t b = 0; b < full; ++b) {
        HashValue seed = 0;
        if (prev != mindie_llm::INVALID_HASH_VALUE) {
            MindieHashCombine(seed, prev);
        }
        for (size_t i = b * blockSize; i < (b + 1) * blockSize; ++i) {
            TokenId t = i < prompt.size() ? prompt[i] : output[i - prompt.size()];
            if (t == mindie_llm::PLACEHOLDER_TOKEN) {
                return out;
            }
            MindieHashCombine(seed, static_cast<uint64_t>(t));
        }
        MindieHashCombine(seed, seq.hashValue_);
        out[b] = seed;
        prev = seed;
    }
    return out;
}

// What an unknown sequence id throws: std::out_of_range, as in MindIE's manager, which looks
// sequences up with unordered_map::at.
[[noreturn]] inline void UnknownSeq(const char *method, SequenceId id) {
    throw std::out_of_range(Prefix(method) + "unknown sequence id " + std::to_string(id));
}

inline void RequireSeq(const SequenceSPtr &seq, const char *method) {
    if (!seq) {
        throw std::invalid_argument(Prefix(method) + "null sequence");
    }
}

inline void RequireGroup(const SequenceGroupSPtr &group, const char *method) {
    if (!group) {
        throw std::invalid_argument(Prefix(method) + "null sequence group");
    }
}

}  // namespace detail
}  // namespace kvshare_mindie

#endif
