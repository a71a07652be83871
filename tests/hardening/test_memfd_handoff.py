"""The memfd handoff of the UNIX socket (a HELLO of role memfd carrying a registration's
memfds with SCM_RIGHTS, server/unix.py and server/shared_mr.py), attacked: a wrong key,
too many fds, fds in pieces before the HELLO is whole, a number reused, a session that
hoards handoffs, handoffs never claimed. The daemon runs in this process, so the fds it
holds are counted in /proc/self/fd (the memfds there): every refused or expired fd must be closed."""

from __future__ import annotations

import array
import asyncio
import os
import socket
import struct

import pytest
from rawclient import Raw, hand_over
from test_unix_socket import PAGE, memfd, session_pd, unix_daemon

from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.server import shared_mr, unix


def open_fds() -> int:
    """The memfds open in this process: the test's own and those the daemon holds."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:softhca-mr")
        except OSError:
            pass
    return n


@pytest.fixture
def fds():
    made = [memfd(1, i) for i in range(20)]
    yield made
    for fd in made:
        os.close(fd)


async def settle(want: int) -> int:
    for _ in range(100):
        if open_fds() == want:
            break
        await asyncio.sleep(0.02)
    return open_fds()


async def test_a_handoff_registers_and_the_daemon_keeps_no_fd(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        base = open_fds()
        h = await raw.hand_over(fds[:2], 5)
        assert h == {"t": "welcome", "role": "memfd", "fds": 2, "keep": 1}, h
        assert open_fds() == base + 2           # the daemon's copies, pending
        mr = await raw.call("reg_mr_shared", pd=pd, addr=0x20000, length=2 * PAGE, access=1,
                            offset=0, fds=5, pieces=[[0, 0, PAGE], [1, 0, PAGE]])
        raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=PAGE, length=4))
        got = await raw.next()
        assert bytes(got.payload) == bytes([1, 2, 3, 4])   # memfd(1, 1)'s first bytes
        assert await settle(base) == base       # mapped, and the fds closed


async def test_a_wrong_key_is_refused_and_its_fds_closed(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        base = open_fds()
        h = await raw.hand_over(fds[:3], 1, key="0" * 64)
        assert h["t"] == "err" and h["errno"] == "EACCES" and "names no session" in h["msg"]
        h = await raw.hand_over(fds[:1], 1, key=raw.welcome["memfd_key"][:-1])
        assert h["t"] == "err" and h["errno"] == "EPROTO" and "64 hex digits" in h["msg"]
        h = await raw.hand_over(fds[:1], -1)
        assert h["t"] == "err" and h["errno"] == "EPROTO", h
        h = await raw.hand_over([], 1)
        assert h["t"] == "err" and h["errno"] == "EINVAL" and "no fds" in h["msg"], h
        assert await settle(base) == base


async def test_more_fds_than_a_registration_has_pieces_are_refused(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        base = open_fds()
        h = await raw.hand_over(fds[:17], 1)
        assert h["t"] == "err" and h["errno"] == "EINVAL" and "at most 16 fds" in h["msg"], h
        # fds in every piece of a HELLO sent a few bytes at a time: 16 each, cut at 16
        header = {"t": "hello", "version": 1, "role": "memfd",
                  "key": raw.welcome["memfd_key"], "seq": 2}
        h = await asyncio.to_thread(hand_over, u.path, header, fds[:16], chunks=8)
        assert h["t"] in ("err", "closed"), h
        if h["t"] == "err":
            assert h["errno"] == "EINVAL" and "at most 16 fds" in h["msg"], h
        assert await settle(base) == base
        h = await raw.refused("reg_mr_shared", pd=await session_pd(raw), addr=0x10000,
                              length=PAGE, access=1, offset=0, fds=2, pieces=[[0, 0, PAGE]])
        assert h["errno"] == "EINVAL" and "no memfds" in h["msg"], h


async def test_a_number_pending_is_not_taken_twice(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        base = open_fds()
        assert (await raw.hand_over(fds[:1], 9))["t"] == "welcome"
        h = await raw.hand_over(fds[1:2], 9)
        assert h["t"] == "err" and h["errno"] == "EEXIST", h
        assert open_fds() == base + 1


async def test_a_session_holds_a_bounded_number_of_pending_fds(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        other = await Raw.open_unix(u.path)
        base = open_fds()
        for seq in range(shared_mr.MAX_PENDING_FDS // 16):
            assert (await raw.hand_over(fds[:16], seq))["t"] == "welcome"
        assert open_fds() == base + shared_mr.MAX_PENDING_FDS
        h = await raw.hand_over(fds[:1], 100)
        assert h["t"] == "err" and h["errno"] == "EBUSY" and "a session holds at most" \
            in h["msg"], h
        assert open_fds() == base + shared_mr.MAX_PENDING_FDS
        # another session of the same user is not locked out by it
        assert (await other.hand_over(fds[:1], 0))["t"] == "welcome"
        # the hoarder's end closes every fd it left pending
        raw.writer.close()
        assert await settle(base + 1) == base + 1


async def test_the_daemon_holds_a_bounded_number_of_pending_fds(tmp_path, fds, monkeypatch):
    monkeypatch.setattr(shared_mr, "MAX_PENDING_FDS_ALL", 20)
    async with unix_daemon(tmp_path) as (d, u):
        a, b = await Raw.open_unix(u.path), await Raw.open_unix(u.path)
        assert (await a.hand_over(fds[:16], 0))["t"] == "welcome"
        h = await b.hand_over(fds[:5], 0)
        assert h["t"] == "err" and h["errno"] == "EBUSY" and "the daemon holds" in h["msg"]
        assert (await b.hand_over(fds[:4], 0))["t"] == "welcome"


async def test_a_handoff_never_claimed_is_closed(tmp_path, fds, monkeypatch):
    monkeypatch.setattr(shared_mr, "TTL_S", 0.2)
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        base = open_fds()
        assert (await raw.hand_over(fds[:4], 3))["t"] == "welcome"
        assert open_fds() == base + 4
        await asyncio.sleep(0.5)
        assert open_fds() == base
        h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=PAGE, access=1,
                              offset=0, fds=3, pieces=[[0, 0, PAGE]])
        assert h["errno"] == "EINVAL" and "no memfds were handed over under number 3" \
            in h["msg"], h


async def test_fds_on_a_control_hello_are_closed_and_the_session_serves(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        base = open_fds()
        header = {"t": "hello", "version": 1, "role": "control"}
        # hand_over reads one frame after its HELLO: here the control session's welcome
        h = await asyncio.to_thread(hand_over, u.path, header, fds[:3])
        assert h["t"] == "welcome" and h["role"] == "control" and "memfd_key" in h, h
        assert await settle(base) == base


class Kept:
    """A memfd connection kept open, as the provider keeps one per device context: its
    HELLOs sent one after another (blocking: call it through asyncio.to_thread)."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.dec = FrameDecoder(1 << 20)
        assert self.answer()["t"] == "challenge"

    def answer(self) -> dict:
        got = []
        while not got:
            try:
                data = self.s.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return {"t": "closed"}
            got = self.dec.feed(data)
        return got[0].header

    def send(self, data: bytes, fds: list[int]) -> None:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.s.sendmsg([data], anc)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def hand_over(self, key: str, seq: int, fds: list[int]) -> dict:
        self.send(frame_bytes({"t": "hello", "version": 1, "role": "memfd", "key": key,
                               "seq": seq}), fds)
        return self.answer()

    def close(self) -> None:
        self.s.close()


async def kept(path: str) -> Kept:
    return await asyncio.to_thread(Kept, path)


async def test_one_connection_takes_a_sessions_handoffs_one_after_another(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        key = raw.welcome["memfd_key"]
        base = open_fds()
        k = await kept(u.path)
        for seq in range(3):
            h = await asyncio.to_thread(k.hand_over, key, seq, fds[2 * seq:2 * seq + 2])
            assert h == {"t": "welcome", "role": "memfd", "fds": 2, "keep": 1}, h
        assert open_fds() == base + 6
        for seq in (2, 0, 1):
            mr = await raw.call("reg_mr_shared", pd=pd, addr=0x20000 * (seq + 1),
                                length=2 * PAGE, access=1, offset=0, fds=seq,
                                pieces=[[0, 0, PAGE], [1, 0, PAGE]])
            raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=PAGE, length=4))
            got = await raw.next()
            # memfd(1, i)'s first bytes are i..i+3, and the second fd's is 2 * seq + 1
            assert bytes(got.payload) == bytes(range(2 * seq + 1, 2 * seq + 5)), seq
        assert await settle(base) == base
        k.close()


async def test_a_kept_connection_is_bound_to_its_first_session(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw, other = await Raw.open_unix(u.path), await Raw.open_unix(u.path)
        base = open_fds()
        k = await kept(u.path)
        assert (await asyncio.to_thread(k.hand_over, raw.welcome["memfd_key"], 0,
                                        fds[:1]))["t"] == "welcome"
        h = await asyncio.to_thread(k.hand_over, other.welcome["memfd_key"], 0, fds[1:3])
        assert h["t"] == "err" and h["errno"] == "EACCES" and "connection's first" \
            in h["msg"], h
        # a refusal ends the connection, and the fds it carried are closed
        assert (await asyncio.to_thread(k.answer))["t"] == "closed"
        assert await settle(base + 1) == base + 1
        k.close()


async def test_a_session_keeps_a_bounded_number_of_memfd_connections(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        other = await Raw.open_unix(u.path)
        key = raw.welcome["memfd_key"]
        conns = []
        for seq in range(shared_mr.MAX_HANDOFF_CONNS):
            conns.append(await kept(u.path))
            assert (await asyncio.to_thread(conns[-1].hand_over, key, seq, fds[:1]))["t"] \
                == "welcome"
        extra = await kept(u.path)
        h = await asyncio.to_thread(extra.hand_over, key, 50, fds[:1])
        assert h["t"] == "err" and h["errno"] == "EBUSY" and \
            f"at most {shared_mr.MAX_HANDOFF_CONNS} memfd connections" in h["msg"], h
        extra.close()
        # another session of the same user is not locked out by it
        k = await kept(u.path)
        assert (await asyncio.to_thread(k.hand_over, other.welcome["memfd_key"], 0,
                                        fds[:1]))["t"] == "welcome"
        k.close()
        # one closed makes room for another
        conns.pop().close()
        for _ in range(100):
            again = await kept(u.path)
            h = await asyncio.to_thread(again.hand_over, key, 60, fds[:1])
            again.close()
            if h["t"] == "welcome":
                break
            await asyncio.sleep(0.02)
        assert h["t"] == "welcome", h
        for c in conns:
            c.close()


async def test_the_sessions_end_ends_its_memfd_connections(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        base = open_fds()
        k = await kept(u.path)
        assert (await asyncio.to_thread(k.hand_over, raw.welcome["memfd_key"], 0,
                                        fds[:2]))["t"] == "welcome"
        raw.writer.close()
        assert (await asyncio.to_thread(k.answer))["t"] == "closed"
        assert await settle(base) == base
        k.close()


@pytest.mark.parametrize("case", ["17 fds", "fds cut in pieces", "too long", "not a hello",
                                  "not a frame"])
async def test_a_kept_connection_ends_at_a_frame_it_cannot_take(tmp_path, fds, case):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        key = raw.welcome["memfd_key"]
        base = open_fds()
        k = await kept(u.path)
        assert (await asyncio.to_thread(k.hand_over, key, 0, fds[:1]))["t"] == "welcome"
        hello = frame_bytes({"t": "hello", "version": 1, "role": "memfd", "key": key,
                             "seq": 1})
        if case == "17 fds":
            k.send(hello, fds[:17])
        elif case == "fds cut in pieces":
            # 16 fds on each of two pieces of one HELLO: 32, more than one may carry
            k.send(hello[:10], fds[:16])
            await asyncio.sleep(0.05)
            k.send(hello[10:], fds[:16])
        elif case == "too long":
            k.send(struct.pack(">I", unix.HANDOFF_FRAME + 1) + b"\0" * 64, fds[:1])
        elif case == "not a hello":
            k.send(frame_bytes({"t": "reg_mr_shared", "id": 1, "seq": 1}), fds[:1])
        else:
            k.send(struct.pack(">I", 8) + b"\xff" * 8, fds[:1])
        h = await asyncio.to_thread(k.answer)
        if h["t"] == "err":
            assert h["errno"] == "EINVAL" and "at most 16 fds" in h["msg"], h
            h = await asyncio.to_thread(k.answer)
        assert h["t"] == "closed", h
        # only the first handoff's fd is held; nothing of the frame refused
        assert await settle(base + 1) == base + 1
        k.close()


async def test_bytes_past_the_first_hello_end_the_connection(tmp_path, fds):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        key = raw.welcome["memfd_key"]
        base = open_fds()
        k = await kept(u.path)
        first = frame_bytes({"t": "hello", "version": 1, "role": "memfd", "key": key,
                             "seq": 0})
        second = frame_bytes({"t": "hello", "version": 1, "role": "memfd", "key": key,
                              "seq": 1})
        # both HELLOs in one message, without waiting for the first's answer
        k.send(first + second, fds[:2])
        h = await asyncio.to_thread(k.answer)
        assert h["t"] == "welcome" and h["fds"] == 2, h
        assert (await asyncio.to_thread(k.answer))["t"] == "closed"
        assert await settle(base + 2) == base + 2
        k.close()
