/*
 * Several threads share one cache, as a scheduler thread and workers would: each runs a
 * bounded, deterministic (per-thread PRNG) mix of begin / append / batch append / fork /
 * swap out / swap in / release of skipped pages / page-level match + acquire, alloc +
 * register, release / free, plus block tables, slot mapping, stats and occasional checks and
 * prefix clears. Prompts are drawn from a few shared prefixes so threads share pages. NO_SPACE
 * is an acceptable outcome of any allocating call; every other status must be the one
 * expected.
 *
 * Each thread also keeps its own model of its sequences (token count, tier) and compares it
 * with kvs_seq_info. At the end every thread frees what it holds, and the program asserts that
 * no page is in use, no sequence is left, and kvs_cache_check is OK. The whole run happens on
 * a cache of one group, then on a cache of groups (full attention, a sliding window, a state
 * group in a pool of its own: every call on every group, the host tier and copy-on-write
 * included). Runs under TSan too.
 */
#include <pthread.h>

#include "kvs_test.h"

#define NTHREADS 4
#define OPS_PER_THREAD 5000 /* 20k operations in all */
#define PS 4u
#define NDEV 192u
#define NHOST 48u
#define NPREFIX 4
#define PREFIX_LEN 12 /* 3 full pages */
#define MAXLIVE 12
#define MAXHELD 6
#define MAXTOK 64
#define MAXPG 32
#define MAXLEN 100 /* tokens per sequence, so a block table fits MAXPG pages */

static kvs_cache *cache;
static int32_t prefixes[NPREFIX][PREFIX_LEN];
/* The cache's groups: how many, how many pools, which are state groups. */
static size_t ngroups;
static size_t npools;
static int is_state[4];

typedef struct {
    uint64_t id;
    uint64_t tokens;
    uint32_t tier;
} live_seq;

typedef struct {
    uint32_t pages[MAXPG];
    size_t n;
    size_t group;
} held_pages;

typedef struct {
    int index;
    uint64_t rng;
    uint64_t next_id;
    live_seq live[MAXLIVE];
    size_t nlive;
    held_pages held[MAXHELD];
    size_t nheld;
    /* outcome counters, printed at the end */
    unsigned long ok, no_space, cow, swaps, hits;
} worker;

static uint64_t rnd(worker *w) {
    /* xorshift64* */
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return w->rng * 0x2545F4914F6CDD1DULL;
}

static uint32_t below(worker *w, uint32_t n) {
    return (uint32_t)(rnd(w) % n);
}

/* An allocating call: OK or NO_SPACE. Returns whether it succeeded. */
static int alloc_outcome(worker *w, uint32_t st, const char *what, int line) {
    if (st == KVS_STATUS_OK) {
        w->ok++;
        return 1;
    }
    if (st == KVS_STATUS_NO_SPACE) {
        w->no_space++;
        return 0;
    }
    t_fail_status(__FILE__, line, what, st, KVS_STATUS_OK);
}
#define ALLOC_OK(w, call) alloc_outcome((w), (uint32_t)(call), #call, __LINE__)

static void model_check(const live_seq *s) {
    kvs_seq_info i;
    CHECK_OK(kvs_seq_info_fn(cache, s->id, &i));
    CHECK_EQ(i.num_tokens, s->tokens);
    CHECK_EQ(i.tier, s->tier);
    CHECK(i.num_pages >= (s->tokens + PS - 1) / PS);
}

static void drop_live(worker *w, size_t k) {
    w->live[k] = w->live[--w->nlive];
}

static void op_begin(worker *w) {
    if (w->nlive == MAXLIVE) {
        return;
    }
    int32_t t[MAXTOK];
    size_t n = 0;
    uint32_t which = below(w, NPREFIX + 1); /* NPREFIX: no shared prefix */
    if (which < NPREFIX) {
        size_t keep = PREFIX_LEN - below(w, 6); /* sometimes only part of the prefix */
        memcpy(t, prefixes[which], keep * sizeof(int32_t));
        n = keep;
    }
    size_t extra = below(w, 14);
    for (size_t i = 0; i < extra; i++) {
        t[n++] = (int32_t)below(w, 50000);
    }
    uint64_t id = w->next_id++;
    size_t max_match = below(w, 2) ? SIZE_MAX : (n > 0 ? n - 1 : 0);
    kvs_seq_info info;
    if (ALLOC_OK(w, kvs_seq_begin(cache, id, t, n, NULL, max_match, 0, &info))) {
        CHECK_EQ(info.num_tokens, n);
        CHECK(info.matched_tokens <= n);
        if (info.matched_tokens > 0) {
            w->hits++;
        }
        w->live[w->nlive++] = (live_seq){id, n, T_TIER_DEVICE};
    }
}

static void op_append(worker *w) {
    if (w->nlive == 0) {
        return;
    }
    live_seq *s = &w->live[below(w, (uint32_t)w->nlive)];
    int32_t t[5];
    size_t n = 1 + below(w, 5);
    for (size_t i = 0; i < n; i++) {
        t[i] = (int32_t)below(w, 50000);
    }
    size_t lookahead = below(w, 3);
    if (s->tokens + n + lookahead > MAXLEN) {
        return;
    }
    kvs_copy cp[4];
    size_t nc = 99;
    uint32_t st = (uint32_t)kvs_seq_append(cache, s->id, t, n, lookahead, cp, 4, &nc);
    if (s->tier == T_TIER_HOST) {
        CHECK_STATUS(st, KVS_STATUS_SEQ_WRONG_TIER);
        return;
    }
    if (alloc_outcome(w, st, "kvs_seq_append", __LINE__)) {
        /* At most one copy per group: its partial page, or a state group's whole state. */
        CHECK(nc <= ngroups);
        for (size_t j = 0; j < nc; j++) {
            w->cow++;
            CHECK_EQ(cp[j].kind, T_COPY_D2D);
            CHECK(cp[j].group < ngroups);
            CHECK(cp[j].num_tokens > 0 && cp[j].num_tokens <= PS);
            CHECK(cp[j].num_tokens < PS || is_state[cp[j].group]);
            CHECK(cp[j].src_page != cp[j].dst_page);
        }
        s->tokens += n;
    }
}

static void op_batch(worker *w) {
    uint64_t ids[MAXLIVE];
    int32_t t[MAXLIVE];
    live_seq *who[MAXLIVE];
    size_t n = 0;
    for (size_t k = 0; k < w->nlive; k++) {
        if (w->live[k].tier == T_TIER_DEVICE && w->live[k].tokens < MAXLEN && below(w, 2)) {
            who[n] = &w->live[k];
            ids[n] = w->live[k].id;
            t[n] = (int32_t)below(w, 50000);
            n++;
        }
    }
    kvs_copy cp[MAXLIVE * 4];
    size_t nc = 99;
    if (ALLOC_OK(w, kvs_seq_append_batch(cache, ids, n, t, n, cp, MAXLIVE * 4, &nc))) {
        CHECK(nc <= n * ngroups);
        for (size_t k = 0; k < n; k++) {
            who[k]->tokens++;
        }
        w->cow += nc;
        /* The engine's view of this step: block tables and slot mapping of the batch. */
        if (n > 0) {
            size_t g = below(w, (uint32_t)ngroups);
            int32_t table[MAXLIVE * MAXPG];
            int32_t lens[MAXLIVE];
            CHECK_OK(kvs_cache_block_tables(cache, g, ids, n, MAXPG, -1, table, MAXLIVE * MAXPG,
                                            lens, MAXLIVE));
            uint32_t q[MAXLIVE];
            for (size_t k = 0; k < n; k++) {
                CHECK_EQ(lens[k], who[k]->tokens);
                q[k] = 1;
            }
            int64_t slots[MAXLIVE];
            size_t ns = 0;
            CHECK_OK(kvs_cache_slot_mapping(cache, g, ids, q, n, slots, MAXLIVE, &ns));
            CHECK_EQ(ns, n);
            for (size_t k = 0; k < n; k++) {
                /* The new token's slot lies in the block table's page for its position. */
                uint64_t pos = who[k]->tokens - 1;
                int64_t page = table[k * MAXPG + pos / PS];
                CHECK(slots[k] == -1 || slots[k] == page * (int64_t)PS + (int64_t)(pos % PS));
            }
        }
    }
}

static void op_fork(worker *w) {
    if (w->nlive == 0 || w->nlive == MAXLIVE) {
        return;
    }
    live_seq *s = &w->live[below(w, (uint32_t)w->nlive)];
    uint64_t child = w->next_id++;
    uint32_t st = (uint32_t)kvs_seq_fork(cache, s->id, child);
    if (s->tier == T_TIER_HOST) {
        CHECK_STATUS(st, KVS_STATUS_SEQ_WRONG_TIER);
        return;
    }
    CHECK_STATUS(st, KVS_STATUS_OK); /* a fork allocates nothing */
    w->live[w->nlive++] = (live_seq){child, s->tokens, T_TIER_DEVICE};
}

static void op_swap(worker *w) {
    if (w->nlive == 0) {
        return;
    }
    live_seq *s = &w->live[below(w, (uint32_t)w->nlive)];
    kvs_copy cp[MAXPG * 4];
    size_t nc = 99;
    if (s->tier == T_TIER_DEVICE) {
        kvs_seq_info before;
        CHECK_OK(kvs_seq_info_fn(cache, s->id, &before));
        if (ALLOC_OK(w, kvs_seq_swap_out(cache, s->id, cp, MAXPG * 4, &nc))) {
            /* Full pages whose content the host holds already are shared, not copied. */
            CHECK(nc <= before.num_pages * ngroups);
            for (size_t j = 0; j < nc; j++) {
                CHECK_EQ(cp[j].kind, T_COPY_D2H);
            }
            s->tier = T_TIER_HOST;
            w->swaps++;
        }
    } else if (ALLOC_OK(w, kvs_seq_swap_in(cache, s->id, cp, MAXPG * 4, &nc))) {
        for (size_t j = 0; j < nc; j++) {
            CHECK_EQ(cp[j].kind, T_COPY_H2D);
        }
        s->tier = T_TIER_DEVICE;
        w->swaps++;
    }
}

static void op_pages(worker *w) {
    if (w->nheld == MAXHELD) {
        return;
    }
    held_pages *h = &w->held[w->nheld];
    h->group = below(w, (uint32_t)ngroups);
    if (below(w, 2)) {
        /* Match a shared prefix in one group and take references on the hit pages. */
        size_t mt = 0;
        uint32_t which = below(w, NPREFIX);
        CHECK_OK(kvs_prefix_match(cache, h->group, prefixes[which], PREFIX_LEN, NULL, SIZE_MAX,
                                  true, h->pages, MAXPG, &h->n, &mt));
        CHECK_EQ(mt, h->n * PS);
        if (h->n > 0) {
            w->hits++;
            w->nheld++;
        }
    } else {
        /* Allocate pages and register them under fresh tokens, as an engine with its own
         * block tables would after computing their KV. */
        size_t n = 1 + below(w, 4);
        if (ALLOC_OK(w, kvs_pages_alloc(cache, h->group, n, h->pages, MAXPG))) {
            h->n = n;
            int32_t t[4 * PS];
            for (size_t i = 0; i < n * PS; i++) {
                t[i] = (int32_t)below(w, 50000);
            }
            size_t reg = 99;
            CHECK_OK(kvs_prefix_register(cache, h->group, t, n * PS, h->pages, n, NULL, &reg));
            CHECK(reg <= n);
            w->nheld++;
        }
    }
}

static void release_held(worker *w, size_t k) {
    held_pages *h = &w->held[k];
    uint32_t rev[MAXPG];
    for (size_t j = 0; j < h->n; j++) {
        rev[j] = h->pages[h->n - 1 - j];
    }
    CHECK_OK(kvs_pages_release(cache, h->group, rev, h->n));
    w->held[k] = w->held[--w->nheld];
}

static void op_release(worker *w) {
    if (w->nheld > 0) {
        release_held(w, below(w, (uint32_t)w->nheld));
    }
}

/* vLLM's release before an allocation: the pages a group no longer reads at the tokens
 * computed (all of them). */
static void op_release_skipped(worker *w) {
    if (w->nlive == 0) {
        return;
    }
    live_seq *s = &w->live[below(w, (uint32_t)w->nlive)];
    size_t n = 99;
    uint32_t st = (uint32_t)kvs_seq_release_skipped(cache, s->id, s->tokens, &n);
    if (s->tier == T_TIER_HOST) {
        CHECK_STATUS(st, KVS_STATUS_SEQ_WRONG_TIER);
        CHECK_EQ(n, 99);
        return;
    }
    CHECK_OK(st);
    CHECK(n <= (s->tokens / PS + 1) * ngroups);
}

static void op_free(worker *w) {
    if (w->nlive == 0) {
        return;
    }
    size_t k = below(w, (uint32_t)w->nlive);
    model_check(&w->live[k]);
    CHECK_OK(kvs_seq_free(cache, w->live[k].id));
    CHECK_STATUS(kvs_seq_free(cache, w->live[k].id), KVS_STATUS_SEQ_NOT_FOUND);
    drop_live(w, k);
}

static void *run(void *arg) {
    worker *w = arg;
    for (int i = 0; i < OPS_PER_THREAD; i++) {
        uint32_t r = below(w, 100);
        if (r < 16) {
            op_begin(w);
        } else if (r < 38) {
            op_append(w);
        } else if (r < 48) {
            op_batch(w);
        } else if (r < 54) {
            op_fork(w);
        } else if (r < 64) {
            op_swap(w);
        } else if (r < 74) {
            op_pages(w);
        } else if (r < 84) {
            op_release(w);
        } else if (r < 94) {
            op_free(w);
        } else if (r < 97) {
            op_release_skipped(w);
        } else if (r < 99) {
            if (w->nlive > 0) {
                model_check(&w->live[below(w, (uint32_t)w->nlive)]);
            }
            kvs_stats s = t_stats(cache);
            CHECK(s.device_pages_free + s.device_pages_cached + s.device_pages_in_use ==
                  (NDEV - 1) * npools);
            CHECK(s.host_pages_free + s.host_pages_cached + s.host_pages_in_use ==
                  NHOST * npools);
        } else {
            CHECK_CACHE(cache);
            if (below(w, 8) == 0) {
                CHECK_OK(kvs_prefix_clear(cache));
            }
        }
    }
    /* Tear down everything this thread holds. */
    while (w->nlive > 0) {
        op_free(w);
    }
    while (w->nheld > 0) {
        release_held(w, w->nheld - 1);
    }
    return NULL;
}

/* The whole run on a cache of the groups `g[0..n)` (n 0: one full-attention group). */
static void scenario(const char *name, const kvs_group *g, size_t n) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = NDEV;
    cfg.num_host_pages = NHOST;
    cfg.reserve_null_page = true;
    cfg.groups = g;
    cfg.num_groups = n;
    CHECK_OK(kvs_cache_new(&cfg, &cache));
    kvs_group_info gi;
    CHECK_OK(kvs_cache_group_info(cache, 0, &gi));
    ngroups = gi.num_groups;
    npools = gi.num_pools;
    for (size_t k = 0; k < ngroups; k++) {
        CHECK_OK(kvs_cache_group_info(cache, k, &gi));
        is_state[k] = gi.kind == KVS_GROUP_KIND_STATE;
    }

    static worker workers[NTHREADS];
    pthread_t threads[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].index = i;
        workers[i].rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1);
        workers[i].next_id = (uint64_t)(i + 1) << 40;
        CHECK(pthread_create(&threads[i], NULL, run, &workers[i]) == 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
    }

    kvs_stats s = t_stats(cache);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.device_pages_shared, 0);
    CHECK_EQ(s.host_pages_in_use, 0);
    CHECK_EQ(s.num_seqs, 0);
    CHECK_EQ(s.num_seqs_swapped, 0);
    CHECK_EQ(s.logical_tokens, 0);
    CHECK_EQ(s.device_pages_free + s.device_pages_cached, (NDEV - 1) * npools);
    CHECK_EQ(s.device_pages_cached, s.index_pages);
    CHECK_CACHE(cache);

    unsigned long ok = 0, no_space = 0, cow = 0, swaps = 0, hits = 0;
    for (int i = 0; i < NTHREADS; i++) {
        ok += workers[i].ok;
        no_space += workers[i].no_space;
        cow += workers[i].cow;
        swaps += workers[i].swaps;
        hits += workers[i].hits;
    }
    printf("stress (%s): %lu allocating calls ok, %lu NO_SPACE, %lu CoW copies, %lu swaps, "
           "%lu prefix hits; evictions %" PRIu64 "\n",
           name, ok, no_space, cow, swaps, hits, s.evictions);
    /* The mix must actually exercise sharing, copy-on-write and swapping. */
    CHECK(hits > 0);
    CHECK(cow > 0);
    CHECK(swaps > 0);
    kvs_cache_free(cache);
}

int main(void) {
    for (int p = 0; p < NPREFIX; p++) {
        t_iota(prefixes[p], PREFIX_LEN, 100000 + 1000 * p);
    }
    scenario("one group", NULL, 0);
    const kvs_group groups[3] = {
        {KVS_GROUP_KIND_FULL, 0, 0, 0},
        {KVS_GROUP_KIND_SLIDING_WINDOW, 7, 0, 0},
        {KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 4096, 0},
    };
    scenario("full, window, state", groups, 3);
    printf("stress: ok\n");
    return 0;
}
