"""The version of the Python packages: the ``[workspace.package]`` version of the repository's
Cargo.toml (every crate of the workspace inherits it, and so do the header's version macros,
``kvs_version()``, pkg-config and CMake), read by ``python/setup.py`` and ``vllm_ascend/setup.py``
(one definition, so the wheels and the library never disagree); and the ``build`` command both
use.

A source distribution carries this file at its root: the binding's sdist also carries the Rust
workspace (``rust/Cargo.toml``), the plugin's sdist only its ``PKG-INFO``, whose version
``python -m build`` wrote from Cargo.toml when it made the sdist.
"""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(REPO, "Cargo.toml")


def workspace_package(manifest: str) -> str:
    """The text of the ``[workspace.package]`` table of ``manifest``."""
    try:
        with open(manifest, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"kvshare: {manifest} not found ({e}): build the Python packages from "
                         "the repository checkout (pip install ./integration/python "
                         "./integration/vllm_ascend) or from their source distributions") from None
    package = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not package:
        raise SystemExit(f"kvshare: no [workspace.package] table in {manifest}")
    return package.group(1)


def cargo_field(manifest: str, name: str) -> str | None:
    """A string field of ``[workspace.package]`` (``version``, ``repository``, ...), or None."""
    found = re.search(rf'^{re.escape(name)}\s*=\s*"([^"]+)"', workspace_package(manifest), re.M)
    return found.group(1) if found else None


def cargo_version(manifest: str = MANIFEST) -> str:
    version = cargo_field(manifest, "version")
    if not version:
        raise SystemExit(f"kvshare: no [workspace.package] version in {manifest}")
    return version


def package_version(package_dir: str, manifest: str | None) -> str:
    """The version of the package whose ``setup.py`` is in ``package_dir``: ``manifest``'s
    (a checkout, or the binding's sdist), else the ``PKG-INFO`` of the sdist being built."""
    if manifest is not None and os.path.isfile(manifest):
        return cargo_version(manifest)
    pkg_info = os.path.join(package_dir, "PKG-INFO")
    if os.path.isfile(pkg_info):
        with open(pkg_info, encoding="utf-8") as f:
            found = re.search(r"^Version:\s*(\S+)\s*$", f.read(), re.M)
        if found:
            return found.group(1)
    raise SystemExit(f"kvshare: {package_dir} is neither in the repository checkout (no "
                     f"{MANIFEST}) nor an unpacked source distribution (no PKG-INFO)")


def project_urls(manifest: str | None) -> dict:
    """The addresses ``[workspace.package]`` gives (repository, homepage, documentation), as
    the packages' Project-URLs; none when it gives none, or outside a checkout."""
    if manifest is None or not os.path.isfile(manifest):
        return {}
    labels = {"repository": "Source", "homepage": "Homepage", "documentation": "Documentation"}
    urls = {label: cargo_field(manifest, field) for field, label in labels.items()}
    return {label: url for label, url in urls.items() if url}


def release_series(version: str) -> str:
    """The requirement that accepts exactly the releases of ``version``'s C ABI: before 1.0 the
    minor version is the ABI version (``~=0.4.0``: 0.4.x), after it the major (``~=1.2``: 1.x)."""
    major, minor, patch = (version.split("+")[0].split("-")[0].split(".") + ["0", "0"])[:3]
    return f"~={major}.{minor}.{patch}" if major == "0" else f"~={major}.{minor}"


if __name__ == "__main__":
    print(cargo_version())


def fresh_build():
    """setuptools' ``build`` command, emptying its ``build/lib*`` folder first: a wheel built in
    a checkout that built an earlier version would otherwise also carry the modules that version
    had and this one removed (setuptools copies the whole folder into the wheel)."""
    import shutil

    from setuptools.command.build import build

    class FreshBuild(build):
        def run(self):
            if os.path.isdir(self.build_lib):
                shutil.rmtree(self.build_lib)
            super().run()

    return FreshBuild
