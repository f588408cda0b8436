"""Lockstep cases run with vllm-ascend 0.23.0's KV-cache patches applied to vLLM (collected only
through ``test_ascend_coexist.py``, in a subprocess: the patches rebind vLLM process-wide).

``KVSHARE_ASCEND_SOURCES`` names a folder holding, from vllm-ascend 0.23.0's wheel, exactly the
files that define its hybrid KV-cache behaviour and import nothing of torch_npu:
``core/single_type_kv_cache_manager.py``, ``patch/platform/patch_async_swa_kv_lifetime.py`` and
``patch/platform/patch_kv_cache_coordinator.py``.  They are imported as vllm-ascend's platform
plugin imports them (async SWA lifetime first, the coordinator patch last), under bare package
modules (the packages' ``__init__`` files need an NPU).  ``core/kv_cache_interface.py`` needs
the NPU's device type at import: its ``AscendMLAAttentionSpec`` (DeepSeek V4's compressed MLA,
read by vllm-ascend's manager factory through ``isinstance`` only) is a class of its own here,
which no configuration below uses.  vLLM's reference side then runs
``AscendHybridKVCacheCoordinator`` and vllm-ascend's patched ``allocate_slots`` /
``remove_skipped_blocks`` / ``Scheduler.__init__``; kvshare's side runs the plugin."""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest

SOURCES = os.environ.get("KVSHARE_ASCEND_SOURCES")
if not SOURCES:  # pragma: no cover - only run through test_ascend_coexist.py
    pytest.skip("KVSHARE_ASCEND_SOURCES is not set", allow_module_level=True)

for pkg in ("vllm_ascend", "vllm_ascend.core", "vllm_ascend.patch",
            "vllm_ascend.patch.platform"):
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.join(SOURCES, *pkg.split("."))]
    sys.modules[pkg] = mod
_iface = types.ModuleType("vllm_ascend.core.kv_cache_interface")
_iface.AscendMLAAttentionSpec = type("AscendMLAAttentionSpec", (), {})
sys.modules[_iface.__name__] = _iface
importlib.import_module("vllm_ascend.core.single_type_kv_cache_manager")
importlib.import_module("vllm_ascend.patch.platform.patch_async_swa_kv_lifetime")
importlib.import_module("vllm_ascend.patch.platform.patch_kv_cache_coordinator")

import harness as h  # noqa: E402
from test_hybrid_compare import CASES, run_case  # noqa: E402


@pytest.mark.parametrize("name", ["gpt-oss-w32", "gemma3-w64", "llama4-c64",
                                  "gpt-oss-w32-chunked", "gpt-oss-w32-preempt"])
def test_lockstep_against_ascend_coordinator(tiny_model_dir, name):
    pair = run_case(tiny_model_dir, name)
    coord = type(pair.ref.kv_cache_manager.coordinator).__name__
    assert coord == "AscendHybridKVCacheCoordinator"
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert pair.hits[0] == pair.hits[1] and pair.peak_blocks[0] == pair.peak_blocks[1]
    if CASES[name][0] != "mla":
        assert pair.nulls > 0


def test_in_flight_tokens_keep_their_window(tiny_model_dir):
    """vllm-ascend's async-SWA patch: inside ``allocate_slots`` a windowed group releases only
    what is out of the window of tokens no longer in flight (``num_in_flight_tokens``, which
    its Request / Scheduler patches maintain).  Both managers driven directly, in-flight
    tokens set by hand: the same null positions and blocks in use after every call."""
    seen = []
    for kvshare, in_flight in ((False, True), (True, True), (False, False)):
        s = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=200,
                             specs=h.layer_specs("gpt-oss", size=32))
        m = s.kv_cache_manager
        r = h.make_request("a", list(range(100, 164)), hash_blocks=not kvshare)
        assert r.num_in_flight_tokens == 0  # vllm-ascend's Request.__init__ patch
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 64 - hit, hit, blocks)
        r.num_computed_tokens = 64
        trail = []
        for step in range(60):
            r.append_output_token_ids(7 + step)
            # up to 3 pages' worth of tokens still in flight
            r.num_in_flight_tokens = (step % 4) * 16 if in_flight else 0
            m.allocate_slots(r, 1)
            r.num_computed_tokens += 1
            ids = m.get_block_ids("a")
            trail.append(([[b == 0 for b in g] for g in ids], round(m.usage, 6)))
        if kvshare:
            m.check()
        seen.append(trail)
    assert seen[0] == seen[1]
    assert seen[0] != seen[2], "in-flight tokens must change what is released"
