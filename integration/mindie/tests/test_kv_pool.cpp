// MindIE's KV pool through the kvshare block manager: MindIE's block hash values (checked against
// values MindIE's own worker computes), the scheduler's remote-hit query
// (GetRemoteComputedBlockIds), and engines sharing one pool in MindIE's call order with the KV
// itself checked: each "engine" is a KvshareBlockManager plus KV memory and a worker that loads
// the remote blocks the scheduler reports, by the keys MindIE's worker computes from the input ids
// (an implementation of its chain independent of the adapter's), computes the rest, and after the
// prefill stores the prompt's full blocks in the pool. Every position a prefill reads must hold
// the KV of its own tokens (a fingerprint of the tokens up to it and the LoRA salt).
#include <cstdio>
#include <functional>
#include <random>

#include "harness.h"

using namespace harness;
using kvshare_mindie::KvPoolLookup;
using kvshare_mindie::Unsupported;

namespace {

// The pool the engines share: key -> the KV of one block (one fingerprint per slot).
struct Pool {
    std::map<std::string, std::vector<uint64_t>> entries;
    size_t lookups = 0;
    bool down = false;
    std::vector<bool> LookUp(const std::vector<std::string> &keys) {
        ++lookups;
        if (down) {
            throw std::runtime_error("pool unreachable");
        }
        std::vector<bool> out;
        for (const auto &k : keys) {
            out.push_back(entries.count(k) != 0);
        }
        return out;
    }
};

// MindIE's worker's key chain (prefix_cache_plugin's hash_block with its extra hash of 0),
// written here independently of the adapter: one value per full block.
std::vector<uint64_t> WorkerChain(const std::vector<TokenId> &tokens, size_t bs) {
    auto combine = [](uint64_t seed, uint64_t v) {
        seed ^= v + 0x9E3779B97F4A7C15ULL + (seed << 6) + (seed >> 2);
        return seed == 0 ? uint64_t{1} : seed;
    };
    std::vector<uint64_t> out;
    uint64_t prev = 0;
    for (size_t b = 0; b + 1 <= tokens.size() / bs; ++b) {
        uint64_t seed = 0;
        if (prev != 0) {
            seed = combine(seed, prev);
        }
        for (size_t i = b * bs; i < (b + 1) * bs; ++i) {
            seed = combine(seed, static_cast<uint64_t>(tokens[i]));
        }
        seed = combine(seed, 0);
        out.push_back(seed);
        prev = seed;
    }
    return out;
}

std::string Key(uint64_t h, uint32_t tp, uint32_t tpSize, const std::string &model) {
    return std::to_string(h) + "_" + std::to_string(tp) + "_" + std::to_string(tpSize) + "_" + model;
}

// The KV the forward writes at `pos`: FNV-1a over the tokens up to it and the LoRA salt.
uint64_t Fingerprint(const std::vector<TokenId> &t, size_t pos, HashValue lora) {
    uint64_t h = 1469598103934665603ULL ^ lora;
    for (size_t i = 0; i <= pos; ++i) {
        h = (h ^ static_cast<uint64_t>(t[i])) * 1099511628211ULL;
    }
    return h;
}

BlockManagerConfig PoolConfig(size_t bs, size_t npu) {
    BlockManagerConfig c = Config(bs, npu, 0, true);
    c.enableKvPool = true;
    return c;
}

struct Engine {
    size_t bs;
    uint32_t tp;
    std::string model;
    Pool *pool;
    KvshareBlockManager m;
    std::vector<std::vector<uint64_t>> kv;  // per NPU block, per slot
    Engine(size_t blockSize, size_t npu, Pool *p, uint32_t tpSize = 1, std::string name = "qwen")
        : bs(blockSize),
          tp(tpSize),
          model(std::move(name)),
          pool(p),
          m(PoolConfig(blockSize, npu), 0, [p](const std::vector<std::string> &k) { return p->LookUp(k); }),
          kv(npu, std::vector<uint64_t>(blockSize, 0)) {}

    struct Hit {
        size_t local;
        size_t remote;  // blocks the hit covers, local ones included
    };

    // One request: prefill in MindIE's scheduler order, the worker's pool loads and stores, the
    // KV every prompt position reads checked, then finished. False if it could not be admitted.
    bool Run(SequenceId id, const std::vector<TokenId> &prompt, HashValue lora, Hit *hit) {
        auto seq = MakeSeq(id, prompt, lora);
        auto g = MakeGroup({seq});
        if (m.CanAllocate(g) != AllocStatus::OK) {
            return false;
        }
        CHECK(m.Allocate(g));
        std::vector<BlockId> table = m.GetBlockIds(id)[0];
        size_t local = m.GetCommonComputedBlockIds({seq}).size();
        size_t remote = m.GetRemoteComputedBlockIds({seq}, local, tp, model).size();
        CHECK(remote >= local);
        CHECK(remote * bs < prompt.size());
        // The worker loads [local, remote) by its own keys: every rank's entry must be there.
        std::vector<uint64_t> chain = WorkerChain(prompt, bs);
        for (size_t b = local; b < remote; ++b) {
            for (uint32_t r = 0; r < tp; ++r) {
                auto it = pool->entries.find(Key(chain.at(b), r, tp, model));
                CHECK(it != pool->entries.end());
                kv.at(table[b]) = it->second;
            }
        }
        // The forward computes the rest; then every position is read.
        for (size_t pos = remote * bs; pos < prompt.size(); ++pos) {
            kv.at(table[pos / bs])[pos % bs] = Fingerprint(prompt, pos, lora);
        }
        for (size_t pos = 0; pos < prompt.size(); ++pos) {
            CHECK_EQ(kv.at(table[pos / bs])[pos % bs], Fingerprint(prompt, pos, lora));
        }
        // After the prefill the worker stores the prompt's full blocks (the first writer wins).
        // MindIE's worker keys them without the LoRA salt, so a deployment with LoRA adapters
        // must not let them reach the pool; this one stores only requests without one.
        if (lora == 0) {
            for (size_t b = 0; b < chain.size(); ++b) {
                for (uint32_t r = 0; r < tp; ++r) {
                    pool->entries.emplace(Key(chain[b], r, tp, model), kv.at(table[b]));
                }
            }
        }
        m.MarkBlocksAsComputed();
        seq->data_.UpdateNumComputedTokens(seq->GetLen() - seq->data_.numComputedTokens_);
        m.Free(id);
        CheckKvs(m);
        if (hit != nullptr) {
            *hit = Hit{local, remote};
        }
        return true;
    }
};

// Values MindIE's worker computes (prefix_cache_plugin.hash_block at MindIE-LLM 8b4871a, extra
// hash 0) for these tokens: the adapter's GetSeqHashValues must name the same pool entries.
void HashValuesMatchMindie() {
    Pool pool;
    Engine e(4, 32, &pool);
    auto a = MakeSeq(1, Range(1, 13));
    CHECK(e.m.Allocate(MakeGroup({a})));
    std::vector<HashValue> want{0x822b05d9ade4af7fULL, 0xe78b1e83bc8b31feULL, 0xa3fc2a69dd76f550ULL, 0};
    CHECK(e.m.GetSeqHashValues(1) == want);
    CHECK(e.m.GetRankedHashValues(1) == std::vector<std::vector<HashValue>>{want});
    CHECK(WorkerChain(a->GetTokenIds(), 4) == std::vector<uint64_t>(want.begin(), want.end() - 1));

    auto b = MakeSeq(2, {151643, 0, 2147483647, 7, 42, 99, 100000, 3});
    CHECK(e.m.Allocate(MakeGroup({b})));
    CHECK(e.m.GetSeqHashValues(2) == (std::vector<HashValue>{0x822b0baef0b5c519ULL, 0xbdc6112512d3dc3cULL}));

    Engine wide(16, 8, &pool);
    auto c = MakeSeq(3, Range(1000, 32));
    CHECK(wide.m.Allocate(MakeGroup({c})));
    CHECK(wide.m.GetSeqHashValues(3) == (std::vector<HashValue>{0x615ab4af565b6209ULL, 0x31d230740dff2569ULL}));

    // A LoRA salt (MindIE's extra hash) changes every block's value, as in MindIE's scheduler.
    auto d = MakeSeq(4, Range(1, 13), 77);
    CHECK(e.m.Allocate(MakeGroup({d})));
    std::vector<HashValue> salted = e.m.GetSeqHashValues(4);
    CHECK_EQ(salted.size(), want.size());
    for (size_t i = 0; i + 1 < want.size(); ++i) {
        CHECK(salted[i] != want[i] && salted[i] != 0);
    }
    // Decode tokens extend the chain once their block is full.
    e.m.Free(1);
    CHECK_THROWS(std::out_of_range, e.m.GetSeqHashValues(1), "unknown sequence");
    std::printf("hash values match MindIE's: ok\n");
}

void TwoEnginesShareOnePool() {
    const size_t bs = 4;
    Pool pool;
    Engine a(bs, 64, &pool);
    Engine b(bs, 64, &pool);
    std::vector<TokenId> system = Range(5000, 14);  // 3 full blocks + 2 tokens
    Engine::Hit h{};
    CHECK(a.Run(1, Concat(system, Range(1, 5)), 0, &h));
    CHECK_EQ(h.local, size_t{0});
    CHECK_EQ(h.remote, size_t{0});
    CHECK_EQ(pool.entries.size(), size_t{4});  // 19 tokens: 4 full blocks

    // Another engine continues from the pool: the system prompt's 3 full blocks.
    CHECK(b.Run(2, Concat(system, Range(40, 6)), 0, &h));
    CHECK_EQ(h.local, size_t{0});
    CHECK_EQ(h.remote, size_t{3});
    CHECK_EQ(b.m.PoolHitBlocks(), uint64_t{3});
    // Its own cache has them now: a local hit, the pool adds nothing beyond.
    CHECK(b.Run(3, Concat(system, Range(70, 3)), 0, &h));
    CHECK_EQ(h.local, size_t{3});
    CHECK_EQ(h.remote, size_t{3});

    // Multi-turn: the next turn of engine a's conversation lands on b and loads a's blocks.
    std::vector<TokenId> turn2 = Concat(Concat(system, Range(1, 5)), Range(900, 6));
    CHECK(b.Run(4, turn2, 0, &h));
    CHECK_EQ(h.local, size_t{3});
    CHECK_EQ(h.remote, size_t{4});

    // A prompt that is all full blocks, all in the pool: one token is left to compute.
    std::vector<TokenId> exact = Range(7000, 16);
    CHECK(a.Run(5, exact, 0, &h));
    CHECK(b.Run(6, exact, 0, &h));
    CHECK_EQ(h.remote, size_t{3});

    // LoRA: the keys carry the salt, so a LoRA request never loads the base model's entries.
    CHECK(b.Run(7, Concat(Range(8000, 12), Range(1, 2)), 0, &h));
    CHECK(a.Run(8, Concat(Range(8000, 12), Range(1, 2)), 55, &h));
    CHECK_EQ(h.remote, size_t{0});

    // Another model name (or tensor-parallel size) is another set of keys.
    Engine other(bs, 64, &pool, 1, "llama");
    CHECK(other.Run(9, Concat(system, Range(40, 6)), 0, &h));
    CHECK_EQ(h.remote, size_t{0});
    std::printf("two engines share one pool: ok\n");
}

void TensorParallelRanks() {
    const size_t bs = 4;
    Pool pool;
    Engine a(bs, 32, &pool, 2);
    std::vector<TokenId> p = Range(300, 17);
    Engine::Hit h{};
    CHECK(a.Run(1, p, 0, &h));
    CHECK_EQ(pool.entries.size(), size_t{8});  // 4 blocks x 2 ranks
    // Rank 1's entry of block 2 is gone: the hit stops before block 2.
    std::vector<uint64_t> chain = WorkerChain(p, bs);
    CHECK_EQ(pool.entries.erase(Key(chain[2], 1, 2, "qwen")), size_t{1});
    Engine b(bs, 32, &pool, 2);
    CHECK(b.Run(2, p, 0, &h));
    CHECK_EQ(h.remote, size_t{2});
    std::printf("tensor-parallel ranks: ok\n");
}

void FaultsAndBadInput() {
    const size_t bs = 4;
    Pool pool;
    Engine a(bs, 32, &pool);
    Engine::Hit h{};
    CHECK(a.Run(1, Range(1, 13), 0, &h));
    Engine b(bs, 32, &pool);
    // A pool that throws, or answers the wrong number of keys: no remote hit, counted, the
    // request computes its prompt.
    pool.down = true;
    CHECK(b.Run(2, Range(1, 13), 0, &h));
    CHECK_EQ(h.remote, size_t{0});
    CHECK_EQ(b.m.PoolLookupFailures(), uint64_t{1});
    pool.down = false;
    KvshareBlockManager odd(PoolConfig(bs, 32), 0, [](const std::vector<std::string> &) {
        return std::vector<bool>{true};
    });
    auto s = MakeSeq(3, Range(1, 13));
    CHECK(odd.Allocate(MakeGroup({s})));
    CHECK_EQ(odd.GetRemoteComputedBlockIds({s}, 0, 1, "m").size(), size_t{0});
    CHECK_EQ(odd.PoolLookupFailures(), uint64_t{1});

    // Bad arguments are refused and change nothing.
    kvs_stats before = Stats(odd);
    CHECK_THROWS(std::out_of_range, odd.GetRemoteComputedBlockIds({s}, 9, 1, "m"), "computedLens");
    auto ghost = MakeSeq(99, Range(1, 5));
    CHECK_THROWS(std::out_of_range, odd.GetRemoteComputedBlockIds({ghost}, 0, 1, "m"), "unknown sequence");
    CHECK_THROWS(std::invalid_argument, odd.GetRemoteComputedBlockIds({nullptr}, 0, 1, "m"), "null sequence");
    kvs_stats after = Stats(odd);
    CHECK_EQ(after.device_pages_free, before.device_pages_free);
    CHECK_EQ(after.device_pages_cached, before.device_pages_cached);
    CheckKvs(odd);
    // tpSize 0 asks nothing (as MindIE's manager): the local hit only.
    size_t asked = pool.lookups;
    auto t = MakeSeq(4, Range(1, 13));
    CHECK(b.m.Allocate(MakeGroup({t})));
    CHECK_EQ(b.m.GetRemoteComputedBlockIds({t}, 0, 0, "qwen").size(), size_t{0});
    CHECK_EQ(pool.lookups, asked);

    // Configurations.
    KvPoolLookup lookup = [](const std::vector<std::string> &k) { return std::vector<bool>(k.size(), false); };
    BlockManagerConfig c = PoolConfig(bs, 16);
    CHECK_THROWS(Unsupported, KvshareBlockManager m(c), "without a pool");
    c.enableCaching = false;
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(c, 0, lookup), "enableCaching");
    c = Config(bs, 16, 0, true);
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(c, 0, lookup), "enableKvPool is off");
    c = PoolConfig(bs, 16);
    c.cacheType = KvCacheType::SLIDING_WINDOW;
    CHECK_THROWS(Unsupported, kvshare_mindie::CreateKvshareBlockManager(c, 0, lookup), "KV pool");
    c.enableKvPool = false;
    CHECK_THROWS(std::invalid_argument, kvshare_mindie::CreateKvshareBlockManager(c, 0, lookup), "enableKvPool is off");
    std::vector<size_t> nums{0};
    CHECK_THROWS(Unsupported, b.m.GetAllRankRemoteComputedBlockIds({t}, nums, "qwen"), "sequence/context parallel");
    std::printf("faults and bad input: ok\n");
}

// Seeded workloads over three engines of small caches (so local hits come and go with eviction)
// on one pool: prompts from a tree of shared prefixes, with and without LoRA salts, routed at
// random. Every prefill reads its own KV (Engine::Run), and the hit is what a model of the pool
// says: the local hit, then every following full block (within len-1 tokens) whose entries the
// pool holds, by the worker's keys.
void RandomWorkloads(uint32_t seed, int requests) {
    const size_t bs = 4;
    std::mt19937 rng(seed);
    Pool pool;
    std::vector<std::unique_ptr<Engine>> engines;
    for (int i = 0; i < 3; ++i) {
        engines.push_back(std::make_unique<Engine>(bs, 24 + 8 * i, &pool));
    }
    std::vector<std::vector<TokenId>> prefixes;
    for (int i = 0; i < 5; ++i) {
        prefixes.push_back(Range(10000 * (i + 1), 3 + rng() % 14));
    }
    size_t remoteBlocks = 0;
    for (int r = 0; r < requests; ++r) {
        std::vector<TokenId> prompt = prefixes[rng() % prefixes.size()];
        size_t tail = 1 + rng() % 9;
        for (size_t i = 0; i < tail; ++i) {
            prompt.push_back(static_cast<TokenId>(rng() % 6));
        }
        HashValue lora = rng() % 5 == 0 ? 3 : 0;
        Engine &e = *engines[rng() % engines.size()];
        // The model's answer: which of the prompt's blocks the pool holds before it runs.
        std::vector<uint64_t> chain = WorkerChain(prompt, bs);
        std::vector<bool> heldBefore;
        for (uint64_t h : chain) {
            heldBefore.push_back(pool.entries.count(Key(h, 0, 1, "qwen")) != 0);
        }
        Engine::Hit h{};
        if (!e.Run(r + 1, prompt, lora, &h)) {
            continue;
        }
        size_t expect = h.local;
        while (lora == 0 && expect < (prompt.size() - 1) / bs && heldBefore[expect]) {
            ++expect;
        }
        CHECK_EQ(h.remote, expect);
        remoteBlocks += h.remote - h.local;
    }
    CHECK(remoteBlocks > 0);
    std::printf("random workload seed %u: %d requests, %zu blocks loaded from the pool: ok\n", seed, requests,
                remoteBlocks);
}

}  // namespace

int main(int argc, char **argv) {
    HashValuesMatchMindie();
    TwoEnginesShareOnePool();
    TensorParallelRanks();
    FaultsAndBadInput();
    int requests = argc > 1 ? std::atoi(argv[1]) : 400;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
        RandomWorkloads(seed, requests);
    }
    std::printf("test_kv_pool: all passed\n");
    return 0;
}
