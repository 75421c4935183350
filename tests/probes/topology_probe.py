"""MPMD probe: runs the real start-up pieces (roles, communicators, pairing, handshake) and prints
one JSON line per rank. Usage: mpirun -np 2 python topology_probe.py host [--as-version V]
[--as-protocol P] [flags] : -np 2 ... dpu (--as-*: pretend another release is installed on that side)"""

import json
import sys

from mpi4py import MPI

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.faults.abort import collective_call
from dpuoffload.common.runtime import handshake as handshake_module
from dpuoffload.common.runtime.handshake import check_peers
from dpuoffload.common.runtime.roles import Role, build_topology

role = Role.HOST if sys.argv[1] == "host" else Role.DPU
argv = sys.argv[2:]
if argv[:1] == ["--as-version"]:  # act as another installed release: the real handshake must refuse it
    handshake_module.__version__, argv = argv[1], argv[2:]
if argv[:1] == ["--as-protocol"]:
    handshake_module.PROTOCOL_VERSION, argv = int(argv[1]), argv[2:]
topo = build_topology(role)
cfg = parse_run_config(argv)
try:
    collective_call(topo.world, lambda: check_peers(topo, cfg), topo.describe())
    handshake = "ok"
except Exception as e:  # the test asserts on the printed outcome
    handshake = type(e).__name__
side_sum = topo.side_comm.allreduce(topo.world_rank, op=MPI.SUM)
print(json.dumps({"world_rank": topo.world_rank, "role": topo.role.name, "side_rank": topo.side_rank,
                  "side_size": topo.side_comm.Get_size(), "side_sum": side_sum,
                  "host_comm": topo.host_comm is not None, "dpu_comm": topo.dpu_comm is not None,
                  "peers": list(topo.peers), "label": topo.describe(), "handshake": handshake}), flush=True)
