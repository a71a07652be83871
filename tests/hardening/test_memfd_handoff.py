"""The memfd handoff of the UNIX socket (a HELLO of role memfd carrying a registration's
memfds with SCM_RIGHTS, server/unix.py and server/shared_mr.py), attacked: a wrong key,
too many fds, fds in pieces before the HELLO is whole, a number reused, a session that
hoards handoffs, handoffs never claimed. The daemon runs in this process, so the fds it
holds are counted in /proc/self/fd (the memfds there): every refused or expired fd must be closed."""

from __future__ import annotations

import asyncio
import os

import pytest
from rawclient import Raw, hand_over
from test_unix_socket import PAGE, memfd, session_pd, unix_daemon

from softhca.server import shared_mr


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
        assert h == {"t": "welcome", "role": "memfd", "fds": 2}, h
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
