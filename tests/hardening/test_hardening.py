"""Hardening: bad input at every edge, authentication, limits.

Whatever arrives, the daemon answers with a precise error (or, for a peer that broke
framing, an error frame and a close), keeps serving every other connection, and
leaks nothing: object tables and registered bytes go back to where they were.
"""

from __future__ import annotations

import asyncio
import os
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, FrameError, encode_frame, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.protocol.packets import IntegrityError, Packet, decode_packet, packet_header
from softhca.server.daemon import PROCESS_PEER_TOKEN, Limits

from e2e import connect_pair, make_side, rdma, sge, whole


async def raw(address: str, role: str | None = "control", token: bytes | None = None):
    """A socket past the HELLO (when ``role``), speaking frames by hand."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(64 << 20)
    frames = await read_frames(reader, dec)
    if role is not None:
        writer.write(frame_bytes(make_hello(frames[0].header, role, token)))
        frames = frames[1:] or await read_frames(reader, dec)
        assert frames[0].kind == "welcome", frames[0].header
    return reader, writer, dec


async def read_frames(reader, dec, timeout: float = 5.0):
    while True:
        data = await asyncio.wait_for(reader.read(1 << 16), timeout)
        if not data:
            return []
        frames = dec.feed(data)
        if frames:
            return frames


def table_sizes(daemon) -> tuple:
    hca = daemon.hcas["mlx5_0"]
    return (len(hca.keys), len(hca.pds), len(hca.deks), len(daemon.qps), len(daemon.sessions),
            daemon.registered_bytes)


async def settle(daemon, sessions: int) -> None:
    for _ in range(200):
        if len(daemon.sessions) == sessions:
            return
        await asyncio.sleep(0.01)


# -- authentication ----------------------------------------------------------------------

async def test_wrong_token_no_token_and_replayed_hello_are_refused():
    async with sh.embedded(token=b"right") as node:
        for token in (b"wrong", None):
            with pytest.raises(sh.RDMAError) as e:
                await sh.connect(node.address, token=token)
            assert e.value.errno_name == "EACCES"
        # Replay: a hello that verified on one connection, sent on another (another nonce).
        host, port = node.address.rsplit(":", 1)
        r1, w1 = await asyncio.open_connection(host, int(port))
        d1 = FrameDecoder()
        good = make_hello((await read_frames(r1, d1))[0].header, "control", b"right")
        w1.write(frame_bytes(good))
        assert (await read_frames(r1, d1))[0].kind == "welcome"
        r2, w2 = await asyncio.open_connection(host, int(port))
        d2 = FrameDecoder()
        await read_frames(r2, d2)
        w2.write(frame_bytes(good))
        reply = (await read_frames(r2, d2))[0].header
        assert (reply["t"], reply["errno"]) == ("err", "EACCES")
        assert await read_frames(r2, d2) == [], "then the daemon closes"
        # Frames sent before the hello verifies are never read as requests.
        r3, w3 = await asyncio.open_connection(host, int(port))
        d3 = FrameDecoder()
        await read_frames(r3, d3)
        w3.write(frame_bytes({"t": "devices", "id": 1}))
        reply = (await read_frames(r3, d3))[0].header
        assert reply["t"] == "err" and reply["errno"] == "EPROTO"
        for w in (w1, w2, w3):
            w.close()
        assert (await node.open_device()).name == "mlx5_0"


# -- malformed input while a valid client works ------------------------------------------

def malformed_frames(rng: random.Random) -> list[tuple[str, bytes]]:
    """One of each kind of broken frame a connection can send after its HELLO."""
    big = (1 << 30).to_bytes(4, "big")
    return [
        ("length over the maximum", big + b"\0" * 8),
        ("header length past the frame", (8).to_bytes(4, "big") + (100).to_bytes(4, "big")
         + b"\0" * 4),
        ("frame too short", (2).to_bytes(4, "big") + b"\0\0"),
        ("bad msgpack", (7).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"\xc1\xc1\xc1"),
        ("header not a map", frame_bytes({"t": "x"})[:8] + msgpack.packb([1, 2, 3])[:0]
         + (b"\x93\x01\x02\x03")),
        ("random bytes", rng.randbytes(64)),
    ]


def fix_lengths(name: str, data: bytes) -> bytes:
    if name == "header not a map":
        body = b"\x93\x01\x02\x03"
        return (4 + len(body)).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body
    return data


BAD_REQUESTS = [
    {"t": "no_such_verb", "id": 1},
    {"t": "reg_mr", "id": 2, "pd": "one", "length": 1, "access": 0},
    {"t": "reg_mr", "id": 3, "pd": 1, "length": -5, "access": 0},
    {"t": "reg_mr", "id": 4, "pd": 1, "length": (1 << 64) - 1, "access": 0},
    {"t": "reg_mr", "id": 5, "pd": 1, "length": 64, "access": 0, "surprise": True},
    {"t": "post_send", "id": 6, "qp": 1, "wrs": [[1, 2, 3]]},
    {"t": "post_send", "id": 7, "qp": 99, "wrs": [{"wr_id": 1}]},
    {"t": "mkey_configure", "id": 8, "qp": 1, "calls": [["sig_block", {"mem": 7}]]},
    {"t": "poll_cq", "id": 9, "cq": 1, "num": 0, "timeout": 1},
    {"t": "modify_qp", "id": 10, "qp": 1, "attr": {"qp_state": 99}, "mask": 0},
    {"t": "mr_read", "id": 11, "mr": 1, "offset": 1 << 40, "length": 1},
    {"t": "faults_add", "id": 12, "rule": {"action": "corrupt"}},
]


def bad_packets(qpn: int) -> list[dict]:
    good = packet_header("mlx5_0", Packet(qpn, 5, "SEND_ONLY", b""))
    return [
        {**good, "icrc": (good["icrc"] + 1) & 0xFFFFFFFF},            # a link error: dropped
        {**packet_header("mlx5_0", Packet(0xABCDE, 1, "SEND_ONLY"))},    # unknown QP: dropped
        {**good, "op": "RDMA_WRITE_ONLY"},                               # no RETH: disconnect
        {**good, "op": "TELEPORT"},
        {**good, "psn": 1 << 30},
        {"t": "pkt"},
    ]


async def test_a_thousand_malformed_frames_beside_a_valid_transfer():
    rng = random.Random(1000)
    async with sh.embedded() as inode, sh.embedded() as tnode:
        daemon = tnode.daemon
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        data = rng.randbytes(1 << 20)
        src = await i.reg_mr(data)
        dst = await t.reg_mr(len(data))
        before = table_sizes(daemon)
        sent = 0

        async def valid_traffic():
            for r in range(40):
                await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 1 << 18, r % 4 << 18)],
                                          dst.rkey, dst.addr + (r % 4 << 18), wr_id=r))
                (wc,) = await i.scq.poll_n(1, 20)
                assert (wc.wr_id, wc.status) == (r, sh.IBV_WC_SUCCESS)

        async def attack():
            nonlocal sent
            # Framing errors: each poisons its connection, which gets an error and a close.
            for n in range(150):
                name, data_ = malformed_frames(rng)[n % 6]
                reader, writer, dec = await raw(tnode.address)
                writer.write(fix_lengths(name, data_))
                frames = await read_frames(reader, dec)
                if name != "random bytes":
                    assert frames and frames[0].header["t"] == "err", name
                    assert await read_frames(reader, dec) == [], "closed after the error"
                writer.close()
                sent += 1
            # Request-level errors: one session answers each and stays usable.
            reader, writer, dec = await raw(tnode.address)
            for n in range(700):
                bad = BAD_REQUESTS[n % len(BAD_REQUESTS)]
                writer.write(frame_bytes({**bad, "id": n + 1}))
                sent += 1
            answered = []
            while len(answered) < 700:
                answered += await read_frames(reader, dec)
            assert all(f.header["t"] == "err" and f.header["id"] == k + 1
                       for k, f in enumerate(answered))
            writer.write(frame_bytes({"t": "devices", "id": 9999}))
            (ok,) = await read_frames(reader, dec)
            assert ok.header == {"t": "ok", "id": 9999, "devices": ["mlx5_0"]}
            writer.close()
            # Wire-plane garbage: dropped and counted, or the peer is disconnected.
            for n in range(150):
                reader, writer, dec = await raw(tnode.address, role="wire",
                                                token=PROCESS_PEER_TOKEN)
                for h in bad_packets(t.qp.qp_num)[:2]:
                    writer.write(frame_bytes(h))
                writer.write(frame_bytes(bad_packets(t.qp.qp_num)[2 + n % 4]))
                frames = await read_frames(reader, dec)
                assert frames and frames[0].header["t"] == "err"
                writer.close()
                sent += 3
            # A truncated frame, then the peer goes away.
            for _ in range(10):
                reader, writer, dec = await raw(tnode.address)
                writer.write(frame_bytes({"t": "devices", "id": 1})[:-3])
                writer.close()
                sent += 1

        await asyncio.gather(valid_traffic(), attack())
        assert sent >= 1000
        assert await dst.read() == data, "the valid client's bytes all landed intact"
        await settle(daemon, 1)
        assert table_sizes(daemon) == before, "nothing leaked"
        c = await tnode.counters()
        assert c["packets_bad_icrc"] >= 150 and c["packets_unknown_qp"] >= 150
        assert c["wire_protocol_errors"] >= 150


# -- limits ---------------------------------------------------------------------------------

async def test_connection_limit():
    async with sh.embedded(limits=Limits(max_connections=2)) as node:
        second = await sh.connect(node.address)
        with pytest.raises(sh.RDMAError) as e:
            await sh.connect(node.address)
        assert e.value.errno_name == "EBUSY" and "at most 2 connections" in e.value.message
        await second.close()
        for _ in range(100):
            if node.daemon.connections < 2:
                break
            await asyncio.sleep(0.01)
        third = await sh.connect(node.address)
        assert (await third.open_device()).name == "mlx5_0"
        await third.close()


async def test_object_limit_per_session():
    async with sh.embedded(limits=Limits(max_objects=4)) as node:
        ctx = await node.open_device()
        pds = [await ctx.alloc_pd() for _ in range(3)]
        with pytest.raises(sh.RDMAError) as e:
            await ctx.alloc_pd()
        assert e.value.errno_name == "ENOMEM" and "limit per session" in e.value.message
        assert len(node.daemon.hcas["mlx5_0"].pds) == 3, "the refused PD was never made"
        await pds[0].close()
        await ctx.alloc_pd()
        async with await sh.connect(node.address) as other:
            await (await other.open_device()).alloc_pd()     # another session has its own


async def test_registered_bytes_per_session_and_per_daemon():
    lim = Limits(max_session_bytes=4 << 20, max_daemon_bytes=5 << 20)
    async with sh.embedded(limits=lim) as node:
        pd = await (await node.open_device()).alloc_pd()
        mr = await pd.reg_mr(2 << 20)
        with pytest.raises(sh.RDMAError) as e:
            await pd.reg_mr(3 << 20)
        assert e.value.errno_name == "ENOMEM" and "this session" in e.value.message
        async with await sh.connect(node.address) as other:
            opd = await (await other.open_device()).alloc_pd()
            await opd.reg_mr(3 << 20)
            with pytest.raises(sh.RDMAError) as e:
                await opd.reg_mr(1 << 10)
            assert e.value.errno_name == "ENOMEM" and "the daemon" in e.value.message
        await settle(node.daemon, 1)
        await pd.reg_mr(1 << 20)        # the other session's bytes were given back
        await mr.close()
        assert node.daemon.registered_bytes == 1 << 20


async def test_frame_size_limit():
    async with sh.embedded(limits=Limits(max_frame=64 << 10)) as node:
        pd = await (await node.open_device()).alloc_pd()
        mr = await pd.reg_mr(1 << 20)
        payload = os.urandom(1 << 20)
        await mr.write(payload)         # chunked below the daemon's frame limit
        assert await mr.read() == payload
        reader, writer, dec = await raw(node.address)
        writer.write(frame_bytes({"t": "mr_write", "id": 1, "mr": 1, "offset": 0},
                                 bytes(100 << 10)))
        (err,) = await read_frames(reader, dec)
        assert err.header["errno"] == "EMSGSIZE" and "65536-byte limit" in err.header["msg"]
        writer.close()
        assert await mr.read(16) == payload[:16], "the other session goes on"


async def test_message_size_and_queue_limits():
    async with sh.embedded(limits=Limits(max_msg_size=1 << 16, max_qp_wr=8)) as a, \
            sh.embedded() as b:
        with pytest.raises(sh.RDMAError) as e:
            await make_side(a, max_wr=9)
        assert e.value.errno_name == "EINVAL" and "max_qp_wr 8" in e.value.message
        i, t = await make_side(a, max_wr=8), await make_side(b)
        await connect_pair(i, t)
        src = await i.reg_mr(1 << 17)
        dst = await t.reg_mr(1 << 17)
        with pytest.raises(sh.RDMAError) as e:
            await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr))
        assert e.value.errno_name == "EINVAL" and "max_msg_sz" in e.value.message
        # Outstanding WRs per QP: the ninth is refused while eight wait for a receive.
        await i.qp.post_send([sh.SendWR(wr_id=n, opcode=sh.IBV_WR_SEND, sg=[sge(src, 10)])
                              for n in range(8)])
        with pytest.raises(sh.RDMAError) as e:
            await i.qp.post_send(sh.SendWR(wr_id=9, opcode=sh.IBV_WR_SEND, sg=[sge(src, 10)]))
        assert e.value.errno_name == "ENOMEM" and "send queue full" in e.value.message
        await t.qp.post_recv([sh.RecvWR(wr_id=n, sg=[sge(dst, 10)]) for n in range(8)])
        assert len(await i.scq.poll_n(8, 20)) == 8


async def test_a_client_that_never_reads_cannot_grow_the_daemon():
    async with sh.embedded(limits=Limits(reply_high_water=1 << 20)) as node:
        pd = await (await node.open_device()).alloc_pd()
        mr = await pd.reg_mr(1 << 20)
        reader, writer, dec = await raw(node.address)
        # Ask for 1 MiB reads without ever reading the replies.
        request = frame_bytes({"t": "mr_read", "id": 1, "mr": 1, "offset": 0,
                               "length": 1 << 20})
        for _ in range(200):
            writer.write(request)
        await asyncio.sleep(0.5)
        # The daemon stopped reading requests once its replies backed up.
        session = next(s for s in node.daemon.sessions if s.peer.endswith(
            str(writer.get_extra_info("sockname")[1])))
        buffered = session.writer.transport.get_write_buffer_size()
        assert buffered < 8 << 20, buffered
        writer.close()
        assert len(await mr.read(16)) == 16


# -- fuzz ---------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=40))
def test_fuzz_frame_decoder(data, cut):
    dec = FrameDecoder(max_frame=1 << 16)
    try:
        for i in range(0, len(data), cut):
            for fr in dec.feed(data[i:i + cut]):
                assert isinstance(fr.header, dict) and isinstance(fr.kind, str)
    except FrameError as e:
        assert e.errno_name in ("EPROTO", "EMSGSIZE")


# Anything msgpack can carry: what a client could send at all.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 63),
                                                           max_value=(1 << 64) - 1),
                     st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["dev", "qp", "psn", "op", "reth", "aeth", "imm", "ieth",
                                        "ateth", "atack", "icrc", "x"]), _values, max_size=8),
       st.binary(max_size=64))
def test_fuzz_packet_decoder(header, payload):
    try:
        dev, p = decode_packet({"t": "pkt", **header}, payload)
    except FrameError:
        return
    assert isinstance(p, Packet) and isinstance(dev, str)


_ext_items = st.one_of(st.integers(min_value=-2, max_value=(1 << 65)), st.booleans(),
                       st.sampled_from(["ACK", "RNR", "NAK_PSN_SEQ", "nope"]), st.none())


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_ext_items, max_size=4), st.tuples(_ext_items, _ext_items,
                                                              _ext_items), _values))
def test_reth_and_aeth_are_taken_exactly_as_ibta_sizes_them(value):
    """The RETH (32-bit R_Key, 64-bit VA, 32-bit DMA length) and the AETH (a known
    syndrome, 24-bit MSN) of a packet header: a list of exactly those is taken, anything
    else (a bool for an int, a value out of range, a tuple, a wrong count) is refused
    with EPROTO; the rule is written out here, apart from the decoder's fast path."""
    from softhca.protocol.opcodes import SYNDROMES

    def is_uint(x, bits):
        return type(x) is int and 0 <= x < 1 << bits

    ok = {"reth": type(value) is list and len(value) == 3 and all(
              is_uint(x, b) for x, b in zip(value, (32, 64, 32), strict=True)),
          "aeth": type(value) is list and len(value) == 2 and type(value[0]) is str
          and value[0] in SYNDROMES and is_uint(value[1], 24)}
    for name, op in (("reth", "RDMA_READ_REQUEST"), ("aeth", "ACKNOWLEDGE")):
        header = {"t": "pkt", "dev": "mlx5_0", "qp": 1, "psn": 2, "op": op, "icrc": 0,
                  name: value}
        try:
            decode_packet(header, b"")
        except IntegrityError:
            assert ok[name]         # well formed: only the check (icrc 0) is wrong
        except FrameError as e:
            assert not ok[name] and e.errno_name == "EPROTO" and name in str(e), str(e)
        else:
            raise AssertionError(f"{name} {value!r} decoded with icrc 0")


VERBS = sorted(__import__("softhca.protocol.control", fromlist=["REQUESTS"]).REQUESTS)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(VERBS),
                          st.dictionaries(st.sampled_from(
                              ["ctx", "pd", "mr", "cq", "qp", "mkey", "dek", "length", "access",
                               "offset", "cqe", "num", "timeout", "wrs", "calls", "attr", "mask",
                               "name", "rule", "rule_id", "create_flags", "max_entries", "key"]),
                              st.one_of(st.integers(min_value=-2, max_value=5), _values),
                              max_size=6)),
                min_size=1, max_size=12))
def test_fuzz_control_handlers(requests):
    asyncio.run(_fuzz_control(requests))


async def _fuzz_control(requests):
    async with sh.embedded() as node:
        daemon = node.daemon
        before = table_sizes(daemon)
        async with await sh.connect(node.address) as fuzz:
            # Give the session something its handles can name.
            ctx = await fuzz.open_device()
            pd = await ctx.alloc_pd()
            await pd.reg_mr(4096)
            await ctx.create_cq(4)
            for verb, fields in requests:
                fields = {k: v for k, v in fields.items() if k not in ("t", "id")}
                if verb == "poll_cq" and isinstance(fields.get("timeout"), (int, float)):
                    fields["timeout"] = min(abs(fields["timeout"]), 0.01)
                if verb == "reg_mr" and isinstance(fields.get("length"), int):
                    fields["length"] = min(fields["length"], 1 << 16)
                try:
                    await asyncio.wait_for(fuzz.request(verb, **fields), 5)
                except sh.RDMAError as e:
                    assert e.errno_name != "ECONNRESET", (verb, fields, e)
            assert (await fuzz.request("devices"))[0]["devices"] == ["mlx5_0"]
        await settle(daemon, 1)
        daemon.faults.clear()
        assert table_sizes(daemon) == before, "the session's objects all went with it"
        assert (await node.open_device()).name == "mlx5_0"


def test_encode_frame_refuses_nothing_it_then_cannot_decode():
    header = {"t": "x", "bin": b"\0" * 10, "n": [1, 2, {"a": None}]}
    (fr,) = FrameDecoder().feed(b"".join(encode_frame(header, b"payload")))
    assert fr.header == header and bytes(fr.payload) == b"payload"
