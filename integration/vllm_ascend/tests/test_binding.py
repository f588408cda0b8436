"""The kvshare Python binding: header parsing, ABI check, exceptions, buffers."""

from array import array

import numpy as np
import pytest

import kvshare
from kvshare import _header


def test_abi_and_version():
    assert kvshare.lib.kvs_abi_version() == kvshare.ABI_VERSION
    assert kvshare.VERSION.count(".") == 2


def test_python_preprocessing_matches_cc():
    cc = _header.strip_cc(kvshare.HEADER_PATH)
    if cc is None:
        pytest.skip("no C compiler")
    from cffi import FFI

    a, b = FFI(), FFI()
    a.cdef(cc)
    b.cdef(_header.cdef_text(kvshare.HEADER_PATH, use_cc=False))
    for t in ("kvs_config", "kvs_stats", "kvs_event", "kvs_seq_info", "kvs_copy",
              "kvs_extra_keys", "kvs_mm_item", "kvs_page_info", "kvs_pool_config", "kvs_pool_key",
              "kvs_pool_work", "kvs_pool_stats"):
        assert a.sizeof(t) == b.sizeof(t) == kvshare.ffi.sizeof(t)
        assert [f for f, _ in a.typeof(t).fields] == [f for f, _ in b.typeof(t).fields]


def test_every_status_has_an_exception_class():
    for name, value in kvshare.STATUS.items():
        if value == 0:
            continue
        cls = kvshare._STATUS_CLASSES[value]
        assert issubclass(cls, kvshare.KvsError) and cls.status_name == name


def test_errors_carry_the_library_message():
    c = kvshare.Cache(page_size=4, num_device_pages=8, reserve_null_page=True)
    with pytest.raises(kvshare.NoSpaceError) as e:
        c.pages_alloc(100)
    assert "100" in e.value.message and e.value.status == kvshare.STATUS["KVS_STATUS_NO_SPACE"]
    with pytest.raises(kvshare.InvalidConfigError):
        kvshare.Cache(page_size=0)
    c.seq_begin(1, [1, 2, 3])
    with pytest.raises(kvshare.SeqExistsError):
        c.seq_begin(1, [1])
    c.seq_free(1)
    with pytest.raises(kvshare.SeqNotFoundError):
        c.seq_free(1)


def test_buffers_and_prefix_sharing():
    c = kvshare.Cache(page_size=4, num_device_pages=32, reserve_null_page=True,
                      skip_cached_writes=False, enable_events=True)
    prompt = np.arange(10, 30, dtype=np.int32)
    info = c.seq_begin(1, prompt, max_match_tokens=len(prompt) - 1)
    assert info["num_pages"] == 5 and info["matched_tokens"] == 0
    pages = c.seq_pages(1)
    assert 0 not in pages  # the null page is never handed out
    hit, n = c.prefix_match(array("i", prompt.tolist()), max_tokens=len(prompt) - 1)
    assert n == 16 and list(hit) == list(pages[:4])
    with pytest.raises(TypeError):
        c.prefix_match(np.arange(4, dtype=np.int64))
    c.seq_append(1, np.array([7], dtype=np.int32))
    ev = c.take_events()
    assert [e["kind"] for e in ev] == [0] * 5
    c.seq_free(1)
    c.check()
    st = c.stats()
    assert st["device_pages_in_use"] == 0 and st["index_pages"] == 5


def test_only_computed_pages_become_hits():
    # A prompt given whole and computed a chunk per step: a commit indexes the computed pages only.
    c = kvshare.Cache(page_size=4, num_device_pages=32, defer_commit=True)
    prompt = array("i", range(100, 112))
    c.seq_begin(1, prompt)
    c.seq_set_computed(1, 5)
    c.commit()
    assert c.prefix_match(prompt)[1] == 4
    c.seq_set_computed(1, 12)
    c.commit()
    assert c.prefix_match(prompt)[1] == 12
    with pytest.raises(kvshare.InvalidArgumentError, match="num_computed_tokens"):
        c.seq_set_computed(1, 13)
    with pytest.raises(kvshare.SeqNotFoundError):
        c.seq_set_computed(2, 0)
    c.seq_free(1)
    c.check()


def test_extra_keys_isolate():
    c = kvshare.Cache(page_size=4, num_device_pages=32, reserve_null_page=True)
    c.seq_begin(1, list(range(12)), kvshare.ExtraKeys(salt=b"a"))
    c.seq_free(1)
    assert c.prefix_match(list(range(12)), kvshare.ExtraKeys(salt=b"b"))[1] == 0
    assert c.prefix_match(list(range(12)), kvshare.ExtraKeys(salt=b"a"))[1] == 12


def test_close_frees_once_and_is_idempotent():
    """close() frees the cache now (not at garbage collection), once; a second close is a no-op."""
    c = kvshare.Cache(page_size=4, num_device_pages=8)
    c.close()
    assert c.handle is None
    c.close()
