"""Who an rdma_cm address names, and why a connect could not reach it (server/cm.py's
connection manager, ``cm``): docs/native.md, "Addresses" and "Two programs on one
machine"."""

from __future__ import annotations

from ..engine.cm import CMId
from ..protocol import cm as proto
from .logs import kv, log


def daemon_of(cm, ip: str) -> tuple[str, int]:
    """The daemon (host, wire port) IPv4 address ``ip`` names: this one for its own
    address and 0.0.0.0, and for every loopback address when this daemon's address
    is not a loopback one (lo has no other daemon then); a daemon on a loopback
    address (``softhca run``'s, each on an address of its own in 127.0.0.0/8) finds
    the other daemons of its host at their loopback addresses."""
    mine = cm.my_ip()
    if ip in ("0.0.0.0", mine) or ip.startswith("127.") and not mine.startswith("127.") \
            or ip.startswith("127.") and listens_at(cm, ip):
        return (cm.node.host, cm.node.port)
    return (ip, cm.node.port)


def listens_at(cm, ip: str) -> bool:
    """Whether an id of this daemon listens bound to loopback address ``ip`` itself:
    that address is then this daemon's too, as a local listener's address is local
    (a program that binds its netdev's first address, lo's 127.0.0.1, and connects
    to it, under a daemon whose own address is 127.0.0.2)."""
    for handle in cm.listeners.values():
        c = cm.ids.get(handle)
        if c is not None and proto.ipv4_of(c.ip) == ip:
            return True
    return False


def explain(cm, cid: CMId, event: str, why: str) -> None:
    """One log line saying why ``cid``'s connection cannot be made: the program's
    event carries a status only (REJECTED 8, UNREACHABLE -110)."""
    host, port = cid.peer or (cm.node.host, cm.node.port)
    log.warning("rdma_cm connect failed %s", kv(
        event="cm_" + event, dst=f"{cid.peer_ip}:{cid.peer_port}",
        daemon=f"{host}:{port}", reason=why))


def why_unanswered(cm, cid: CMId) -> str:
    """Why a REQ's resends ran out: the wire link to the peer's daemon could not
    open (nobody listens there, another fabric's peer token, no route), or it is up
    and nothing answered."""
    host, port = cid.peer or (cm.node.host, cm.node.port)
    sent = cm.timing.max_retries + 1
    link = cm.node.wire.links.get((host, port))
    failure = getattr(link, "failure", None)
    if failure is None:
        return f"{sent} REQs to the daemon at {host}:{port} were not answered"
    said = getattr(failure, "message", None) or str(failure)
    name = getattr(failure, "errno_name", "")
    if name == "ECONNREFUSED":
        return (f"no daemon listens at {host}:{port} ({said}): rdma_cm names the "
                f"daemon at the address on this daemon's own wire port {cm.node.port}; "
                "the peer's daemon must listen there (softhca run --listen "
                f"{cid.peer_ip}:{cm.node.port}, or the default --listen, which takes "
                f"an address of its own in 127.0.0.0/8 on port 4791)")
    if name == "EACCES":
        return (f"the daemon at {host}:{port} refused this daemon's wire link ({said}): "
                "give both daemons one --peer-token-file")
    return f"the wire link to the daemon at {host}:{port} failed: {name}: {said}"


def why_rejected(cm, cid: CMId) -> str:
    """Why a REQ was rejected with reason 8 (invalid service ID): nothing listens on
    its port at the daemon it reached."""
    host, port = cid.peer or (cm.node.host, cm.node.port)
    why = f"no rdma_cm listener on port {cid.peer_port} at the daemon at {host}:{port}"
    if (host, port) == (cm.node.host, cm.node.port) and cid.peer_ip != "0.0.0.0":
        why += (f": {cid.peer_ip} names this daemon itself; a program under another "
                "softhca run has its daemon at another address (its --listen: the "
                "default takes the first free 127.0.0.N on port 4791)")
    return why
