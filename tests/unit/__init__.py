"""Tests that start no process (no mpirun, dpurun, subprocess or worker process): `bash scripts/test.sh --unit`."""
