"""A tiny MPMD rank for launcher tests (not a test module): prints its app context and cores.

    python mpmd_toy.py [ROLE] [--kill WORLD_RANK] [--exit WORLD_RANK:CODE] [--abort WORLD_RANK]
                       [--sleep SECONDS] [--busy SECONDS]

After a barrier, the chosen world rank SIGKILLs itself (--kill), leaves without MPI_Finalize
(--exit, os._exit) or calls MPI_Abort(7) (--abort); the others sleep, and mpirun should kill
them. --busy spins and prints the CPU share (to check --dpu-speed throttling).
"""

import argparse
import os
import signal
import time

from mpi4py import MPI


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", nargs="?", help="label to print (default: from MPI.APPNUM)")
    p.add_argument("--kill", type=int)
    p.add_argument("--exit", default=None)
    p.add_argument("--abort", type=int)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--busy", type=float, default=0.0, help="spin this long, print the CPU share")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    appnum = world.Get_attr(MPI.APPNUM)
    role = args.role or ("host" if appnum == 0 else "dpu")
    print(f"toy world_rank={rank} size={world.Get_size()} appnum={appnum} "
          f"role={role} cores={sorted(os.sched_getaffinity(0))} "
          f"threads={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    world.Barrier()
    if args.kill == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if args.exit and int(args.exit.split(":")[0]) == rank:
        os._exit(int(args.exit.split(":")[1]))
    if args.abort == rank:
        world.Abort(7)
    if args.busy:
        start, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - start < args.busy:
            pass
        share = (time.process_time() - cpu) / (time.perf_counter() - start)
        print(f"toy world_rank={rank} cpu_share={share:.3f}", flush=True)
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()
