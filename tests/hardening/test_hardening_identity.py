"""Identities that cannot be counted: the co-tenant injection.

Two ``softhca serve`` processes with one client token, as a deployment runs them, and
the daemons' own peer token. A victim connects QP a on daemon 1 to QP b on daemon 2 and
posts a receive on b. A co-tenant (a client with the same token) makes one QP on each
daemon, guesses the victim's numbers from its own, and opens a wire link to daemon 2
claiming daemon 1's address to SEND into b with PSN 0. Its link is refused at the HELLO
(the client token is no peer credential); its guesses are wrong (numbers are drawn at
random); the victim's own SEND lands whole.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from test_hardening import read_frames

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.protocol.packets import Packet, packet_header
from softhca.tools.daemons import Daemons

from e2e import make_side, sge


def secret_file(path: Path) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    return path


async def forge_send(target: str, claim: str, token: bytes, dqp: int, sqp: int,
                     data: bytes) -> str:
    """A wire link to ``target`` naming ``claim`` as its daemon, proving ``token``, and
    one SEND_ONLY with PSN 0 to QP ``dqp`` from ``sqp``; what the daemon answered."""
    host, port = target.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    try:
        (challenge,) = await read_frames(reader, dec)
        writer.write(frame_bytes(make_hello(challenge.header, "wire", token, claim)))
        (answer,) = await read_frames(reader, dec)
        if answer.header["t"] == "welcome":
            h = packet_header("mlx5_0", Packet(dqp, 0, "SEND_ONLY", data))
            h["sqp"] = sqp
            writer.write(frame_bytes(h, data))
            await writer.drain()
            await asyncio.sleep(0.2)
            return "welcome"
        return answer.header.get("errno", answer.header["t"])
    finally:
        writer.close()


async def test_co_tenant_injection_by_counting_is_refused_and_the_victims_data_intact(tmp_path):
    token_file = secret_file(tmp_path / "token")
    token = token_file.read_text().strip().encode()
    with Daemons(2, str(tmp_path), ("--token-file", str(token_file))) as (d1, d2):
        n1, n2 = await sh.connect(d1, token=token), await sh.connect(d2, token=token)
        a, b = await make_side(n1), await make_side(n2)
        await a.qp.connect(b.qp.info())
        await b.qp.connect(a.qp.info())
        inbox = await b.reg_mr(64)
        await b.qp.post_recv(sh.RecvWR(wr_id=1, sg=[sge(inbox)]))
        victim_keys = [(await b.reg_mr(16)).rkey for _ in range(2)]

        # The attacker: another session of the same tenant on each daemon.
        e1, e2 = await sh.connect(d1, token=token), await sh.connect(d2, token=token)
        x1, x2 = await make_side(e1), await make_side(e2)
        mine = [(await x2.reg_mr(16)).rkey for _ in range(2)]
        guesses = {"dest qp": (x2.qp.qp_num - 1) & 0xFFFFFF,
                   "source qp": (x1.qp.qp_num - 1) & 0xFFFFFF}
        evil = b"INJECTED BY A CO-TENANT"
        # The attack with guessed numbers, then its strongest form: the
        # victim's real numbers, as if the attacker had learnt them.
        answers = [await forge_send(d2, d1, token, guesses["dest qp"], guesses["source qp"],
                                    evil),
                   await forge_send(d2, d1, token, b.qp.qp_num, a.qp.qp_num, evil)]

        mine_ok = b"the victim's own SEND"
        src = await a.reg_mr(mine_ok)
        await a.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=[sge(src)]))
        (swc,) = await a.scq.poll_n(1, 10)
        (rwc,) = await b.rcq.poll_n(1, 10)
        got = await inbox.read()
        c2 = await n2.counters()
        index_gaps = [abs((k[1] >> 8) - (k[0] >> 8)) for k in (victim_keys, mine)]
        print(f"\nco-tenant injection: wire hellos with the client token answered "
              f"{answers}; victim QPs {a.qp.qp_num:#x}/{b.qp.qp_num:#x}, attacker's "
              f"{x1.qp.qp_num:#x}/{x2.qp.qp_num:#x} (guessed {guesses['source qp']:#x}/"
              f"{guesses['dest qp']:#x}); victim PSNs {a.qp.psn:#x}/{b.qp.psn:#x}; key index "
              f"gaps between consecutive registrations {index_gaps}; victim SEND "
              f"status {swc.status} (0: IBV_WC_SUCCESS), received {rwc.byte_len} bytes {got[:rwc.byte_len]!r}; "
              f"duplicates_discarded={c2['duplicates_discarded']} "
              f"packets_wrong_peer={c2['packets_wrong_peer']}")
        assert answers == ["EACCES", "EACCES"], "the client token opens no wire link"
        assert (swc.status, rwc.status) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SUCCESS)
        assert got[:rwc.byte_len] == mine_ok and rwc.byte_len == len(mine_ok)
        assert c2["duplicates_discarded"] == 0
        for n in (n1, n2, e1, e2):
            await n.close()


async def test_numbers_are_drawn_from_their_whole_space_without_reuse_while_live():
    """QPNs and key indexes of one daemon: no two live ones equal, and consecutive ones
    not neighbours (counting gives a gap of 1 every time; random 24-bit draws give a gap
    of 1 with a chance of about 1e-7 each)."""
    async with sh.embedded() as node:
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(16)
        qps = [await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                                                cap=sh.QPCap(max_send_wr=1, max_recv_wr=1)))
               for _ in range(64)]
        mrs = [await pd.reg_mr(16, sh.IBV_ACCESS_LOCAL_WRITE) for _ in range(256)]
        qpns = [q.qp_num for q in qps]
        indexes = [m.lkey >> 8 for m in mrs]
        psns = {q.psn for q in qps}
        near = sum(abs(x - y) <= 1 for s in (qpns, indexes) for x, y in zip(s, s[1:], strict=False))
        spread = (max(qpns) - min(qpns)) / (1 << 24), (max(indexes) - min(indexes)) / (1 << 24)
        print(f"\n64 QPNs, 256 key indexes: {len(set(qpns))} and {len(set(indexes))} "
              f"distinct, {near} consecutive pairs adjacent, spread {spread[0]:.2f} and "
              f"{spread[1]:.2f} of 2^24; {len(psns)} distinct initial PSNs of 64")
        assert len(set(qpns)) == 64 and len(set(indexes)) == 256
        assert all(1 < q < 1 << 24 for q in qpns) and all(0 < i < 1 << 24 for i in indexes)
        assert near == 0
        # 64 uniform draws from 2^24 spread over less than half of it: about 64 * 2^-63.
        assert min(spread) > 0.5
        assert len(psns) >= 60
