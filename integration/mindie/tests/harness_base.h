// Test harness for the kvshare MindIE adapter, part one: the checks (CHECK, CHECK_EQ,
// CHECK_THROWS) and the MindIE-shaped configuration and sequence builders every test uses.
#ifndef KVSHARE_MINDIE_TEST_HARNESS_BASE_H
#define KVSHARE_MINDIE_TEST_HARNESS_BASE_H

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "block_manager_interface.h"
#include "kvshare.h"
#include "kvshare_mindie.h"

namespace harness {

using namespace mindie_llm;
using kvshare_mindie::KvshareBlockManager;

inline int &Failures() {
    static int n = 0;
    return n;
}

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++harness::Failures();                                                         \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                                                   \
    do {                                                                                                 \
        auto va_ = (a);                                                                                  \
        auto vb_ = (b);                                                                                  \
        if (!(va_ == vb_)) {                                                                             \
            std::ostringstream os_;                                                                      \
            os_ << va_ << " != " << vb_;                                                                 \
            std::fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%s)\n", __FILE__, __LINE__, #a, #b, \
                         os_.str().c_str());                                                             \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)

// Expects `stmt` to throw an exception of type `E` whose message contains `needle`.
#define CHECK_THROWS(E, stmt, needle)                                                                \
    do {                                                                                             \
        bool thrown_ = false;                                                                        \
        try {                                                                                        \
            stmt;                                                                                    \
        } catch (const E &e_) {                                                                      \
            thrown_ = true;                                                                          \
            if (std::string(e_.what()).find(needle) == std::string::npos) {                          \
                std::fprintf(stderr, "%s:%d: %s threw \"%s\", expected to mention \"%s\"\n", __FILE__, \
                             __LINE__, #stmt, e_.what(), needle);                                    \
                std::exit(1);                                                                        \
            }                                                                                        \
        }                                                                                            \
        if (!thrown_) {                                                                              \
            std::fprintf(stderr, "%s:%d: %s did not throw %s\n", __FILE__, __LINE__, #stmt, #E);     \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)

inline BlockManagerConfig Config(size_t blockSize, size_t npu, size_t cpu, bool caching, size_t spec = 0) {
    BlockManagerConfig c{};
    c.cacheBlockSize = blockSize;
    c.cpuBlockNum = cpu;
    c.npuBlockNum = npu;
    c.reservedBlockNum = 0;
    c.speculativeSlots = spec;
    c.enableCaching = caching;
    return c;
}

inline SequenceSPtr MakeSeq(SequenceId id, const std::vector<TokenId> &prompt, HashValue lora = 0) {
    auto s = std::make_shared<Sequence>(id, 0, prompt);
    s->hashValue_ = lora;
    return s;
}

inline SequenceGroupSPtr MakeGroup(const std::vector<SequenceSPtr> &seqs) {
    RequestId rid = "req-" + std::to_string(seqs.at(0)->seqId_);
    return std::make_shared<SequenceGroup>(rid, seqs);
}

inline std::vector<TokenId> Range(TokenId from, size_t n) {
    std::vector<TokenId> v;
    for (size_t i = 0; i < n; ++i) {
        v.push_back(from + static_cast<TokenId>(i));
    }
    return v;
}

inline std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

inline void CheckKvs(const KvshareBlockManager &m) {
    kvs_status st = kvs_cache_check(m.Cache());
    if (st != KVS_STATUS_OK) {
        std::fprintf(stderr, "kvs_cache_check: %s: %s\n", kvs_status_str(st), kvs_last_error_message());
        std::exit(1);
    }
}

inline kvs_stats Stats(const KvshareBlockManager &m) {
    kvs_stats s{};
    CHECK(kvs_cache_stats(m.Cache(), &s) == KVS_STATUS_OK);
    return s;
}

}  // namespace harness

#endif
