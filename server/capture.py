"""Wire capture: the daemons' RC packets as RoCEv2 frames in a pcap file.

Wireshark and tshark decode a softhca capture as InfiniBand traffic: each packet the
daemon sends ("tx") or accepts ("rx") becomes the frame a RoCEv2 NIC would put on the
wire for it, as protocol/roce.py encodes it.

Two ways to capture:

* ``softhca capture --target HOST:PORT --out FILE``: a client subscribing to a running
  daemon's "packets" events (``Taps.subscribe``); the events name the daemon but not
  its peers, so the peer side of each frame is 127.0.0.x unless ``--peer`` says.
* ``softhca serve --capture FILE`` (``CaptureTap``): the daemon itself, from its wire
  taps; it knows every QP's peer daemon, so both addresses are the real ones.

Both see the packets as the RC engine sends and accepts them: a packet a fault rule
drops on the way out is in a "tx" capture, one dropped for a bad integrity check on the
way in is not in an "rx" capture.

The daemon's own capture costs the data path a copy of each packet's payload (a train
is kept whole) and, once per turn of the event loop, one pickled batch written to a
pipe: a process of its own (``writer_main``) cuts the trains, makes the frames and
writes them, so neither the daemon's loop nor its interpreter's lock waits for the
file, and the RC engine's ACKs leave on time. What waits for the writer is bounded
(``QUEUE_BYTES``); a packet that finds it full is left out of the capture and counted
(``capture_dropped``), the traffic unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import pickle
import subprocess
import sys
import time
from collections import deque

from ..protocol.packets import Packet, Run
from ..protocol.roce import (
    SNAPLEN,
    Endpoint,
    ipv4_of,
    packet_record,
    pcap_file_header,
    pcap_record,
    pcap_records,
    stand_in,
)

# -- the pcap file (its bytes are protocol/roce.py's) -----------------------------------------

class PcapWriter:
    """A classic libpcap file (LINKTYPE_ETHERNET, microsecond timestamps); ``autoflush``
    makes each record reach the file at once (readable while capturing, whole after a
    kill)."""

    def __init__(self, path, *, snaplen: int = SNAPLEN, autoflush: bool = False,
                 _file=None) -> None:
        self.path = path
        self.snaplen = snaplen
        self.autoflush = autoflush
        self.count = 0
        if _file is not None:
            self._f = _file
            return
        self._f = open(path, "wb")
        self._f.write(pcap_file_header(snaplen))
        self.flush()

    @classmethod
    def append_to(cls, f, *, snaplen: int = SNAPLEN) -> PcapWriter:
        """Records appended to ``f``, an open binary file whose header another writer
        wrote (the daemon's capture hands its file to a writer process)."""
        return cls(getattr(f, "name", None), snaplen=snaplen, _file=f)

    def fileno(self) -> int:
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def write(self, ts: float, frame: bytes) -> None:
        self._f.write(pcap_record(ts, frame, self.snaplen))
        self.count += 1
        if self.autoflush:
            self._f.flush()

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_pcap(path) -> list[tuple[float, bytes]]:
    """The (timestamp, frame) records of the classic pcap file at ``path`` (for tests and
    tools)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return pcap_records(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


# Bytes of packets (payload and a record's overhead) waiting for the writer process.
QUEUE_BYTES = 64 << 20
RECORD_OVERHEAD = 256
# The pipe to the writer (fcntl F_SETPIPE_SZ, Linux's; pipe-max-size allows 1 MiB).
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20
# The writer process's nice(2) increment (writer_main).
NICE = 10
# The writer process: argv[1] the file descriptor of the pcap (its header written).
_WRITER_MAIN = ("import sys; from softhca.server.capture import writer_main; "
                "sys.exit(writer_main(int(sys.argv[1])))")


# -- the daemon's own capture (softhca serve --capture) ---------------------------------------

class CaptureTap:
    """A wire tap of ``daemon`` writing every packet it sends ("tx") and accepts ("rx") to
    a pcap at ``path`` (or an open PcapWriter); ``close()`` removes it, waits for what is
    queued to be written and closes the file.

    The daemon's QPs name the peer daemon of each packet: a "tx" packet goes to the peer
    of the local QP connected to its DestQP, an "rx" packet comes from the peer of the
    local QP it is addressed to.
    """

    # The wire plane hands this tap runs (trains) whole: the writer cuts them
    # (server/taps.py per_packet).
    takes_runs = True

    def __init__(self, daemon, path, *, queue_bytes: int = QUEUE_BYTES) -> None:
        self.daemon = daemon
        self.name = f"capture {getattr(path, 'path', path)}"
        # Why the capture stopped early (the disk filled, ...); None while it runs.
        self.error: BaseException | None = None
        # Opened, its header written, here: a file that cannot be written is refused now.
        self.writer = path if isinstance(path, PcapWriter) else PcapWriter(path)
        self.writer.flush()
        self._peers: dict[tuple[str, str, int], Endpoint | None] = {}
        self.queue_bytes = queue_bytes
        # This turn's records; the bytes the pipe has not taken; what both stand for
        # (``_queued``, held under ``queue_bytes``).
        self._batch: list[tuple] = []
        self._batch_bytes = 0
        self._out: deque[bytes] = deque()
        self._skip = 0
        self._queued = 0
        self._sent = 0
        self._count: int | None = None
        self._closed = False
        self._said = b""
        self._local: tuple[str, int, Endpoint] | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        daemon.counters.setdefault("capture_dropped", 0)
        fd = self.writer.fileno()
        # A session of its own: a Ctrl-C at the terminal is the daemon's to handle. The
        # writer ends when its stdin closes (``close``, or this process dying).
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER_MAIN, str(fd)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, pass_fds=(fd,), start_new_session=True)
        if self._loop is not None:
            # A larger pipe: fewer wake-ups per batch (Linux F_SETPIPE_SZ; as it may).
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._proc.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
            os.set_blocking(self._proc.stdin.fileno(), False)
            self._loop.add_reader(self._proc.stdout.fileno(), self._child_said)
        daemon.taps.append(self)

    @property
    def count(self) -> int:
        """Records written, once ``close`` has returned (until then, those handed to
        the writer)."""
        return self._count if self._count is not None else self._sent

    @property
    def dropped(self) -> int:
        return self.daemon.counters["capture_dropped"]

    def local(self) -> Endpoint:
        d = self.daemon
        if self._local is None or self._local[:2] != (d.host, d.port):
            self._local = (d.host, d.port, Endpoint(ipv4_of(d.host) or "127.0.0.1", d.port))
        return self._local[2]

    def _peer(self, direction: str, dev: str, p: Packet, here: Endpoint) -> Endpoint | None:
        key = (direction, dev, p.dest_qp)
        if key in self._peers:
            return self._peers[key]
        dest = None
        if direction == "rx":
            qph = self.daemon.qps.get((dev, p.dest_qp))
            dest = qph.dest if qph is not None else None
        else:
            for qph in self.daemon.qps.values():
                if (qph.dest is not None and qph.dest[2] == dev
                        and qph.rcqp.dest_qp == p.dest_qp):
                    dest = qph.dest
                    break
        found = None
        if dest is not None:
            host, port = dest[0], dest[1]
            found = Endpoint(ipv4_of(host) or stand_in(here.ip, f"{host}:{port}"), port)
            self._peers[key] = found     # a QP's peer does not change once connected
        return found

    def __call__(self, direction: str, dev: str, p: Packet | Run) -> None:
        """On the data path: the packet or run kept for this turn's batch (its payload
        copied: it may be a view of memory, or of a read buffer that is reused), or
        counted as dropped (each of its packets) when the writer is that far behind."""
        if self._closed or self.error is not None:
            return
        n = p.n if type(p) is Run else 1
        size = len(p.payload) + RECORD_OVERHEAD * n
        if self._queued + size > self.queue_bytes:
            self.daemon.counters["capture_dropped"] += n
            return
        self._queued += size
        if type(p.payload) is not bytes:
            p = dataclasses.replace(p, payload=bytes(p.payload))
        here = self.local()
        self._batch.append((time.time(), direction, dev, p, here,
                            self._peer(direction, dev, p, here)))
        self._batch_bytes += size
        self._sent += n
        if len(self._batch) == 1:
            if self._loop is not None:
                self._loop.call_soon(self._hand_over)
            else:
                self._hand_over()

    def _hand_over(self) -> None:
        """This turn's records to the writer as one pickled batch; what the pipe does
        not take now goes as it drains."""
        if not self._batch or self._proc.stdin is None:
            return
        data = pickle.dumps(self._batch, protocol=pickle.HIGHEST_PROTOCOL)
        self._out.append(len(data).to_bytes(8, "big"))
        self._out.append(data)
        self._batch = []
        self._queued += len(data) + 8 - self._batch_bytes
        self._batch_bytes = 0
        self._write_out()

    def _write_out(self) -> None:
        fd = self._proc.stdin.fileno()
        try:
            while self._out:
                # Written from an offset into the first chunk: no bytes are moved.
                first = self._out[0]
                k = os.write(fd, memoryview(first)[self._skip:])
                self._skip += k
                self._queued -= k
                if self._skip == len(first):
                    self._out.popleft()
                    self._skip = 0
        except BlockingIOError:
            if self._loop is not None:
                self._loop.add_writer(fd, self._drained)
        except OSError as e:            # the writer is gone
            self._out.clear()
            self._stop(e)

    def _drained(self) -> None:
        if self._proc.stdin is None:
            return
        self._loop.remove_writer(self._proc.stdin.fileno())
        self._write_out()

    def _child_said(self) -> None:
        """A line from the writer: "error ERRNO REASON" (a write failed: the capture
        stops, the daemon is told) or "count N" (it is done)."""
        try:
            chunk = os.read(self._proc.stdout.fileno(), 4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(self._proc.stdout.fileno())
        self._said += chunk
        *lines, self._said = self._said.split(b"\n")
        for line in lines:
            self._took(line.decode(errors="replace"))
        if not chunk and self.error is None and not self._closed:
            self._stop(OSError(0, "the capture's writer process ended"))

    def _took(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "count" and rest.isdigit():
            self._count = int(rest)
        elif word == "error" and self.error is None and not self._closed:
            num, _, reason = rest.partition(" ")
            self._stop(OSError(int(num) if num.isdigit() else 0, reason))

    def _stop(self, e: OSError) -> None:
        """A write failed: the daemon stops this tap (Taps.stop_tap: one log line,
        counted), which calls ``stopped``."""
        taps = getattr(self.daemon, "events", None)
        if taps is not None:
            taps.stop_tap(self, e)
        else:
            self.stopped(e)

    def stopped(self, e: BaseException) -> None:
        """The daemon stopped this tap (a write failed): the file is closed with what it
        holds; the daemon's traffic goes on without it."""
        self.error = e
        with contextlib.suppress(ValueError):
            self.daemon.taps.remove(self)
        self._finish()

    def _finish(self) -> None:
        """Hand over what is left, wait for the writer to write it and say how many."""
        if self._closed:
            return
        self._closed = True
        if self.error is None:
            self._hand_over()
        stdin, stdout = self._proc.stdin, self._proc.stdout
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_writer(stdin.fileno())
            with contextlib.suppress(Exception):
                self._loop.remove_reader(stdout.fileno())
        if stdin is not None:
            with contextlib.suppress(OSError):
                os.set_blocking(stdin.fileno(), True)
                if self.error is None and self._out:
                    self._out[0] = self._out[0][self._skip:]
                    stdin.write(b"".join(self._out))
            self._out.clear()
            with contextlib.suppress(OSError):
                stdin.close()
        self._proc.stdin = None
        with contextlib.suppress(OSError, ValueError):
            # Blocking again (an event loop may have made the pipe non-blocking).
            os.set_blocking(stdout.fileno(), True)
            said = (self._said + (stdout.read() or b"")).decode(errors="replace")
            for line in said.splitlines():
                if line.startswith("count "):
                    self._took(line)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(30)
        with contextlib.suppress(OSError):
            self.writer.close()

    def close(self) -> None:
        """Stop taking packets, write what is queued, close the file."""
        with contextlib.suppress(ValueError):
            self.daemon.taps.remove(self)
        self._finish()


def writer_main(fd: int) -> int:
    """The capture's writer process: pickled batches of records on stdin (an 8-byte
    length, then the batch: its own parent's), each packet's frame appended to the
    pcap at ``fd``; "error ERRNO REASON" on stdout when a write fails (then it reads on,
    writing nothing), "count N" once stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the daemon's priority: where the CPUs are short, the daemon's packets and
    # ACKs come first and the capture catches up (or drops, counted) after.
    with contextlib.suppress(OSError):
        os.nice(NICE)
    out = PcapWriter.append_to(os.fdopen(fd, "ab"))
    stdin = sys.stdin.buffer
    failed = False
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            break
        data = stdin.read(int.from_bytes(head, "big"))
        if failed:
            continue
        try:
            for ts, direction, dev, item, here, there in pickle.loads(data):  # noqa: S301
                for p in item.packets() if type(item) is Run else (item,):
                    out.write(ts, packet_record(direction, (dev, p), local=here, peer=there,
                                                ident=out.count))
            out.flush()
        except OSError as e:
            failed = True
            print(f"error {e.errno or 0} {e.strerror or e}", flush=True)
    with contextlib.suppress(OSError):
        out.close()
    print(f"count {out.count}", flush=True)
    return 0
