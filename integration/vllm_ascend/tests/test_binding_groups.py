"""``kvshare.Cache`` with several KV-cache groups (``kvs_config.groups``), as the plugin's
manager uses it for hybrid models: config, per-group tables after the window moved, hits, views,
stats, events, and errors raised as the package's exception classes."""

import pytest

import kvshare

PS = 4


def make(**kw):
    groups = kw.pop("groups", [("sliding_window", 8, 4096), ("full", 0, 4096)])
    kw.setdefault("reserve_null_page", True)
    return kvshare.Cache(page_size=PS, num_device_pages=kw.pop("num_pages", 32), groups=groups,
                         vllm_free_order=True, enable_events=True, **kw)


def begin(h, *args, **kw):
    """The counts of ``seq_begin`` these tests check."""
    info = h.seq_begin(*args, **kw)
    return {k: info[k] for k in ("matched_tokens", "num_pages", "new_pages")}


def test_config_errors_name_the_field():
    for groups, field in [([("full", 0, 1)] * 33, "num_groups"),
                          ([("sliding_window", 0, 1)], "groups.window"),
                          ([("full", 3, 1)], "groups.window"), ([(7, 0, 1)], "groups.kind"),
                          # state: 9 is no mode, none needs prefix caching off
                          ([("state", 9, 1)], "groups.window"),
                          ([("state", "none", 1)], "groups.window")]:
        with pytest.raises(kvshare.InvalidConfigError) as e:
            make(groups=groups)
        assert field in str(e.value)
    # Combinations the core refuses by name: a non-full group needs the null page; sub-page
    # hits need whole-page state checkpoints.
    with pytest.raises(kvshare.InvalidConfigError) as e:
        make(groups=[("sliding_window", 8, 1)], reserve_null_page=False)
    assert "reserve_null_page" in str(e.value)
    with pytest.raises(kvshare.InvalidConfigError) as e:
        make(groups=[("full", 0, 1), ("state", "all", 1)], match_unit=1)
    assert "match_unit" in str(e.value)
    for mode in ("all", "align"):  # these need prefix caching on
        with pytest.raises(kvshare.InvalidConfigError) as e:
            make(groups=[("state", mode, 1)], enable_prefix_caching=False)
        assert "groups.window" in str(e.value)


def test_eagle_groups_drop_the_last_hit_page():
    """An EAGLE group (a fourth tuple item or ``"eagle"``) reads back as one; the hit of a
    window + full cache drops its last page (20 tokens without EAGLE, 16 with); a begin capped
    at that hit takes it; kinds that cannot drop a page are refused by name."""
    toks = list(range(700, 724))
    hits = []
    for eagle in (False, True):
        h = make(groups=[("sliding_window", 8, 4096, eagle),
                         {"kind": "full", "page_bytes": 4096, "eagle": eagle}])
        assert [h.group_info(g)["eagle"] for g in (0, 1)] == [eagle, eagle]
        h.seq_begin(1, toks)
        h.seq_free(1)
        hit, _ = h.prefix_find(toks, 23)
        assert begin(h, 2, toks, max_match_tokens=hit)["matched_tokens"] == hit
        hits.append(hit)
    assert hits == [20, 16]
    for g in [("chunked_local", 8, 4096, True), ("state", "all", 4096, True)]:
        with pytest.raises(kvshare.InvalidConfigError) as e:
            make(groups=[("full", 0, 4096), g])
        assert "groups.flags" in str(e.value)


def test_no_groups_is_one_full_group():
    c = kvshare.Cache(page_size=PS, num_device_pages=8)
    assert c.num_groups == 1 and c.group_info(0)["kind"] == "full"
    assert c.group_info(0)["page_bytes"] == c.stats()["page_bytes"]


def test_pools_follow_page_bytes():
    h = make(groups=[("full", 0, 100), {"kind": "chunked_local", "window": 16, "page_bytes": 50},
                     ("sliding_window", 8, 100)])
    assert [h.group_info(g)["pool"] for g in range(3)] == [0, 1, 0]
    assert h.group_info(1) == {"kind": "chunked_local", "window": 16, "page_bytes": 50,
                               "pool": 1, "num_pools": 2, "num_groups": 3, "flags": 0,
                               "eagle": False}


def test_window_release_hit_and_views():
    h = make()
    toks = list(range(100, 120))
    assert begin(h, 1, toks) == {"matched_tokens": 0, "num_pages": 5, "new_pages": 10}
    assert h.seq_release_skipped(1, 20) == 3  # (20 - 8 + 1) // 4 pages out of the window
    sw, full = h.seq_pages(1, 0), h.seq_pages(1, 1)
    assert list(sw[:3]) == [0, 0, 0] and 0 not in sw[3:] and 0 not in full
    h.seq_append(1, [7])
    # The released pages stay matchable for the full group; the window group needs only the
    # last cdiv(8 - 1, 4) = 2 pages before the hit.
    n, pages = h.prefix_find(toks + [9], 20)
    assert n == 20 and list(pages[0][:3]) == [0, 0, 0] and list(pages[1]) == list(full)
    info = h.seq_begin(2, toks + [9], max_match_tokens=20)
    assert info["matched_tokens"] == 20 and info["new_pages"] == 2
    table, lens = h.block_tables([1, 2], 8, group=0)
    assert list(lens) == [21, 21] and table[8:11].tolist() == [0, 0, 0]
    slots = h.slot_mapping([2], [1], group=1)
    assert slots[0] == h.seq_pages(2, 1)[5] * PS
    assert h.group_stats(0)["pages_released"] == 3
    st = h.stats()
    assert st["num_seqs"] == 2 and st["prefix_hit_tokens"] == 20
    ev = h.take_events()
    assert {e["group"] for e in ev} == {0, 1}
    h.check()
    h.seq_free(1)
    h.seq_free(2)
    assert h.group_stats(1)["pool_pages_in_use"] == 0
    h.check()


def test_errors():
    h = make(num_pages=6)
    h.seq_begin(1, list(range(8)))  # 2 pages per group: 4 of the 5 usable pages
    with pytest.raises(kvshare.SeqExistsError):
        h.seq_begin(1, [1])
    with pytest.raises(kvshare.NoSpaceError):
        h.seq_append(1, list(range(8)))
    assert h.seq_append_need(1, 8)[0] == 4
    with pytest.raises(kvshare.SeqNotFoundError):
        h.seq_free(9)
    with pytest.raises(kvshare.InvalidArgumentError):
        h.seq_pages(1, 2)
    h.check()


def test_state_all_checkpoints_gate_and_release():
    """Mode "all": a checkpoint per page; a hit resumes from the deepest one; a checkpoint
    registered in this step is not usable until ``new_step`` (vLLM's cached_blocks_this_step)."""
    h = make(groups=[("full", 0, 4096), {"kind": "state", "mode": "all", "page_bytes": 4096}])
    assert h.group_info(1) == {"kind": "state", "window": kvshare.lib.KVS_STATE_MODE_ALL,
                               "mode": "all", "page_bytes": 4096, "pool": 0, "num_pools": 1,
                               "num_groups": 2, "flags": 0, "eagle": False}
    toks = list(range(100, 110))
    assert begin(h, 1, toks) == {"matched_tokens": 0, "num_pages": 3, "new_pages": 6}
    state = h.seq_pages(1, 1)
    assert h.seq_state_page(1, 1) == state[2]
    follow = toks[:8] + [50, 51, 52]
    with pytest.raises(kvshare.NoSpaceError):
        h.seq_begin(2, follow, max_match_tokens=10)
    h.new_step()
    info = begin(h, 2, follow, max_match_tokens=10)
    # Resumes from the checkpoint after 8 tokens (page 1 of sequence 1's state group).
    assert info == {"matched_tokens": 8, "num_pages": 3, "new_pages": 2}
    assert list(h.seq_pages(2, 1)[:2]) == [0, state[1]]
    # The running state only: pages before the one holding token 9 are released.
    assert h.seq_release_skipped(1, 10) == 2
    assert list(h.seq_pages(1, 1)) == [0, 0, state[2]]
    assert h.group_stats(1)["pages_held"] == 1 + 2
    ev = h.take_events()
    assert {e["group"] for e in ev} == {0, 1}
    with pytest.raises(kvshare.InvalidArgumentError):
        h.seq_state_page(1, 0)  # not a state group
    h.check()
    h.seq_free(1)
    h.seq_free(2)
    # Released checkpoints stay matchable.
    assert h.prefix_find(follow, 10)[0] == 8
    h.check()


def test_state_none_one_page():
    h = make(groups=[("full", 0, 4096), ("state", "none", 4096)], enable_prefix_caching=False)
    assert begin(h, 1, list(range(10))) == {"matched_tokens": 0, "num_pages": 3,
                                               "new_pages": 4}
    p = h.seq_state_page(1, 1)
    assert list(h.seq_pages(1, 1)) == [0, 0, p]
    h.seq_append(1, [1, 2, 3])
    assert list(h.seq_pages(1, 1)) == [0, 0, 0, p]
    assert h.seq_append_need(1, 8)[0] == 2  # the full group only
    assert h.group_stats(1)["pages_held"] == 1
    h.check()


def test_state_align_keeps_the_previous_state_until_released():
    """Mode "align" (vLLM's for Qwen3-Next): one new page per step at the table's end, nulls
    padded before it; the previous step's page is released at the next release; a step ending
    on a page boundary leaves a checkpoint that a later prompt resumes from."""
    h = make(groups=[("full", 0, 4096), ("state", "align", 4096)])
    toks = list(range(200, 212))
    # A 12-token first chunk: 3 full pages, but one state page (at the end).
    assert begin(h, 1, toks[:8]) == {"matched_tokens": 0, "num_pages": 2, "new_pages": 3}
    a = h.seq_state_page(1, 1)
    assert list(h.seq_pages(1, 1)) == [0, a]
    assert h.seq_release_skipped(1, 8) == 0
    assert h.seq_append_need(1, 4)[0] == 2
    h.seq_append(1, toks[8:])
    b = h.seq_state_page(1, 1)
    assert list(h.seq_pages(1, 1)) == [0, a, b] and a != b  # previous state kept
    assert h.seq_release_skipped(1, 12) == 1  # ... until the state moved on
    assert list(h.seq_pages(1, 1)) == [0, 0, b]
    with pytest.raises(kvshare.InvalidArgumentError):
        h.seq_append(1, [1], lookahead_slots=1)  # align takes no lookahead
    h.new_step()
    info = h.seq_begin(2, toks[:8] + [5, 6, 7], max_match_tokens=10)
    assert info["matched_tokens"] == 8 and list(h.seq_pages(2, 1))[:2] == [0, a]
    h.check()


def test_fork_swap_and_pins_work_on_groups():
    """The one-group cache's capabilities on a windowed model: copy-on-write copies one page per
    group, swap moves every held page of every group (released positions stay released), a
    pin holds what a hit needs in each group."""
    D2D, D2H, H2D = (kvshare.lib.KVS_COPY_KIND_DEVICE_TO_DEVICE,
                     kvshare.lib.KVS_COPY_KIND_DEVICE_TO_HOST,
                     kvshare.lib.KVS_COPY_KIND_HOST_TO_DEVICE)
    h = make(num_pages=16, num_host_pages=16)
    toks = list(range(100, 118))  # 4 full pages and 2 tokens
    h.seq_begin(1, toks)
    assert h.seq_release_skipped(1, 18) == 2  # window 8: positions 0 and 1 of group 0
    parent = [list(h.seq_pages(1, g)) for g in range(2)]
    h.seq_fork(1, 2)
    copies = h.seq_append(2, [5, 6])  # writes into the shared partial page: one copy per group
    assert sorted((c[3], c[4], c[2], c[0]) for c in copies) == [
        (D2D, 0, 2, parent[0][4]), (D2D, 1, 2, parent[1][4])]
    for g in range(2):
        child = list(h.seq_pages(2, g))
        assert child[:4] == parent[g][:4] and child[4] == next(c[1] for c in copies if c[4] == g)
    h.seq_free(2)

    out = h.seq_swap_out(1)
    held = [[p for p in parent[g] if p] for g in range(2)]
    assert all(c[3] == D2H for c in out)
    assert sorted((c[4], c[0]) for c in out) == sorted((g, p) for g in range(2) for p in held[g])
    assert h.seq_info(1)["tier"] == kvshare.lib.KVS_TIER_HOST
    host = list(h.seq_pages(1, 0))
    assert host[:2] == [0xFFFFFFFF] * 2  # released positions, on the host
    inn = h.seq_swap_in(1)
    assert all(c[3] == H2D for c in inn) and h.seq_info(1)["tier"] == kvshare.lib.KVS_TIER_DEVICE
    back = [list(h.seq_pages(1, g)) for g in range(2)]
    assert back[0][:2] == [0, 0] and 0 not in back[0][2:] and 0 not in back[1]
    h.check()

    pin, n = h.prefix_pin(toks[:16])
    assert n == 2 + 4  # the window's last cdiv(8 - 1, 4) pages before the hit, every full one
    h.seq_free(1)
    assert h.stats()["device_pages_pinned"] == n
    h.prefix_unpin(pin)
    assert h.stats()["device_pages_pinned"] == 0
    h.check()
