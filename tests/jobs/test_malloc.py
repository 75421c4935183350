"""The allocator tuning (common/runtime/malloc.py): applied on glibc, respectful of a user's own choice;
start-up's objects frozen out of the garbage collector's full passes.

(Here the tests that start processes; those that run in one process: tests/unit/test_malloc.py.)
"""

import sys

import pytest

from dpuoffload.common.runtime.malloc import tune_malloc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_applied_by_default_on_linux():
    assert tune_malloc({}) is True
