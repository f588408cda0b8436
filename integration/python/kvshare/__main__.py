"""``python -m kvshare``: the binding's smoke test, for an installed package.

Prints where the library and the header were found and their versions, then checks that a
prompt's second arrival shares the pages its first arrival left cached.  Exit status 0 when it
does, 1 otherwise.
"""

from __future__ import annotations

import sys

import kvshare


def main() -> int:
    print(f"kvshare {kvshare.VERSION} (ABI {kvshare.ABI_VERSION})")
    print(f"  library: {kvshare.LIB_PATH}")
    print(f"  header:  {kvshare.HEADER_PATH}")
    prompt = list(range(1, 10))
    cache = kvshare.Cache(page_size=4, num_device_pages=64)
    try:
        cache.seq_begin(1, prompt, max_match_tokens=len(prompt) - 1)
        cache.seq_free(1)
        info = cache.seq_begin(2, prompt, max_match_tokens=len(prompt) - 1)
        cache.check()
    finally:
        cache.close()
    matched = info["matched_tokens"]
    ok = matched == len(prompt) - 1
    print(f"  second arrival of a {len(prompt)}-token prompt: {matched} tokens found cached: "
          f"{'ok' if ok else 'FAILED (expected %d)' % (len(prompt) - 1)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
