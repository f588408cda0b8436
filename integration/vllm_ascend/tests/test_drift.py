"""Pins the vLLM versions whose KVCacheManager interface the adapter implements, and fails
with the difference named when the installed vLLM drifts from it."""

import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager

from kvshare_vllm import compat
from kvshare_vllm.manager import KvshareKVCacheManager


def test_installed_vllm_is_a_supported_version():
    assert vllm.__version__ in compat.MANAGER_VLLM_VERSIONS, (
        f"vLLM {vllm.__version__} is not among the versions the adapter was checked against "
        f"{compat.MANAGER_VLLM_VERSIONS}; drift: {compat.drift(KVCacheManager) or 'none'}")


def test_installed_kv_cache_manager_interface_matches_pinned():
    diffs = compat.drift(KVCacheManager)
    assert not diffs, ("vLLM's KVCacheManager interface drifted from what kvshare_vllm "
                       "implements:\n  " + "\n  ".join(diffs))


def test_adapter_implements_pinned_interface():
    # The adapter may have extras (check, kvshare_stats), but every pinned item exactly.
    have = compat.surface(KvshareKVCacheManager)
    missing = {k: v for k, v in compat.PINNED.items() if have.get(k) != v}
    assert not missing, f"KvshareKVCacheManager differs from the pinned surface: {missing}"


def test_drift_is_reported_by_name():
    class Drifted(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, something_new=0):
            pass

        def brand_new(self):
            pass

    diffs = compat.drift(Drifted)
    assert any("changed: allocate_slots" in d for d in diffs)
    assert any("new in installed vLLM: brand_new" in d for d in diffs)
