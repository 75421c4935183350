"""The allocator tuning (common/runtime/malloc.py): applied on glibc, respectful of a user's own choice."""

import sys

import pytest

from dpuoffload.common.runtime.malloc import tune_malloc, user_tunes_malloc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_applied_by_default_on_linux():
    assert tune_malloc({}) is True


@pytest.mark.parametrize("environ", [{"DPUOFFLOAD_MALLOC": "0"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                     {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                     {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}])
def test_left_alone_when_opted_out_or_the_user_tunes_malloc(environ):
    assert tune_malloc(environ) is False


def test_unrelated_tunables_do_not_count_as_tuning_malloc():
    assert not user_tunes_malloc({"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "LD_PRELOAD": "libfoo.so"})
