"""A QP whose retries ran out because its peer's daemon cannot connect back.

Each daemon sends on a wire link it opens itself, so an RC pair needs a link each way:
the requester's daemon connects to the address the peer QP gave, the responder's
daemon to the address this QP gave (docs/protocol.md, "Wire links"). When the second
cannot be opened (this daemon listens on 127.0.0.1 and the peer is on another host, or
on an address the peer has no route to), the peer's ACKs never come and the WR ends in
IBV_WC_RETRY_EXC_ERR, while only the peer's log says why (``wire_out_failed``). This
daemon can tell that case apart: its own link to the peer's daemon was up, and no link
ever came from that daemon. It then says so three ways: the completion's vendor_err
(VENDOR_ERR_NO_RETURN_LINK), one ``peer_no_return`` log line per QP, and a ``notice``
event to trace subscribers (``softhca trace`` prints it).
"""

from __future__ import annotations

import dataclasses

from ..protocol.enums import WcStatus
from ..protocol.records import VENDOR_ERR_NO_RETURN_LINK, WC
from .hosts import QPHost
from .logs import kv, log

__all__ = ["explain_retry_exceeded", "no_return_message"]


def no_return_message(peer: str, listen: str) -> str:
    return (f"the peer's daemon at {peer} never connected back to this daemon at {listen}: "
            "its packets (the ACKs) cannot reach this address; listen on one it can reach "
            "(sh.embedded(peer=...) picks the one that routes to it)")


def explain_retry_exceeded(wire, taps, qph: QPHost, wcs: list[WC], listen: str) -> list[WC]:
    """``wcs`` (a send CQ's new completions of ``qph``), those that ended in
    RETRY_EXC_ERR for want of a link back given VENDOR_ERR_NO_RETURN_LINK."""
    if qph.dest is None or not any(w.status == WcStatus.RETRY_EXC_ERR for w in wcs):
        return wcs
    host, port, _ = qph.dest
    if not wire.cannot_hear(host, port):
        return wcs
    peer = f"{host}:{port}"
    if not qph.no_return_said:
        qph.no_return_said = True
        message = no_return_message(peer, listen)
        log.warning("peer cannot connect back %s", kv(
            event="peer_no_return", qp=f"{qph.rcqp.qp_num:#x}", dev=qph.hca.name, peer=peer,
            listen=listen, reason=message))
        taps.notice(qph, {"event": "peer_no_return", "qp": qph.rcqp.qp_num, "peer": peer,
                          "listen": listen, "vendor_err": VENDOR_ERR_NO_RETURN_LINK,
                          "message": message})
    return [dataclasses.replace(w, vendor_err=VENDOR_ERR_NO_RETURN_LINK)
            if w.status == WcStatus.RETRY_EXC_ERR else w for w in wcs]
