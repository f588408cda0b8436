"""The version of the Python packages: the ``[workspace.package]`` version of the repository's
Cargo.toml (every crate of the workspace inherits it), read by ``python/setup.py`` and
``vllm_ascend/setup.py`` (one definition, so the wheels and the library never disagree)."""

import os
import re

MANIFEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "Cargo.toml")


def cargo_version(manifest: str = MANIFEST) -> str:
    try:
        with open(manifest, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"kvshare: {manifest} not found ({e}): build the Python packages from "
                         "the repository checkout (pip install ./integration/python)") from None
    package = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    version = package and re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), re.M)
    if not version:
        raise SystemExit(f"kvshare: no [workspace.package] version in {manifest}")
    return version.group(1)
