#!/usr/bin/env python3
"""A userspace delay line: an Ethernet switch over TAP devices that holds every frame for the
one-way delay of its path, so the emulated machines of scripts/nodes.sh get link latency on a
kernel without tc's netem (this box's kernel has tbf, htb and TUN/TAP, but no sch_netem).

    python3 scripts/delayline.py --link 200us --network 2ms --netns-prefix dpuo h0 h1 d0 d1
    python3 scripts/delayline.py --plan --link 200us --network 2ms h0 h1 d0 d1   # the delays; makes nothing

For each machine it opens a TAP device, moves it into the machine's network namespace (PREFIX-NAME,
which must exist) as eth0, and forwards frames between them as a learning switch does (learn each
source MAC's port, flood broadcast and unknown destinations), each frame due at its arrival plus
the delay of its (source, destination) pair: `--link` between the machines of one node (a host and
its DPU: h0 and d0, whose names are equal without their leading letters), `--network` between
machines of different nodes. It prints `delayline: ready ...` once every eth0 is in place; nodes.sh
then addresses and shapes them, and ends it with SIGTERM: the TAPs go away with its file descriptors.

Python's cost is per frame, so the TAPs get the largest MTU the kernel takes (65521 on Linux 6.x):
TCP then moves ~64 KB per frame. Stdlib only, so any python3 runs it (nodes.sh works before the venv
exists). Single-threaded: one select loop, whose timeout (microseconds, unlike epoll's milliseconds)
is the next frame's due time.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import os
import re
import select
import signal
import string
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}  # tc's spellings, so the knob reads as netem's `delay` did
MAX_DELAY_S = 10.0
MTUS = (65521, 65000, 9000, 1500)  # largest first; a TAP takes at most 65521 on Linux 6.x
READ_BATCH = 64  # frames read from one port per loop turn: one busy port cannot hold up due frames long
TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
PR_SET_TIMERSLACK = 29
IFNAMSIZ = 16


class DelayLineError(RuntimeError):
    """The delay line cannot be set up or lost a port; the message says what and what to do.
    (Not the project's ConfigError: this script imports nothing outside the stdlib.)"""


def parse_delay(text: str, what: str = "delay") -> float:
    """Seconds in a delay written as tc writes it: "200us", "2ms", "1.5ms", "0.01s" or "0".

    Args:
        text: the delay as the user wrote it.
        what: the knob it came from, for the error message (e.g. "DPUOFFLOAD_NETNS_DELAY").

    Raises:
        ValueError: not a number with one of the units us, ms or s, or over 10 s; says what to write.
    """
    spelled = text.strip()
    if spelled == "0":
        return 0.0
    found = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(us|ms|s)", spelled)
    if found is None:
        raise ValueError(f"{what}={text!r} is not a delay: write a number and a unit (us, ms or s), "
                         "e.g. 200us, 2ms or 1.5ms")
    seconds = float(found[1]) * UNITS[found[2]]
    if seconds > MAX_DELAY_S:
        raise ValueError(f"{what}={text!r} is over {MAX_DELAY_S:g} s, longer than any network's one-way delay "
                         "(and every frame would be held that long in memory); write e.g. 2ms")
    return seconds


def node_of(machine: str) -> str:
    """The node a machine belongs to: its name without the leading letters (h0 and d0 -> "0", h and
    d -> ""), the naming scripts/nodes.sh and dpurun's --hosts/--dpus use for a host and its DPU."""
    return machine.lstrip(string.ascii_letters)


@dataclass(frozen=True)
class Plan:
    """Which machine gets which port and each path's delay: frames from `machines[i]` to
    `machines[j]` are held `delays[i][j]` seconds."""

    machines: tuple[str, ...]
    delays: tuple[tuple[float, ...], ...]
    link_s: float
    network_s: float


def plan_delays(machines: Sequence[str], link_s: float, network_s: float) -> Plan:
    """The one-way delay of every pair: `link_s` within a node, `network_s` across nodes.

    Raises:
        ValueError: fewer than 2 machines, a name twice, or a negative delay.
    """
    if len(machines) < 2:
        raise ValueError(f"name at least 2 machines to join (got {list(machines)}), e.g. h0 d0")
    twice = sorted({m for m in machines if list(machines).count(m) > 1})
    if twice:
        raise ValueError(f"machine {', '.join(twice)} named twice; name each machine once")
    if link_s < 0 or network_s < 0:
        raise ValueError("a delay cannot be negative")
    delays = tuple(tuple(0.0 if a == b else link_s if node_of(a) == node_of(b) else network_s for b in machines)
                   for a in machines)
    return Plan(tuple(machines), delays, link_s, network_s)


def describe(plan: Plan) -> str:
    """One line per pair of machines: its delay and why (same node: link; else network)."""
    lines = []
    for i, a in enumerate(plan.machines):
        for j, b in enumerate(plan.machines[i + 1:], i + 1):
            kind = "link (same node)" if node_of(a) == node_of(b) else "network (other node)"
            lines.append(f"{a} <-> {b}: {plan.delays[i][j] * 1e6:g} us one way, {kind}")
    return "\n".join(lines)


class Switch:
    """A learning switch's forwarding decision, without I/O: the ports a frame goes to."""

    def __init__(self, ports: int) -> None:
        self.ports = ports
        self.port_of: dict[bytes, int] = {}  # source MAC -> the port it was last seen on
        self.flood = [[p for p in range(ports) if p != src] for src in range(ports)]

    def destinations(self, src: int, frame: bytes) -> list[int]:
        """Learns the frame's source MAC on `src`; returns its destination's port if known (none if
        that is `src` itself), else every other port (broadcast, multicast, or not yet learnt)."""
        if len(frame) < 14:  # not even an Ethernet header: nothing to forward
            return []
        dst_mac, src_mac = frame[0:6], frame[6:12]
        if not src_mac[0] & 1:  # (a multicast source address is bogus: not learnt)
            self.port_of[src_mac] = src
        port = None if dst_mac[0] & 1 else self.port_of.get(dst_mac)
        if port is None:
            return self.flood[src]
        return [] if port == src else [port]


class DelayQueue:
    """Frames held until due, one FIFO per delay value. Frames arrive in time order and each FIFO
    adds one constant, so every FIFO is sorted by due time (no heap needed) and the frames of one
    path leave in the order they came; the next frame due is the earliest of a few FIFO heads. Past
    `limit_bytes` held, new frames are dropped, as a switch's full buffer drops them."""

    def __init__(self, limit_bytes: int) -> None:
        self.fifos: dict[float, collections.deque[tuple[float, int, bytes]]] = {}
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.dropped = 0

    def push(self, now: float, delay: float, port: int, frame: bytes) -> bool:
        """Holds `frame` for `port` until `now + delay`; False (dropped) when the buffer is full."""
        if self.held_bytes + len(frame) > self.limit_bytes:
            self.dropped += 1
            return False
        self.fifos.setdefault(delay, collections.deque()).append((now + delay, port, frame))
        self.held_bytes += len(frame)
        return True

    def next_due(self) -> Optional[float]:
        """When the earliest held frame is due (None: nothing held)."""
        heads = [fifo[0][0] for fifo in self.fifos.values() if fifo]
        return min(heads) if heads else None

    def pop_due(self, now: float) -> Iterator[tuple[int, bytes]]:
        """(port, frame) of every frame due by `now`, earliest first."""
        while True:
            fifo = min((f for f in self.fifos.values() if f), key=lambda f: f[0][0], default=None)
            if fifo is None or fifo[0][0] > now:
                return
            _, port, frame = fifo.popleft()
            self.held_bytes -= len(frame)
            yield port, frame


def open_tap(name: str) -> int:
    """A new, non-persistent TAP device `name` (Ethernet frames, no packet-info header) and its
    non-blocking file descriptor: the device lives as long as the descriptor.

    Raises:
        DelayLineError: no TUN/TAP driver, not root, or the name taken.
    """
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise DelayLineError(f"cannot open /dev/net/tun ({e.strerror}): the delay line needs the kernel's TUN/TAP "
                             "driver (modprobe tun) and root") from None
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        raise DelayLineError(f"cannot create TAP device {name} ({e.strerror}); if a device of that name "
                             "exists, take it down (ip link del) or use another DPUOFFLOAD_NETNS_PREFIX") from None
    return fd


def _ip(*args: str, fix: str = "") -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise DelayLineError(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}{'; ' + fix if fix else ''}")
    return res


def place_tap(tap: str, netns: str) -> int:
    """Gives TAP device `tap` the largest MTU it takes, moves it into network namespace `netns` and
    names it eth0 there (its descriptor stays valid across the move); returns the MTU.

    Raises:
        DelayLineError: no such namespace, or eth0 taken in it.
    """
    mtu = next((m for m in MTUS if subprocess.run(["ip", "link", "set", tap, "mtu", str(m)],
                                                  capture_output=True).returncode == 0), 1500)
    _ip("link", "set", tap, "netns", netns, fix=f"create namespace {netns} first (scripts/nodes.sh up does)")
    _ip("-n", netns, "link", "set", tap, "name", "eth0", fix=f"namespace {netns} has an eth0 already")
    return mtu


def _set_timer_slack_ns(ns: int) -> None:
    """Asks the kernel to wake this process within `ns` of a timeout (default slack: 50 us, too
    coarse for a 200 us delay). Best effort: without it, frames are only later."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class DelayLine:
    """The forwarding loop over the TAPs' descriptors, port i being `plan.machines[i]`."""

    def __init__(self, fds: Sequence[int], plan: Plan, mtu: int, limit_bytes: int) -> None:
        self.fds = list(fds)
        self.plan = plan
        self.port_of_fd = {fd: i for i, fd in enumerate(self.fds)}
        self.frame_max = mtu + 18  # + Ethernet header and a VLAN tag
        self.switch = Switch(len(self.fds))
        self.queue = DelayQueue(limit_bytes)
        self.frames = 0
        self.bytes = 0
        self.lost = 0  # frames a destination's TAP would not take

    def serve(self, stop_fd: int) -> None:
        """Forwards frames until `stop_fd` is readable (a signal arrived: see `_stop_on_signals`).

        Raises:
            DelayLineError: a machine's eth0 went away (its namespace deleted before this stopped).
        """
        readers = [*self.fds, stop_fd]
        while True:
            due = self.queue.next_due()
            timeout = None if due is None else max(0.0, due - time.monotonic())
            ready = select.select(readers, [], [], timeout)[0]
            if stop_fd in ready:
                return
            now = time.monotonic()
            for fd in ready:
                self._take(fd, now)
            for port, frame in self.queue.pop_due(time.monotonic()):
                self._put(port, frame)

    def _take(self, fd: int, now: float) -> None:
        """Reads the frames waiting on one port and sends or holds each for its destinations."""
        src = self.port_of_fd[fd]
        delays = self.plan.delays[src]
        for _ in range(READ_BATCH):
            try:
                frame = os.read(fd, self.frame_max)
            except BlockingIOError:
                return
            except OSError as e:
                raise DelayLineError(f"machine {self.plan.machines[src]}'s eth0 is gone ({e.strerror}); was its "
                                     "namespace deleted before the delay line stopped? (nodes.sh down stops it "
                                     "first)") from None
            self.frames += 1
            self.bytes += len(frame)
            for dst in self.switch.destinations(src, frame):
                if delays[dst] == 0.0:
                    self._put(dst, frame)
                else:
                    self.queue.push(now, delays[dst], dst, frame)

    def _put(self, port: int, frame: bytes) -> None:
        try:
            os.write(self.fds[port], frame)
        except OSError as e:  # a full or closing destination: the frame is lost, as on a wire; TCP resends
            if e.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.EIO, errno.EBADFD, errno.EINVAL):
                raise
            self.lost += 1


def _stop_on_signals() -> int:
    """A descriptor that becomes readable when SIGTERM, SIGINT or SIGHUP arrives, for the select
    loop: a handler that only sets a flag would not wake a select without a timeout."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    return read_end


def run(plan: Plan, prefix: str, limit_bytes: int) -> None:
    """Sets up one TAP per machine in namespace PREFIX-NAME, says ready, and forwards until a signal.

    Raises:
        DelayLineError: a TAP could not be made or placed, or a port went away while running.
    """
    stop_fd = _stop_on_signals()
    try:
        os.setsid()  # its own session: a Ctrl-C meant for `nodes.sh up` or a closed terminal does not end it
    except OSError:
        pass
    _set_timer_slack_ns(1000)
    fds: list[int] = []
    try:
        mtu = 0
        for i, machine in enumerate(plan.machines, 1):
            tap = f"{prefix}t{i}"
            if len(tap) >= IFNAMSIZ:
                raise DelayLineError(f"TAP name {tap} is over {IFNAMSIZ - 1} characters; use a shorter "
                                     "DPUOFFLOAD_NETNS_PREFIX")
            fds.append(open_tap(tap))
            mtu = place_tap(tap, f"{prefix}-{machine}")
        print(f"delayline: ready: {len(fds)} machines, MTU {mtu}, {plan.link_s * 1e6:g} us within a node, "
              f"{plan.network_s * 1e6:g} us across nodes (pid {os.getpid()})", flush=True)
        line = DelayLine(fds, plan, mtu, limit_bytes)
        line.serve(stop_fd)
        print(f"delayline: stopped: {line.frames} frames ({line.bytes / 1e6:.0f} MB) in, {line.queue.dropped} "
              f"dropped (buffer full), {line.lost} not taken by a TAP", flush=True)
    finally:
        for fd in fds:  # the TAPs go away with their descriptors
            os.close(fd)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="delayline.py", description=__doc__.split("\n")[0])
    p.add_argument("machines", nargs="+", help="machine names, as scripts/nodes.sh up got them (h0 h1 d0 d1)")
    p.add_argument("--link", default="0", help="one-way delay within a node, e.g. 200us (DPUOFFLOAD_NETNS_DELAY)")
    p.add_argument("--network", default=None,
                   help="one-way delay across nodes (DPUOFFLOAD_NETNS_NODE_DELAY; default: --link's)")
    p.add_argument("--netns-prefix", default="dpuo", help="namespaces are PREFIX-NAME (DPUOFFLOAD_NETNS_PREFIX)")
    p.add_argument("--buffer-mb", type=int, default=256, help="frames held at most, MB (then dropped)")
    p.add_argument("--plan", action="store_true", help="print each pair's delay and exit (checks the delays)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        link_s = parse_delay(args.link, "DPUOFFLOAD_NETNS_DELAY")
        network_s = link_s if args.network is None else parse_delay(args.network, "DPUOFFLOAD_NETNS_NODE_DELAY")
        plan = plan_delays(args.machines, link_s, network_s)
    except ValueError as e:
        print(f"delayline.py: error: {e}", file=sys.stderr)
        return 2
    if args.plan:
        print(describe(plan))
        return 0
    try:
        run(plan, args.netns_prefix, args.buffer_mb << 20)
    except DelayLineError as e:
        print(f"delayline.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
