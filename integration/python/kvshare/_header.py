"""Turns ``include/kvshare.h`` into text cffi's ``cdef()`` accepts.

cffi does no preprocessing, and the generated header uses ``#if`` blocks (C23 enum bases,
``extern "C"``), ``#include`` and ``#define``.  We run a C preprocessor (``cc -E -P``) when
one is installed, and otherwise evaluate the header's few conditionals in Python, for a C11
compiler that is not C++.  Either way the declarations come from the header itself: nothing is
copied by hand.  Integer ``#define``s are returned separately (``KVS_ABI_VERSION``, ...).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+(.+?)\s*$")


def int_macros(text: str) -> dict[str, int]:
    """Integer-valued object-like macros of the header (``KVS_ABI_VERSION`` etc.)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _DEFINE.match(line)
        if not m:
            continue
        expr = m.group(2)
        if not re.fullmatch(r"[0-9()<>\s+*-]+", expr):
            continue
        try:
            out[m.group(1)] = int(eval(expr, {"__builtins__": {}}, {}))  # digits/shifts only
        except Exception:  # noqa: BLE001 - not an integer expression
            pass
    return out


def _eval_cond(cond: str) -> bool:
    """The header's conditions: __cplusplus (undefined), __STDC_VERSION__ (C11), guards."""
    c = cond.strip()
    c = re.sub(r"defined\s*\(\s*__cplusplus\s*\)", "0", c)
    c = re.sub(r"\b__cplusplus\b", "0", c)
    c = re.sub(r"\b__STDC_VERSION__\b", "201112", c)
    c = re.sub(r"(\d+)L\b", r"\1", c)
    c = c.replace("||", " or ").replace("&&", " and ").replace("!", " not ")
    if not re.fullmatch(r"[0-9\s()<>=orandt]+", c):
        raise ValueError(f"kvshare.h: cannot evaluate '#if {cond}' without a C preprocessor")
    return bool(eval(c, {"__builtins__": {}}, {}))


def strip_python(text: str) -> str:
    """Evaluates ``#if/#ifdef/#ifndef/#else/#endif``, drops other directives and comments."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch active, some branch taken)
    active = True
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            word = d.split(None, 1)[0] if d else ""
            rest = d[len(word):].split("//")[0].strip()
            if word in ("if", "ifdef", "ifndef"):
                if word == "if":
                    val = _eval_cond(rest)
                elif word == "ifdef":
                    val = False if rest == "__cplusplus" else rest in ("KVS_H",)
                else:  # ifndef: include guard is not yet defined, __cplusplus never is
                    val = True
                stack.append((active, val))
                active = active and val
            elif word == "else":
                parent, taken = stack[-1]
                active = parent and not taken
                stack[-1] = (parent, True)
            elif word == "endif":
                active = stack.pop()[0]
            continue
        if active:
            out.append(line)
    if stack:
        raise ValueError("kvshare.h: unbalanced #if")
    body = "\n".join(out)
    return re.sub(r"/\*.*?\*/", "", body, flags=re.S)


def strip_cc(path: str) -> str | None:
    """``cc -E -P -std=c11`` output (None when no compiler is installed)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    try:
        res = subprocess.run(
            [cc, "-E", "-P", "-std=c11", "-nostdinc", "-D__KVS_CFFI__", "-x", "c", "-"],
            input=_without_includes(path),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout


def _without_includes(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return "".join(l for l in f if not re.match(r"\s*#\s*include\b", l))


def cdef_text(path: str, use_cc: bool | None = None) -> str:
    """The declarations of the header, ready for ``ffi.cdef``.

    ``#include`` lines are dropped (cffi knows ``bool``, ``size_t`` and ``<stdint.h>`` types);
    then ``cc -E -P`` is used when available (``use_cc=None``), else the Python evaluator.
    """
    if use_cc is not False:
        txt = strip_cc(path)
        if txt is not None:
            return txt
        if use_cc:
            raise RuntimeError("no C compiler found for cc -E -P")
    return strip_python(_without_includes(path))
