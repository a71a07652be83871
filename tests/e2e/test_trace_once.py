"""A transfer is traced once: a READ whose responses were lost is asked again by the
requester, and the responder answers the duplicate from its record of the READ
(engine/rc_responder.py ``_replay_read``) without listing the transfer again."""

from __future__ import annotations

import softhca.client as sh

from e2e import rdma, two_nodes, whole


async def test_a_duplicate_read_is_answered_but_not_traced_again():
    async with two_nodes() as p:
        src = await p.target.reg_mr(b"once" * 1024)
        dst = await p.initiator.reg_mr(4096)
        sub = await p.target.node.subscribe("trace", daemon_wide=True)
        # The initiator's daemon drops the READ's first response on the way in: its
        # requester times out and asks again, and the target answers the duplicate.
        await p.initiator.node.faults.add(action="drop", direction="in",
                                          opcode="RDMA_READ_RESPONSE", message=1, count=1)
        await p.initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, whole(dst), src.rkey,
                                            src.addr, 7))
        (wc,) = await p.initiator.send_wc()
        assert wc.status == sh.IBV_WC_SUCCESS and await dst.read(4096) == b"once" * 1024
        stats = await p.target.node.counters()
        assert stats["duplicate_reads_answered"] >= 1, stats
        events = []
        while (ev := await sub.next(0.5)) is not None:
            events.append(ev.header)
    reads = [h for h in events if h.get("op") == "RDMA_READ" and h.get("stage") == "gather"]
    assert len(reads) == 1, events
    assert reads[0]["at"] == "mr"      # the MR's offset the READ gathered from
