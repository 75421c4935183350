"""`dpurun`: the MPMD launcher that starts host and DPU programs as one mpirun job.

Modules: `placement` (where ranks run, pure), `command` (the mpirun argv, pure), `throttle` (CPU
cgroup for slow emulated DPUs), `supervise` (run, stream, report dead ranks), `cli` (flags).
"""
