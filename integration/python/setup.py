"""Bundles the generated header and the built library into the wheel (build_py hook), so an
installed ``kvshare`` finds both next to the package.  The library comes from ``$KVSHARE_LIB``
or the repository's ``target/release`` (run ``cargo build --release`` first)."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "kvshare")
        header = os.path.join(REPO, "include", "kvshare.h")
        lib = os.environ.get("KVSHARE_LIB") or os.path.join(REPO, "target", "release",
                                                             "libkvshare.so")
        for src in (header, lib):
            if os.path.isfile(src):
                shutil.copy2(src, os.path.join(dest, os.path.basename(src)))
            else:
                print(f"kvshare: {src} not found; the installed package will need "
                      "KVSHARE_HEADER / KVSHARE_LIB")


setup(cmdclass={"build_py": BuildPyWithLibrary})
