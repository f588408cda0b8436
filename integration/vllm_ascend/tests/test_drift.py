"""Pins the vLLM versions whose KVCacheManager interface the adapter implements, and fails
with the difference named when the installed vLLM drifts from the interface pinned for its
release (``compat.PINNED``: 0.23.0's and 0.32.0's)."""

import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager

from kvshare_vllm import compat
from kvshare_vllm.manager import KvshareKVCacheManager

RELEASE = vllm.__version__.split("+", 1)[0]


def test_installed_vllm_is_a_supported_version():
    assert RELEASE in compat.MANAGER_VLLM_VERSIONS, (
        f"vLLM {vllm.__version__} is not among the versions the adapter was checked against "
        f"{compat.MANAGER_VLLM_VERSIONS}; drift: {compat.drift(KVCacheManager) or 'none'}")
    assert compat.manager_api() == RELEASE


def test_installed_kv_cache_manager_interface_matches_pinned():
    diffs = compat.drift(KVCacheManager)
    assert not diffs, ("vLLM's KVCacheManager interface drifted from what kvshare_vllm "
                       "implements:\n  " + "\n  ".join(diffs))


def test_adapter_implements_pinned_interface():
    # The adapter may have extras (check, kvshare_stats, parameters with defaults after the
    # pinned ones), but takes every pinned item's parameters by name, in order.
    missing = compat.accepts(KvshareKVCacheManager, compat.PINNED[RELEASE])
    assert not missing, f"KvshareKVCacheManager differs from the pinned surface: {missing}"


def test_adapter_presents_the_running_release_constructor():
    """The constructor is the running release's exactly (the scheduler passes its arguments by
    name, and the names moved: ``max_num_batched_tokens`` -> ``max_in_flight_tokens``)."""
    have = compat.surface(KvshareKVCacheManager)
    for name in ("__init__", "remove_skipped_blocks", "get_computed_blocks"):
        assert have[name] == compat.PINNED[RELEASE][name], name


def test_accepts_names_what_is_missing():
    class Partial:
        def allocate_slots(self, request, num_new_tokens, extra):  # extra has no default
            pass

        def free(self, req):  # renamed parameter
            pass

        usage = 0.0  # not a property

    pinned = {"allocate_slots": ("self", "request", "num_new_tokens"),
              "free": ("self", "request"), "usage": "property", "take_events": ("self",)}
    assert set(compat.accepts(Partial, pinned)) == {"allocate_slots", "free", "usage",
                                                    "take_events"}


def test_manager_api_of_other_versions():
    assert compat.manager_api("0.23.0+cpu") == "0.23.0"
    assert compat.manager_api("0.32.0") == "0.32.0"
    assert compat.manager_api("0.34.0") == "0.32.0"
    assert compat.manager_api("0.27.1") == "0.23.0"
    assert compat.manager_api("0.20.0") == "0.23.0"


def test_drift_is_reported_by_name():
    class Drifted(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, something_new=0):
            pass

        def brand_new(self):
            pass

    diffs = compat.drift(Drifted)
    assert any("changed: allocate_slots" in d for d in diffs)
    assert any("new in installed vLLM: brand_new" in d for d in diffs)
