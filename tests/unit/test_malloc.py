"""The allocator tuning (common/runtime/malloc.py): applied on glibc, respectful of a user's own choice;
start-up's objects frozen out of the garbage collector's full passes.

(The tests of this feature that start processes: tests/jobs/test_malloc.py.)
"""

import gc

import pytest

from dpuoffload.common.runtime.malloc import freeze_startup_objects, pause_collector, tune_malloc, user_tunes_malloc


@pytest.mark.parametrize("environ", [{"DPUOFFLOAD_MALLOC": "0"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                     {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                     {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}])
def test_left_alone_when_opted_out_or_the_user_tunes_malloc(environ):
    assert tune_malloc(environ) is False


def test_unrelated_tunables_do_not_count_as_tuning_malloc():
    assert not user_tunes_malloc({"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "LD_PRELOAD": "libfoo.so"})


def test_start_up_objects_are_frozen_out_of_full_collections():
    """Frozen, start-up's objects are in the permanent generation, which no collection walks (the
    oldest generation, which a full collection walks, no longer holds them) and they stay alive;
    opted out, nothing is frozen."""
    gc.unfreeze()
    marker = [["start-up object"]]
    gc.collect()  # (now in the oldest generation)
    assert any(o is marker[0] for o in gc.get_objects(generation=2))
    assert freeze_startup_objects({"DPUOFFLOAD_GC_FREEZE": "0"}) is False and gc.get_freeze_count() == 0
    try:
        assert freeze_startup_objects({}) is True and gc.get_freeze_count() > 0
        assert not any(o is marker[0] for o in gc.get_objects(generation=2))
        gc.collect()
        assert marker[0] == ["start-up object"]
    finally:
        gc.unfreeze()


def test_the_collector_is_off_from_a_programs_entry_until_start_ups_objects_are_frozen():
    """The entry turns the collector off (start-up's imports make objects that live for good); the
    freeze at the end of start-up turns it back on; opted out, it is never turned off."""
    try:
        assert pause_collector({"DPUOFFLOAD_GC_FREEZE": "0"}) is False and gc.isenabled()
        assert pause_collector({}) is True and not gc.isenabled()
        assert freeze_startup_objects({}) is True and gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
        gc.unfreeze()
