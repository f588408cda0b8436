"""Mamba / linear-attention state groups (vLLM's ``MambaSpec`` / ``MambaManager``) in kvshare's
manager: kvshare's STATE group kind (``KVS_GROUP_KIND_STATE``, the group's ``window`` carrying
the ``kvs_state_mode``).

vLLM 0.23.0's ``mamba_cache_mode`` decides what a request holds in a state group:

* ``"all"`` (prefix caching on; the default for models that support it: Mamba2, Jamba,
  Nemotron-H, ...): the base manager with ``get_num_skipped_tokens(n) = n - 1``: a state page
  per page of tokens, every full one cached, the request keeps the page of its last computed
  token; a hit resumes from the rightmost cached checkpoint.  Managed by kvshare: the group is
  "windowed" here (positions before the page of token n-1 are released), and a hit on a state
  page registered in the current step is refused (vLLM's ``cached_blocks_this_step``:
  ``kvs_seq_begin`` fails with NO_SPACE, ``allocate_slots`` returns None).
* ``"none"`` (prefix caching off): the group's block size is ``max_model_len``: vLLM's table
  for the group is one block, ``[state]``, for the request's life.  kvshare keeps the state
  page at the last position of a table as long as the attention groups'; the manager hands
  vLLM ``[page]`` (:func:`vllm_table`).
* ``"align"`` (the default for Qwen3-Next / Qwen3.5 GDN layers): a request holds at most its
  running state page and the previous step's; vLLM's admission takes one new block whenever
  the table grows (:func:`align_blocks_to_allocate`), and a release drops every page before
  the last computed token's (:func:`align_release`).
"""

from __future__ import annotations

import math

#: ``kvs_state_mode`` values (``include/kvshare.h``) of vLLM's ``mamba_cache_mode`` names.
STATE_MODES = {"none": 0, "all": 1, "align": 2}
#: Modes the plugin runs on kvshare's STATE groups.
MANAGED_MODES = ("none", "all", "align")


def is_state_spec(spec) -> bool:
    return type(spec).__name__ == "MambaSpec"


def state_group_kind(spec) -> tuple[str, int]:
    """kvshare's (kind, window) for a ``MambaSpec``: ("state", its ``kvs_state_mode``)."""
    return "state", STATE_MODES[spec.mamba_cache_mode]


def state_unsupported_reason(groups, scheduler_block_size: int, hash_block_size: int,
                             max_model_len: int | None, lib) -> tuple[str | None, int | None]:
    """Checks the state groups of ``groups`` (vLLM's ``KVCacheGroupSpec`` list).  Returns
    (why not, None) or (None, the page size: the attention groups' block size) when the
    configuration has state groups kvshare can run; (None, None) when it has none."""
    states = [(i, g.kv_cache_spec) for i, g in enumerate(groups) if is_state_spec(g.kv_cache_spec)]
    if not states:
        return None, None
    for i, spec in states:
        mode = spec.mamba_cache_mode
        if mode not in MANAGED_MODES:
            return (f"KV-cache group {i}: MambaSpec with mamba_cache_mode {mode!r} (kvshare's "
                    f"state groups run {', '.join(map(repr, MANAGED_MODES))})"), None
        if spec.num_speculative_blocks:
            return (f"KV-cache group {i}: MambaSpec with {spec.num_speculative_blocks} "
                    "speculative blocks (MTP / EAGLE with linear attention)"), None
    modes = {spec.mamba_cache_mode for _, spec in states}
    if len(modes) != 1:
        return f"state groups in different mamba_cache_modes ({sorted(modes)})", None
    attn = {g.kv_cache_spec.block_size for g in groups if not is_state_spec(g.kv_cache_spec)}
    if not attn:
        return "state groups only (no attention group)", None
    if len(attn) != 1:
        return f"block sizes differ between attention groups ({sorted(attn)})", None
    bs = next(iter(attn))
    sizes = {spec.block_size for _, spec in states}
    if modes <= {"all", "align"}:
        if sizes != {bs}:
            return (f"state block size {sorted(sizes)} is not the attention block size {bs} "
                    f"(mamba_cache_mode {sorted(modes)})"), None
    else:  # "none": one state block per request, max_model_len tokens
        if max_model_len is not None and any(s < max_model_len for s in sizes):
            return (f"state block size {sorted(sizes)} below max_model_len {max_model_len} "
                    "(mamba_cache_mode 'none' holds one state block per request)"), None
    want = math.lcm(bs, *sizes)
    if scheduler_block_size != want or hash_block_size != want:
        return (f"block sizes (scheduler {scheduler_block_size}, hash {hash_block_size}) are "
                f"not vLLM's for these groups ({want})"), None
    return None, bs


def skipped_tokens(mode: str, c: int) -> int:
    """vLLM's ``MambaManager.get_num_skipped_tokens`` in kvshare's page units: ``"all"`` keeps
    the page of the last computed token; ``"none"``'s single block never falls out."""
    return max(0, c - 1) if mode in ("all", "align") else 0


def vllm_table(table: list[int]) -> list[int]:
    """A ``"none"`` group's table as vLLM holds it: the state page alone (kvshare keeps it at
    the last non-null position of a table as long as the attention groups')."""
    for p in reversed(table):
        if p:
            return [p]
    return []


def align_blocks_to_allocate(held: int, hit, num_tokens: int, block_size: int,
                             evictable) -> int:
    """vLLM's ``MambaManager.get_num_blocks_to_allocate`` in "align" for one group: one new
    block when the table (``held`` blocks, or the ``hit`` of a request being admitted) must
    grow, whatever the tokens, plus the hit's evictable blocks (``evictable(hit)``)."""
    grow = -(-num_tokens // block_size) - len(hit) - held > 0
    return int(grow) + (evictable(hit) if hit else 0)


def align_release(table: list[int], k: int, unref) -> int:
    """The mirror of an "align" group's ``remove_skipped_blocks``: every page before position
    ``k`` (the last computed token's) is released, ``unref(page)`` for each (the pages above
    the first null by the base rule, the previous step's state page by
    ``last_state_block_idx``; at most those two are live).  Returns the pages released."""
    n = 0
    for i in range(k):
        if table[i]:
            unref(table[i])
            table[i] = 0
            n += 1
    return n
