"""Tests that start real processes: mpirun and dpurun jobs, benchmarks, Python subprocesses, worker pools."""
