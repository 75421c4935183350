"""A Horovod script that keeps its plain `hvd.init()` (imported before `dpu.init()`, as usual)."""

import horovod.torch as hvd

import dpuoffload as dpu

if __name__ == "__main__":
    job = dpu.init()
    hvd.init()  # under dpurun this means the host ranks, not COMM_WORLD (which also holds the DPU ranks)
    print(f"host rank {job.rank}: hvd rank {hvd.rank()} of {hvd.size()}", flush=True)
    hvd.shutdown()
    job.finish()
