// Scheduler-shaped scenarios against the kvshare MindIE adapter, each step checked against the
// independent model in harness.h: shared system prompts (hits once their KV is computed),
// decode with AppendSlot, beam-style Fork with copy-on-write pairs, speculative lookahead slots,
// preemption by swap out / swap in, LoRA isolation, placeholders, reset and hit rate.
#include <cstdio>

#include "harness.h"

using namespace harness;

static void SharedSystemPrompt() {
    const size_t ps = 4;
    Sim sim(ps, 64, 16, true);
    std::vector<TokenId> system = Range(1000, 10);  // 2 full pages + 2 tokens
    auto a = MakeSeq(1, Concat(system, Range(1, 5)));
    auto b = MakeSeq(2, Concat(system, Range(20, 3)));
    auto ga = MakeGroup({a});
    auto gb = MakeGroup({b});
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(a), static_cast<size_t>(0));

    // Both admitted in the same step: b may not hit a's blocks, they are not computed yet.
    CHECK(sim.Admit(ga));
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(b), static_cast<size_t>(0));
    CHECK(sim.Admit(gb));
    CHECK_EQ(sim.m.GetNumCachedTokens(b), static_cast<size_t>(0));
    CHECK(sim.m.GetCommonComputedBlockIds({b}).empty());
    CHECK(sim.m.GetBlockIds(1)[0][0] != sim.m.GetBlockIds(2)[0][0]);
    sim.EndStep();
    Sim::Prefilled(a);
    Sim::Prefilled(b);

    // Later prompts hit the two system pages once a's next AppendSlot reports them computed (a
    // decode step schedules the running queue first).
    auto c = MakeSeq(3, Concat(system, Range(40, 7)));
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(c), static_cast<size_t>(0));
    sim.Decode(a, 499);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(c), 2 * ps);
    CHECK(sim.Admit(MakeGroup({c})));
    CHECK_EQ(sim.m.GetNumCachedTokens(c), 2 * ps);
    std::vector<BlockId> computed = sim.m.GetCommonComputedBlockIds({c});
    CHECK_EQ(computed.size(), static_cast<size_t>(2));
    CHECK_EQ(computed[0], sim.m.GetBlockIds(1)[0][0]);
    CHECK_EQ(computed[1], sim.m.GetBlockIds(1)[0][1]);
    CHECK_EQ(sim.m.GetAllrankComputedBlockNum({c}).at(0), static_cast<size_t>(2));
    // Hit rate counts full prompt blocks: a 3 misses, b 3 misses, c 2 hits + 2 misses (17 tokens).
    CHECK(sim.m.GetPrefixCacheHitRate() > 0.19F && sim.m.GetPrefixCacheHitRate() < 0.21F);

    // Decode steps; full decode pages become hits only after the step is marked computed.
    for (int i = 0; i < 9; ++i) {
        sim.Decode(a, 500 + i);
        sim.Decode(c, 600 + i);
        sim.EndStep();
    }
    sim.Free(1);
    sim.Free(2);
    sim.Free(3);
    // Freed full blocks stay cached but count as free, as in MindIE.
    CHECK_EQ(sim.m.GetNumFreeNpuBlocks(), static_cast<size_t>(64));
    CHECK(Stats(sim.m).device_pages_cached > 0);

    // A follow-up turn of a's conversation hits its prompt and decode pages (multi-turn).
    std::vector<TokenId> turn2 = a->GetTokenIds();
    turn2.push_back(7);
    auto d = MakeSeq(4, turn2);
    size_t expect = ((turn2.size() - 1) / ps) * ps;
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(d), expect);
    CHECK(sim.Admit(MakeGroup({d})));
    CHECK_EQ(sim.m.GetNumCachedTokens(d), expect);
    sim.Free(4);

    // ResetPrefixCache: refused while blocks are in use, then drops every cached block.
    auto e = MakeSeq(5, Range(1, 9));
    CHECK(sim.Admit(MakeGroup({e})));
    CHECK(!sim.m.ResetPrefixCache());
    sim.Free(5);
    CHECK(sim.m.ResetPrefixCache());
    sim.model.ClearIndex();
    sim.Check();
    CHECK_EQ(Stats(sim.m).device_pages_cached, static_cast<uint64_t>(0));
    // The same prompt again: fresh blocks, no hit (MindIE's manager throws here and leaks a block:
    // its reset keeps the hash map while rebuilding the free list).
    auto e2 = MakeSeq(7, Range(1, 9));
    CHECK(sim.Admit(MakeGroup({e2})));
    CHECK_EQ(sim.m.GetNumCachedTokens(e2), static_cast<size_t>(0));
    sim.Free(7);
    auto f = MakeSeq(6, Concat(system, Range(1, 5)));
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(f), static_cast<size_t>(0));
    std::printf("shared system prompt: ok\n");
}

static void ExactMultipleRecomputesLastPage() {
    // A prompt of exactly k full blocks that is entirely cached shares k-1 blocks: the engine
    // computes at least the last token, and the block it writes must be private.
    const size_t ps = 4;
    Sim sim(ps, 32, 0, true);
    auto a = MakeSeq(1, Range(1, 12));
    CHECK(sim.Admit(MakeGroup({a})));
    sim.EndStep();
    Sim::Prefilled(a);
    sim.Free(1);
    auto b = MakeSeq(2, Range(1, 12));
    CHECK(sim.Admit(MakeGroup({b})));
    CHECK_EQ(sim.m.GetNumCachedTokens(b), 2 * ps);
    CHECK_EQ(sim.m.GetCommonComputedBlockIds({b}).size(), static_cast<size_t>(2));
    std::printf("exact multiple: ok\n");
}

static void LoraAndPlaceholders() {
    const size_t ps = 4;
    Sim sim(ps, 64, 0, true);
    std::vector<TokenId> prompt = Range(1, 13);
    auto first = MakeSeq(1, prompt, 0);
    auto second = MakeSeq(2, prompt, 77);
    CHECK(sim.Admit(MakeGroup({first})));
    CHECK(sim.Admit(MakeGroup({second})));
    sim.EndStep();
    sim.Computed(first);
    sim.Computed(second);
    // Same tokens, other LoRA: no hit; same LoRA: hit.
    auto base = MakeSeq(3, prompt, 0);
    auto lora = MakeSeq(4, prompt, 77);
    auto other = MakeSeq(5, prompt, 78);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(base), 3 * ps);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(lora), 3 * ps);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(other), static_cast<size_t>(0));
    CHECK(sim.Admit(MakeGroup({lora})));
    CHECK(sim.Admit(MakeGroup({other})));
    CHECK(sim.m.GetBlockIds(4)[0][0] == sim.m.GetBlockIds(2)[0][0]);
    CHECK(sim.m.GetBlockIds(4)[0][0] != sim.m.GetBlockIds(1)[0][0]);

    // Placeholder tokens: the page holding one, and every later page, is never hashed.
    std::vector<TokenId> ph = Range(100, 12);
    ph[5] = PLACEHOLDER_TOKEN;
    auto p = MakeSeq(6, ph);
    CHECK(sim.Admit(MakeGroup({p})));
    sim.EndStep();
    Sim::Prefilled(p);
    sim.Free(6);
    auto q = MakeSeq(7, Concat(ph, {1}));
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(q), ps);  // only the page before the placeholder
    CHECK(sim.Admit(MakeGroup({q})));
    CHECK_EQ(sim.m.GetNumCachedTokens(q), ps);
    // Decode with trailing placeholders (async scheduling); the pages are never hashed.
    Sim::Prefilled(q);
    for (int i = 0; i < 6; ++i) {
        sim.Decode(q, PLACEHOLDER_TOKEN);
        sim.EndStep();
    }
    sim.m.ReplaceTrailingPlaceHolder(q, 6, 2);  // accepted, a no-op for kvshare
    sim.Check();
    std::printf("lora and placeholders: ok\n");
}

static void BeamForkCopyOnWrite() {
    const size_t ps = 4;
    Sim sim(ps, 64, 0, true);
    auto parent = MakeSeq(1, Range(1, 6));  // last block half full
    auto g = MakeGroup({parent});
    CHECK(sim.Admit(g));
    Sim::Prefilled(parent);
    sim.EndStep();
    auto child = MakeSeq(2, {});
    sim.Fork(parent, child);
    g->seqs_.push_back(child);
    CHECK(sim.m.GetBlockIds(1) == sim.m.GetBlockIds(2));
    CHECK(sim.m.CanAppendSlot(g));
    // The parent writes into the shared half-full block: one copy-on-write pair.
    auto p1 = sim.Decode(parent, 900);
    CHECK_EQ(p1.size(), static_cast<size_t>(1));
    // The child now owns the old block alone: no copy.
    auto p2 = sim.Decode(child, 901);
    CHECK(p2.empty());
    CHECK(sim.m.GetBlockIds(1)[0][0] == sim.m.GetBlockIds(2)[0][0]);  // full block stays shared
    CHECK(sim.m.GetBlockIds(1)[0][1] != sim.m.GetBlockIds(2)[0][1]);
    for (int i = 0; i < 6; ++i) {
        sim.Decode(parent, 910 + i);
        sim.Decode(child, 920 + i);
        sim.EndStep();
    }
    // Beam pruning: the child is dropped, a new beam forks from the parent.
    sim.Free(2);
    auto child2 = MakeSeq(3, {});
    sim.Fork(parent, child2);
    auto p3 = sim.Decode(child2, 950);
    CHECK_EQ(p3.size(), static_cast<size_t>(1));
    sim.Free(1);
    sim.Free(3);

    // A group allocated with several WAITING sequences (n > 1 sampling) shares the prompt.
    auto s1 = MakeSeq(10, Range(50, 7));
    auto s2 = MakeSeq(11, Range(50, 7));
    CHECK(sim.Admit(MakeGroup({s1, s2})));
    CHECK(sim.m.GetBlockIds(10) == sim.m.GetBlockIds(11));
    Sim::Prefilled(s1);
    Sim::Prefilled(s2);
    CHECK_EQ(sim.Decode(s1, 1).size(), static_cast<size_t>(1));
    CHECK(sim.Decode(s2, 2).empty());
    std::printf("beam fork copy-on-write: ok\n");
}

static void SpeculativeSlots() {
    const size_t ps = 4;
    const size_t spec = 3;
    Sim sim(ps, 64, 8, true, spec);
    auto a = MakeSeq(1, Range(1, 4));
    auto g = MakeGroup({a});
    CHECK(sim.Admit(g));
    Sim::Prefilled(a);
    // Each AppendSlot keeps `spec` more slots allocated.
    for (int i = 0; i < 10; ++i) {
        CHECK(sim.m.CanAppendSlot(g));
        sim.Decode(a, 100 + i);
        CHECK(sim.m.GetBlockIds(1)[0].size() * ps >= a->GetLen() + spec);
        sim.EndStep();
    }
    // Fork with reserved lookahead pages, then both decode.
    auto b = MakeSeq(2, {});
    sim.Fork(a, b);
    sim.Decode(a, 200);
    sim.Decode(b, 201);
    // Swap out and in with the lookahead pages.
    auto gb = MakeGroup({b});
    CHECK(sim.SwapOut(gb));
    CHECK(sim.SwapIn(gb));
    sim.Decode(b, 202);
    std::printf("speculative slots: ok\n");
}

static void SwapPreemption() {
    const size_t ps = 4;
    const size_t npu = 24;
    const size_t cpu = 8;
    Sim sim(ps, npu, cpu, true);
    std::vector<TokenId> system = Range(1000, 8);
    auto a = MakeSeq(1, Concat(system, Range(1, 6)));  // 4 blocks
    auto b = MakeSeq(2, Concat(system, Range(9, 6)));
    auto ga = MakeGroup({a});
    auto gb = MakeGroup({b});
    CHECK(sim.Admit(ga));
    sim.EndStep();
    sim.Computed(a);
    CHECK(sim.Admit(gb));  // hits the 2 system blocks
    sim.EndStep();
    Sim::Prefilled(a);
    Sim::Prefilled(b);
    for (int i = 0; i < 3; ++i) {
        sim.Decode(a, 100 + i);
        sim.Decode(b, 200 + i);
        sim.EndStep();
    }
    // Preempt a: its blocks go to the CPU; global CPU ids are offset by npuBlockNum.
    CHECK(sim.SwapOut(ga));
    BlockIds cpuIds = sim.m.GetBlockIds(1)[0];
    CHECK(cpuIds[0] >= static_cast<BlockId>(npu));
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), cpu - cpuIds.size());
    // b keeps decoding meanwhile.
    sim.Decode(b, 210);
    sim.EndStep();
    // Not enough CPU room for b as well: CanSwapOut says no, SwapOut refuses and changes nothing.
    auto big = MakeSeq(3, Range(3000, 20));
    auto gbig = MakeGroup({big});
    CHECK(sim.Admit(gbig));
    CHECK(!sim.m.CanSwapOut(gbig));
    CHECK_THROWS(std::runtime_error, sim.m.SwapOut(gbig), "not enough free CPU blocks");
    sim.Check();
    // Resume a: its system blocks are still on the NPU (shared with b), so only the others copy.
    // Hit rate as MindIE counts it: one record per full prompt block at Allocate (a: 3 misses; b: 2
    // hits, 1 miss; big: 5 misses), and one per full block at SwapIn: a hit where the NPU still
    // caches the content (shared, no copy), a miss where it is copied.
    CHECK(sim.m.GetPrefixCacheHitRate() > 2.0F / 11 - 1e-6F && sim.m.GetPrefixCacheHitRate() < 2.0F / 11 + 1e-6F);
    uint64_t copiedBefore = Stats(sim.m).swap_in_pages;
    CHECK(sim.SwapIn(ga));
    {
        // a holds 17 tokens: 4 full blocks and a partial one (always copied).
        uint64_t copiedFull = Stats(sim.m).swap_in_pages - copiedBefore - 1;
        float want = static_cast<float>(2 + 4 - copiedFull) / 15.0F;
        CHECK(copiedFull < 4);
        CHECK(sim.m.GetPrefixCacheHitRate() > want - 1e-6F && sim.m.GetPrefixCacheHitRate() < want + 1e-6F);
    }
    CHECK(sim.m.GetBlockIds(1)[0][0] == sim.m.GetBlockIds(2)[0][0]);
    sim.Decode(a, 300);
    sim.EndStep();
    // Freeing a swapped-out sequence returns its CPU blocks.
    CHECK(sim.SwapOut(ga));
    sim.Free(1);
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), cpu);
    std::printf("swap preemption: ok\n");
}

static void SwapInWithoutRoom() {
    const size_t ps = 4;
    const size_t npu = 12;
    Sim sim(ps, npu, 8, false);
    auto a = MakeSeq(1, Range(1, 12));  // 3 blocks
    auto ga = MakeGroup({a});
    CHECK(sim.Admit(ga));
    Sim::Prefilled(a);
    CHECK(sim.SwapOut(ga));
    CHECK(sim.Admit(MakeGroup({MakeSeq(2, Range(100, 40))})));  // 10 of 12 blocks
    CHECK(sim.m.CanSwapIn(ga, 0) == AllocStatus::LATER);
    CHECK(!sim.SwapIn(ga));
    CHECK_THROWS(std::runtime_error, sim.m.SwapIn(ga), "not enough free NPU blocks");
    sim.Check();
    CHECK(sim.m.CanSwapIn(ga, 4 * npu) == AllocStatus::NEVER);
    sim.Free(2);
    CHECK(sim.SwapIn(ga));
    sim.Decode(a, 7);
    std::printf("swap in without room: ok\n");
}

// A swap-out of content the CPU already holds (another sequence swapped it out) shares that CPU
// block, as MindIE's CPU allocator does: no pair, no new block. CanSwapOut counts only the blocks
// it takes, and released CPU blocks that still hold indexed content count as free.
static void SwapOutSharesCpuCopies() {
    const size_t ps = 4;
    const size_t npu = 16;
    const size_t cpu = 4;
    Sim sim(ps, npu, cpu, true);
    std::vector<TokenId> system = Range(1000, 8);
    auto a = MakeSeq(1, Concat(system, Range(1, 3)));  // 2 full blocks + 3 tokens
    auto b = MakeSeq(2, Concat(system, Range(9, 2)));
    auto ga = MakeGroup({a});
    auto gb = MakeGroup({b});
    CHECK(sim.Admit(ga));
    sim.EndStep();
    sim.Computed(a);
    CHECK(sim.Admit(gb));  // shares the 2 system blocks on the NPU
    sim.EndStep();
    Sim::Prefilled(a);
    Sim::Prefilled(b);
    CHECK(sim.SwapOut(ga));  // 3 copies: 1 CPU block left
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), cpu - 3);
    // b's system blocks are on the CPU already: only its last block needs the one left.
    CHECK(sim.m.CanSwapOut(gb));
    CHECK(sim.SwapOut(gb));
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), static_cast<size_t>(0));
    BlockIds ca = sim.m.GetBlockIds(1)[0];
    BlockIds cb = sim.m.GetBlockIds(2)[0];
    CHECK(ca[0] == cb[0] && ca[1] == cb[1] && ca[2] != cb[2]);
    CHECK_EQ(Stats(sim.m).swap_out_pages, static_cast<uint64_t>(4));
    CHECK(sim.SwapIn(ga));
    CHECK(sim.SwapIn(gb));
    // The CPU blocks holding the system prompt stay cached there, and count as free.
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), cpu);
    CHECK_EQ(Stats(sim.m).host_pages_cached, static_cast<uint64_t>(2));
    CHECK(sim.SwapOut(gb));  // shares them again: one copy
    CHECK_EQ(Stats(sim.m).swap_out_pages, static_cast<uint64_t>(5));
    sim.Free(2);
    sim.Free(1);
    CHECK_EQ(sim.m.GetNumFreeCpuBlocks(), cpu);
    std::printf("swap out shares CPU copies: ok\n");
}

// MindIE's FcfsPolicy::ApplyToSwappedQueue calls CanSwapIn, SwapIn and then AppendSlot for the
// token the sequence generated before it was preempted, with no CanAppendSlot in between: CanSwapIn
// must size the swap-in by the sequence's full length (GetLen(), the pending token included).
static void SwapInCoversPendingToken() {
    const size_t ps = 4;
    const size_t npu = 6;
    Sim sim(ps, npu, 8, false);
    auto a = MakeSeq(1, Range(1, 8));  // 2 full blocks
    auto ga = MakeGroup({a});
    CHECK(sim.Admit(ga));
    Sim::Prefilled(a);
    sim.EndStep();
    CHECK(sim.SwapOut(ga));
    CHECK(sim.Admit(MakeGroup({MakeSeq(2, Range(100, 16))})));  // 4 blocks: 2 left
    a->data_.outputTokenIds.push_back(5);                          // the pending token: 9 tokens
    // Two blocks would hold what kvshare has, but not the append that follows.
    CHECK(sim.m.CanSwapIn(ga, 0) == AllocStatus::LATER);
    CHECK(!sim.SwapIn(ga));
    sim.Free(2);
    CHECK(sim.m.CanSwapIn(ga, 0) == AllocStatus::OK);
    CHECK(sim.SwapIn(ga));
    a->data_.outputTokenIds.pop_back();
    sim.Decode(a, 5);  // the scheduler's AppendSlot right after SwapIn
    CHECK_EQ(sim.m.GetBlockIds(1)[0].size(), static_cast<size_t>(3));
    std::printf("swap in covers the pending token: ok\n");
}

// A group of three sequences sharing a prompt's blocks (n > 1 sampling), swapped out and asked
// back in: the blocks they share count once. Their tables add up to more blocks than the NPU has,
// the blocks they hold together do not, so CanSwapIn must not answer NEVER (MindIE's scheduler
// throws on NEVER) and the group must come back and decode. With prefix caching on or off: the
// swap shares a full block by its content either way.
static void GroupSwapCountsSharedBlocksOnce(bool caching) {
    const size_t ps = 4;
    const size_t npu = 10;
    KvshareBlockManager m(Config(ps, npu, 20, caching));
    std::vector<SequenceSPtr> seqs = {MakeSeq(1, Range(1, 22)), MakeSeq(2, Range(1, 22)), MakeSeq(3, Range(1, 22))};
    auto g = MakeGroup(seqs);
    CHECK(m.CanAllocate(g) == AllocStatus::OK);
    CHECK(m.Allocate(g));  // 6 blocks, shared by the three
    for (const auto &s : seqs) {
        s->status_ = SequenceStatus::RUNNING;
        s->data_.UpdateNumComputedTokens(s->GetLen());
    }
    m.MarkBlocksAsComputed();
    // One token each: the shared partial block is copied on write for two of them (8 blocks).
    for (size_t i = 0; i < seqs.size(); ++i) {
        seqs[i]->data_.outputTokenIds.push_back(static_cast<TokenId>(50 + i));
        CHECK(m.CanAppendSlot(MakeGroup({seqs[i]})));
        (void)m.AppendSlot(seqs[i]);
    }
    m.MarkBlocksAsComputed();
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu - 8);
    CHECK(m.CanSwapOut(g));
    (void)m.SwapOut(g);
    for (const auto &s : seqs) {
        s->status_ = SequenceStatus::SWAPPED;
        s->data_.outputTokenIds.push_back(7);  // the token sampled before the preemption, pending
    }
    m.MarkBlocksAsComputed();  // the step ends; the group comes back in a later one
    CheckKvs(m);
    // 3 x 6 table entries, 8 distinct blocks (5 shared full blocks, 3 private partial ones).
    CHECK(m.CanSwapIn(g, 0) == AllocStatus::OK);
    (void)m.SwapIn(g);
    for (const auto &s : seqs) {
        s->status_ = SequenceStatus::RUNNING;
        (void)m.AppendSlot(s);
        CHECK_EQ(m.GetBlockIds(s->seqId_)[0].size(), static_cast<size_t>(6));
    }
    CheckKvs(m);
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu - 8);
    std::printf("group swap counts shared blocks once (caching %s): ok\n", caching ? "on" : "off");
}

// MindIE's worker runs a step's copy_blocks before its swaps (router_impl.py), so a block that
// the step's SwapOut frees may not be the destination of a copy-on-write pair of the same step:
// the copy would overwrite it before the swap-out reads it. Two sequences share a half-full block;
// a victim is swapped out to make room; the shared block's writer must then get a block the swap
// does not read (CanAppendSlot says no while only the victim's blocks are free), and from the next
// step on the victim's blocks are ordinary free blocks again.
static void CopyOnWriteNotIntoSwappedOutBlock(size_t npu) {
    const size_t ps = 4;
    KvshareBlockManager m(Config(ps, npu, 16, true));
    auto a1 = MakeSeq(1, Range(1, 6));  // 2 blocks, the last half full, shared with a2
    auto a2 = MakeSeq(2, Range(1, 6));
    auto ga = MakeGroup({a1, a2});
    auto b = MakeSeq(3, Range(100, 12));  // 3 blocks
    auto gb = MakeGroup({b});
    auto c = MakeSeq(4, Range(200, 8));  // 2 blocks
    auto gc = MakeGroup({c});
    for (const auto &g : {ga, gb, gc}) {
        CHECK(m.Allocate(g));
        for (const auto &s : g->seqs_) {
            s->status_ = SequenceStatus::RUNNING;
            s->data_.UpdateNumComputedTokens(s->GetLen());
        }
    }
    m.MarkBlocksAsComputed();
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu - 7);
    // The next step: b is preempted by swap, then a1 writes into the shared block.
    std::vector<std::pair<PhysicalBlockId, PhysicalBlockId>> out = m.SwapOut(gb);
    CHECK_EQ(out.size(), static_cast<size_t>(3));
    b->status_ = SequenceStatus::SWAPPED;
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu - 4);  // b's blocks count as free, as in MindIE
    a1->data_.outputTokenIds.push_back(9);
    bool can = m.CanAppendSlot(MakeGroup({a1}));
    if (npu == 7) {
        CHECK(!can);  // only b's blocks are free this step
    } else {
        CHECK(can);
        std::vector<std::pair<BlockId, BlockId>> cow = m.AppendSlot(a1);
        CHECK_EQ(cow.size(), static_cast<size_t>(1));
        for (const auto &p : out) {
            CHECK(cow[0].second != static_cast<BlockId>(p.first));
        }
    }
    m.MarkBlocksAsComputed();
    // A new step: b's blocks are free blocks like any other.
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu - 4 - (can ? 1 : 0));
    CHECK(m.CanAppendSlot(MakeGroup({a1})));
    if (!can) {
        CHECK_EQ(m.AppendSlot(a1).size(), static_cast<size_t>(1));
    }
    CheckKvs(m);
    for (SequenceId id = 1; id <= 4; ++id) {
        m.Free(id);
    }
    CHECK_EQ(m.GetNumFreeNpuBlocks(), npu);
    CHECK_EQ(Stats(m).device_pages_in_use, static_cast<uint64_t>(0));
    std::printf("copy-on-write never into a block swapped out in the same step (%zu blocks): ok\n", npu);
}

static void NoCaching() {
    const size_t ps = 4;
    Sim sim(ps, 16, 4, false);
    auto a = MakeSeq(1, Range(1, 9));
    auto b = MakeSeq(2, Range(1, 9));
    CHECK(sim.Admit(MakeGroup({a})));
    sim.EndStep();
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(b), static_cast<size_t>(0));
    CHECK(sim.Admit(MakeGroup({b})));
    CHECK_EQ(sim.m.GetNumCachedTokens(b), static_cast<size_t>(0));
    CHECK(sim.m.GetPrefixCacheHitRate() < 0.0F);
    CHECK(sim.m.ResetPrefixCache());
    sim.Free(1);
    sim.Free(2);
    // Full blocks stay hashed (swaps share them by content) but every block is free, and the
    // same prompt again shares nothing.
    CHECK_EQ(sim.m.GetNumFreeNpuBlocks(), static_cast<size_t>(16));
    auto c = MakeSeq(3, Range(1, 9));
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(c), static_cast<size_t>(0));
    CHECK(sim.Admit(MakeGroup({c})));
    CHECK_EQ(sim.m.GetNumCachedTokens(c), static_cast<size_t>(0));
    sim.Free(3);
    std::printf("no caching: ok\n");
}

static void AdmissionLimits() {
    const size_t ps = 4;
    Sim sim(ps, 8, 0, true);
    CHECK_EQ(sim.m.GetTotalNpuBlocks(), static_cast<size_t>(8));
    auto huge = MakeGroup({MakeSeq(1, Range(1, 40))});
    CHECK(sim.m.CanAllocate(huge) == AllocStatus::NEVER);
    auto a = MakeSeq(2, Range(1, 20));  // 5 blocks
    CHECK(sim.Admit(MakeGroup({a})));
    auto b = MakeGroup({MakeSeq(3, Range(100, 16))});  // 4 blocks, 3 free
    CHECK(sim.m.CanAllocate(b) == AllocStatus::LATER);
    CHECK(!sim.Admit(b));
    sim.Free(2);
    CHECK(sim.Admit(b));
    std::printf("admission limits: ok\n");
}

static void Eviction() {
    // With every block cached, new prompts evict cached blocks, least recently released first.
    const size_t ps = 4;
    Sim sim(ps, 8, 0, true);
    for (SequenceId id = 1; id <= 6; ++id) {
        auto s = MakeSeq(id, Range(100 * id, 16));
        CHECK(sim.Admit(MakeGroup({s})));
        sim.EndStep();
        Sim::Prefilled(s);
        CHECK_EQ(sim.m.GetNumFreeNpuBlocks(), static_cast<size_t>(4));
        sim.Free(id);
        CHECK_EQ(sim.m.GetNumFreeNpuBlocks(), static_cast<size_t>(8));
    }
    CHECK(Stats(sim.m).evictions > 0);
    // The last prompt is still cached (3 of its 4 blocks are shareable), the first is gone.
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(MakeSeq(10, Range(600, 16))), 3 * ps);
    CHECK_EQ(sim.m.GetSeqNumCachedTokens(MakeSeq(11, Range(100, 16))), static_cast<size_t>(0));
    std::printf("eviction: ok\n");
}

int main() {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    SharedSystemPrompt();
    ExactMultipleRecomputesLastPage();
    LoraAndPlaceholders();
    BeamForkCopyOnWrite();
    SpeculativeSlots();
    SwapPreemption();
    SwapInWithoutRoom();
    SwapInCoversPendingToken();
    GroupSwapCountsSharedBlocksOnce(true);
    GroupSwapCountsSharedBlocksOnce(false);
    CopyOnWriteNotIntoSwappedOutBlock(7);
    CopyOnWriteNotIntoSwappedOutBlock(8);
    SwapOutSharesCpuCopies();
    NoCaching();
    AdmissionLimits();
    Eviction();
    std::printf("test_scenarios: all passed\n");
    return 0;
}
