// Bad input and unsupported features: MindIE-compatible results (false / no-op / the exception
// MindIE's own manager throws), no crash, nothing changed, and kvshare's checker clean afterwards.
#include <cstdio>
#include <limits>

#include "harness.h"

using namespace harness;

static void UnknownIdsAndLifecycle() {
    const size_t ps = 4;
    Sim sim(ps, 16, 8, true);
    auto ghost = MakeSeq(99, Range(1, 5));
    auto gghost = MakeGroup({ghost});
    ghost->status_ = SequenceStatus::RUNNING;
    // Lookups of unknown ids throw std::out_of_range (MindIE uses unordered_map::at).
    CHECK_THROWS(std::out_of_range, sim.m.GetBlockIds(99), "unknown sequence id 99");
    std::vector<RankedBlockId> ranked;
    CHECK_THROWS(std::out_of_range, sim.m.GetRankedBlockIds(99, ranked), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.AppendSlot(ghost), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.GetNumCachedTokens(ghost), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.CanSwapOut(gghost), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.SwapOut(gghost), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.GetCommonComputedBlockIds({ghost}), "unknown sequence id");
    CHECK_THROWS(std::out_of_range, sim.m.ReplaceTrailingPlaceHolder(ghost, 1, 1), "unknown sequence id");
    CHECK_THROWS(std::runtime_error, sim.m.AccessAllblocksInSeq(ghost, 1.0F), "unknown sequence id");
    CHECK(!sim.m.CanAppendSlot(gghost));
    SequenceSPtr child = MakeSeq(100, {});
    CHECK_THROWS(std::runtime_error, sim.m.Fork(ghost, child), "unknown parent sequence id 99");
    // Free of an unknown id is a no-op.
    sim.Free(99);
    sim.Check();

    auto a = MakeSeq(1, Range(1, 9));
    auto ga = MakeGroup({a});
    CHECK(sim.Admit(ga));
    // Allocate twice: refused (a is RUNNING now, and its table exists).
    CHECK(!sim.m.Allocate(ga));
    CHECK(sim.m.CanAllocate(ga) == AllocStatus::NEVER);
    a->status_ = SequenceStatus::WAITING;
    CHECK(!sim.m.Allocate(ga));
    a->status_ = SequenceStatus::RUNNING;
    sim.Check();
    // AppendSlot with no new token (a repeated call): nothing appended, no pair, nothing changed.
    CHECK(sim.m.AppendSlot(a).empty());
    sim.Check();
    // A group whose first sequence is waiting but whose id is live is refused too.
    auto dup = MakeSeq(1, Range(1, 9));
    CHECK(!sim.m.Allocate(MakeGroup({dup})));
    // Empty prompt: refused.
    CHECK(!sim.m.Allocate(MakeGroup({MakeSeq(2, {})})));
    sim.Check();
    // Fork onto a live id.
    CHECK_THROWS(std::runtime_error, sim.m.Fork(a, a), "KVS_STATUS_SEQ_EXISTS");
    sim.Check();
    // Placeholder count checks.
    CHECK_THROWS(std::runtime_error, sim.m.ReplaceTrailingPlaceHolder(a, 1, 2), "replacement size");
    CHECK_THROWS(std::runtime_error, sim.m.ReplaceTrailingPlaceHolder(a, 100, 1), "replacement size");
    sim.m.AccessAllblocksInSeq(a, 3.0F);

    // Swap the wrong way round.
    a->status_ = SequenceStatus::SWAPPED;
    CHECK_THROWS(std::invalid_argument, sim.m.SwapIn(ga), "is not swapped out");
    a->status_ = SequenceStatus::RUNNING;
    CHECK(sim.SwapOut(ga));
    a->status_ = SequenceStatus::RUNNING;
    CHECK(!sim.m.CanSwapOut(ga));
    CHECK_THROWS(std::invalid_argument, sim.m.SwapOut(ga), "already swapped out");
    a->data_.outputTokenIds.push_back(5);
    CHECK_THROWS(std::runtime_error, sim.m.AppendSlot(a), "KVS_STATUS_SEQ_WRONG_TIER");
    CHECK(!sim.m.CanAppendSlot(ga));
    a->data_.outputTokenIds.pop_back();
    CHECK_THROWS(std::runtime_error, sim.m.Fork(a, child), "KVS_STATUS_SEQ_WRONG_TIER");
    a->status_ = SequenceStatus::SWAPPED;
    sim.Check();
    // GetBlockIds of a swapped sequence: global CPU ids.
    CHECK(sim.m.GetBlockIds(1)[0].at(0) >= 16);

    // Double free: the second is a no-op.
    sim.Free(1);
    sim.Free(1);
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), static_cast<size_t>(8));
    CHECK_EQ(sim.m.GetNumFreeNpuBlocks(), static_cast<size_t>(16));

    // Allocate without room: MindIE's allocator throws as well; nothing changes.
    auto big = MakeSeq(3, Range(1000, 13 * 4));
    auto gbig = MakeGroup({big});
    CHECK(sim.Admit(gbig));
    auto more = MakeSeq(4, Range(2000, 16));
    auto gmore = MakeGroup({more});
    CHECK(sim.m.CanAllocate(gmore) == AllocStatus::LATER);
    CHECK_THROWS(std::runtime_error, sim.m.Allocate(gmore), "KVS_STATUS_NO_SPACE");
    sim.Check();
    // Appending without room: CanAppendSlot says no, AppendSlot throws and changes nothing.
    Sim::Prefilled(big);
    auto filler = MakeSeq(5, Range(3000, 12));
    CHECK(sim.Admit(MakeGroup({filler})));
    big->data_.outputTokenIds.push_back(1);
    big->data_.outputTokenIds.push_back(2);
    big->data_.outputTokenIds.push_back(3);
    big->data_.outputTokenIds.push_back(4);
    big->data_.outputTokenIds.push_back(5);
    CHECK(!sim.m.CanAppendSlot(gbig));
    CHECK_THROWS(std::runtime_error, sim.m.AppendSlot(big), "KVS_STATUS_NO_SPACE");
    sim.Check();
    big->data_.outputTokenIds.clear();
    // A sequence shorter than its block table.
    big->data_.promptTokenIds.pop_back();
    CHECK_THROWS(std::runtime_error, sim.m.AppendSlot(big), "block table holds");
    CHECK(!sim.m.CanAppendSlot(gbig));
    sim.Check();
    std::printf("unknown ids and lifecycle: ok\n");
}

// Without prefix caching MindIE still looks the sequence up first where it does with caching:
// GetNumCachedTokens and GetCommonComputedBlockIds of an unknown id throw std::out_of_range;
// AccessAllblocksInSeq and GetSeqNumCachedTokens never look it up (no-op / 0).
static void UnknownIdsWithoutCaching() {
    Sim sim(4, 16, 8, false);
    auto ghost = MakeSeq(99, Range(1, 5));
    ghost->status_ = SequenceStatus::RUNNING;
    CHECK_THROWS(std::out_of_range, sim.m.GetNumCachedTokens(ghost), "unknown sequence id 99");
    CHECK_THROWS(std::out_of_range, sim.m.GetCommonComputedBlockIds({ghost}), "unknown sequence id 99");
    sim.m.AccessAllblocksInSeq(ghost, 1.0F);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(ghost), static_cast<size_t>(0));
    // ReplaceTrailingPlaceHolder checks the counts against the sequence's own tokens before the
    // id (MindIE's order), so bad counts on an unknown id are a runtime_error, good ones out_of_range.
    CHECK_THROWS(std::runtime_error, sim.m.ReplaceTrailingPlaceHolder(ghost, 6, 1), "replacement size");
    CHECK_THROWS(std::out_of_range, sim.m.ReplaceTrailingPlaceHolder(ghost, 5, 1), "unknown sequence id 99");
    sim.Check();
    std::printf("unknown ids without caching: ok\n");
}

static void TokenRange() {
    Sim sim(4, 16, 0, true);
    auto s = MakeSeq(1, {1, 2, static_cast<TokenId>(std::numeric_limits<int32_t>::max()) + 1});
    CHECK_THROWS(std::out_of_range, sim.m.Allocate(MakeGroup({s})), "token id 2147483648 at position 2");
    CHECK_THROWS(std::out_of_range, sim.m.GetSeqNumCachedTokens(s), "does not fit kvshare's int32");
    sim.Check();
    auto t = MakeSeq(2, {1, 2, 3});
    CHECK(sim.Admit(MakeGroup({t})));
    t->data_.outputTokenIds.push_back(static_cast<TokenId>(std::numeric_limits<int32_t>::min()) - 1);
    CHECK_THROWS(std::out_of_range, sim.m.AppendSlot(t), "token id -2147483649");
    sim.Check();
    CHECK_THROWS(std::invalid_argument, sim.m.AppendSlot(nullptr), "null sequence");
    CHECK_THROWS(std::invalid_argument, sim.m.Allocate(nullptr), "null sequence group");
    std::printf("token range and nulls: ok\n");
}

static void UnsupportedFeatures() {
    Sim sim(4, 16, 0, true);
    auto a = MakeSeq(1, Range(1, 6));
    auto ga = MakeGroup({a});
    CHECK(sim.Admit(ga));
    using kvshare_mindie::Unsupported;
    const char *sp = "sequence/context parallel";
    CHECK_THROWS(Unsupported, sim.m.CanAppendSlotNew(ga), sp);
    CHECK_THROWS(Unsupported, sim.m.AppendSlotNew(ga), sp);
    CHECK_THROWS(Unsupported, sim.m.AppendTokenToLatestRank(1, {1}), sp);
    CHECK_THROWS(Unsupported, sim.m.IsAppendBlock(1), sp);
    CHECK_THROWS(Unsupported, sim.m.GetRemoteComputedBlockIds({a}, 0, 1, "m"), "no pool");
    std::vector<size_t> nums{0};
    CHECK_THROWS(Unsupported, sim.m.GetAllRankRemoteComputedBlockIds({a}, nums, "m"), "KV pool with sequence");
    const char *lwd = "layerwise cloud block manager";
    CHECK_THROWS(Unsupported, sim.m.LwdInitCloudBlockManager(Config(4, 16, 0, true), 0), lwd);
    std::vector<std::vector<BlockId>> rows;
    CHECK_THROWS(Unsupported, sim.m.LwdGetCloudRankedBlockIds(1, rows), lwd);
    CHECK_THROWS(Unsupported, sim.m.LwdGetCloudLatestAppendedRankId(1), lwd);
    CHECK_THROWS(Unsupported, sim.m.LwdGetCloudAppendedBlockRankId(1), lwd);
    CHECK_THROWS(Unsupported, sim.m.LwdGetCloudTokenCountPerRank(1), lwd);
    // Rank size 1 answers of the ranked queries.
    std::vector<RankedBlockId> ranked;
    sim.m.GetRankedBlockIds(1, ranked);
    BlockIds ids = sim.m.GetBlockIds(1)[0];
    CHECK_EQ(ranked.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        CHECK(ranked[i] == (RankedBlockId{ids[i], 0}));
    }
    sim.m.GetRankedBlockIds(1, rows);
    CHECK_EQ(rows.size(), static_cast<size_t>(1));
    CHECK(rows[0] == ids);
    CHECK(sim.m.GetTokenCountPerRank(1) == std::vector<size_t>{6});
    CHECK_EQ(sim.m.GetLatestAppendedRankId(1), static_cast<size_t>(0));
    CHECK_EQ(sim.m.GetAppendedBlockRankId(1), static_cast<size_t>(0));
    sim.Check();
    std::printf("unsupported features: ok\n");
}

static void ConfigAndFactory() {
    using kvshare_mindie::Unsupported;
    BlockManagerConfig c = Config(4, 16, 4, true);
    c.rankSize = 2;
    CHECK_THROWS(Unsupported, KvshareBlockManager m(c), "sequence/context parallel");
    c = Config(4, 16, 4, true);
    c.hostSize = 2;
    CHECK_THROWS(Unsupported, KvshareBlockManager m(c), "sequence/context parallel");
    c = Config(4, 16, 4, true);
    c.enableKvPool = true;
    CHECK_THROWS(Unsupported, KvshareBlockManager m(c), "KV pool (enableKvPool) without a pool");
    c = Config(4, 16, 4, true);
    c.cacheType = KvCacheType::SLIDING_WINDOW;
    CHECK_THROWS(Unsupported, KvshareBlockManager m(c), "cache type");
    c = Config(4, 16, 4, true);
    c.reservedBlockNum = 17;
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(c), "reservedBlockNum");
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(Config(0, 16, 4, true)), "cacheBlockSize");
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(Config(4, 0, 4, true)), "KVS_STATUS_INVALID_CONFIG");
    CHECK_THROWS(std::invalid_argument, KvshareBlockManager m(Config(4, size_t{1} << 33, 4, true)), "2^32-1");

    // reservedBlockNum shrinks the allocatable range; CPU ids start after it.
    c = Config(4, 10, 4, false);
    c.reservedBlockNum = 2;
    KvshareBlockManager r(c, 3);
    CHECK_EQ(r.GetTotalNpuBlocks(), static_cast<size_t>(10));
    CHECK_EQ(r.GetNumFreeNpuBlocks(), static_cast<size_t>(8));
    CHECK_EQ(r.GetLocalDPRank(), static_cast<size_t>(3));
    auto s = MakeSeq(1, Range(1, 8));
    auto g = MakeGroup({s});
    CHECK(r.Allocate(g));
    s->status_ = SequenceStatus::RUNNING;
    CHECK(r.CanAllocate(MakeGroup({MakeSeq(2, Range(1, 33))})) == AllocStatus::NEVER);
    auto pairs = r.SwapOut(g);
    CHECK_EQ(pairs.size(), static_cast<size_t>(2));
    BlockIds cpu = r.GetBlockIds(1)[0];
    CHECK_EQ(cpu[0], pairs[0].second + 8);
    CHECK_EQ(cpu[1], pairs[1].second + 8);
    CheckKvs(r);

    // The factory: self-attention gives the adapter; layerwise is refused by name; the rest
    // are refused as MindIE's own factory does.
    BlockSpaceManagerSPtr m =
        BlockManagerFactory::CreateBlockSpaceManager(BlockManagerType::SELFATTNBLOCKMANAGER, Config(4, 16, 4, true), 1);
    CHECK(dynamic_cast<KvshareBlockManager *>(m.get()) != nullptr);
    CHECK_EQ(m->GetLocalDPRank(), static_cast<size_t>(1));
    CHECK_THROWS(Unsupported,
                 BlockManagerFactory::CreateBlockSpaceManager(BlockManagerType::LWDSELFATTNBLOCKMANAGER,
                                                              Config(4, 16, 4, true)),
                 "layerwise cloud block manager");
    CHECK_THROWS(std::invalid_argument,
                 BlockManagerFactory::CreateBlockSpaceManager(BlockManagerType::COMPOSITEBLOCKMANAGER,
                                                              Config(4, 16, 4, true)),
                 "needs subManagers");
    std::printf("config and factory: ok\n");
}

int main() {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    UnknownIdsAndLifecycle();
    UnknownIdsWithoutCaching();
    TokenRange();
    UnsupportedFeatures();
    ConfigAndFactory();
    std::printf("test_bad_input: all passed\n");
    return 0;
}
