"""--mode auto (profile, predict, choose, run, report) and `dpurun project`, as real MPMD jobs.

(The tests of this feature that start processes: tests/jobs/test_auto.py.)
"""

import json

import pytest


def test_project_link_terms_are_fitted_and_a_file_without_them_is_refused(tmp_path):
    from dpuoffload.common.errors import ConfigError
    from dpuoffload.launch.project import fit_link, load_link

    link = fit_link([1e5, 1e6, 1e7], [2e-6 + n / 3e9 for n in (1e5, 1e6, 1e7)], "synthetic")
    assert link.bandwidth_Bps == pytest.approx(3e9) and link.latency_s == pytest.approx(2e-6)
    one_box = tmp_path / "transport.json"
    one_box.write_text(json.dumps({"results": [{"message_bytes": 1, "raw_GBps": 1.0}]}))  # (no --tcp column)
    with pytest.raises(ConfigError, match="no raw MPI times over TCP at 2 sizes or more in it; pass the "
                                          "transport.json that `python benchmarks/transport.py --tcp` writes"):
        load_link(str(one_box))
