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
"""

from __future__ import annotations

import contextlib
import time

from ..protocol.packets import Packet
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

    def __init__(self, path, *, snaplen: int = SNAPLEN, autoflush: bool = False) -> None:
        self.path = path
        self.snaplen = snaplen
        self.autoflush = autoflush
        self.count = 0
        self._f = open(path, "wb")
        self._f.write(pcap_file_header(snaplen))
        self.flush()

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


# -- the daemon's own capture (softhca serve --capture) ---------------------------------------

class CaptureTap:
    """A wire tap of ``daemon`` writing every packet it sends ("tx") and accepts ("rx") to
    a pcap at ``path`` (or an open PcapWriter); ``close()`` removes it and closes the file.

    The daemon's QPs name the peer daemon of each packet: a "tx" packet goes to the peer
    of the local QP connected to its DestQP, an "rx" packet comes from the peer of the
    local QP it is addressed to.
    """

    def __init__(self, daemon, path) -> None:
        self.daemon = daemon
        self.name = f"capture {getattr(path, 'path', path)}"
        # Why the capture stopped early (the disk filled, ...); None while it runs.
        self.error: BaseException | None = None
        self.writer = path if isinstance(path, PcapWriter) else PcapWriter(path, autoflush=True)
        self._peers: dict[tuple[str, str, int], Endpoint | None] = {}
        daemon.taps.append(self)

    @property
    def count(self) -> int:
        return self.writer.count

    def local(self) -> Endpoint:
        d = self.daemon
        return Endpoint(ipv4_of(d.host) or "127.0.0.1", d.port)

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

    def __call__(self, direction: str, dev: str, p: Packet) -> None:
        if self.writer.closed:
            return
        here = self.local()
        there = self._peer(direction, dev, p, here)
        frame = packet_record(direction, (dev, p), local=here, peer=there,
                              ident=self.writer.count)
        self.writer.write(time.time(), frame)

    def stopped(self, e: BaseException) -> None:
        """The daemon stopped this tap (a write failed): the file is closed with what it
        holds; the daemon's traffic goes on without it."""
        self.error = e
        with contextlib.suppress(OSError):
            self.writer.close()

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.daemon.taps.remove(self)
        with contextlib.suppress(OSError):
            self.writer.close()
