"""The test suite: `unit/` (one process), `jobs/` (real processes), `cluster/` (root set-ups); shared helpers
here (mpijobs.py, the factories, api_scripts/, probes/). docs/testing.md, "Three tiers"."""
