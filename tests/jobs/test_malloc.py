"""The allocator tuning (common/runtime/malloc.py): applied on glibc, respectful of a user's own choice;
start-up's objects frozen out of the garbage collector's full passes.

(Here the tests that start processes; those that run in one process: tests/unit/test_malloc.py.)
"""

import gc
import os
import sys

import pytest

from dpuoffload.common.runtime.malloc import pause_collector, tune_malloc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_applied_by_default_on_linux():
    assert tune_malloc({}) is True


def test_a_process_forked_while_the_collector_is_paused_has_it_on():
    """A data loader's worker forked during start-up never reaches the freeze that turns the collector
    back on, so it must not inherit the pause."""
    try:
        pause_collector({})
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, b"1" if gc.isenabled() else b"0")
            os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)
    finally:
        gc.enable()
