"""The connection manager's side that faces other daemons: a CM message from a wire
link, checked against the link's proven origin before anything is looked at, then
handed to the handler of its kind (REQ, REP, MRA, REJ, RTU, DREQ, DREP). A mixin of
server/cm.py's ConnectionManager, which holds the ids, the timers and the sending."""

from __future__ import annotations

from ..engine.cm import CMId, CMState
from ..protocol import cm as proto
from ..protocol.errors import RDMAError
from ..protocol.frames import FrameError
from . import cm_addresses, cm_sidr
from .logs import kv, log
from .wire import peer_origins


class CmInbound:
    """Handlers of the CM messages another daemon sends (IBTA 12.6 and 12.9)."""

    def receive(self, header: dict, payload, origin) -> None:
        """A CM message from the daemon at ``origin`` ((host class, wire port), what the
        wire link proved), checked before anything is looked at."""
        self.node.counters["cm_messages_in"] += 1
        try:
            m = proto.decode_message(header, payload)
        except FrameError as e:
            self._refuse(origin, f"malformed: {e.message}")
            return
        if self.node.faults.rules and self.node.faults.drops_cm("in", m["m"]):
            self.node.counters["cm_messages_dropped"] += 1
            return
        if origin is None:
            self._refuse(origin, "a wire link that names no daemon")
            return
        if m["m"] == "req":
            self._on_req(m, origin)
            return
        if m["m"] == "sidr_req":
            cm_sidr.on_req(self, m, origin)
            return
        rcid = m["rcid"]
        if rcid == 0:
            # A REJ from an active side that gave up before it learnt our id (it went
            # away while its REQ waited here): the child its REQ made.
            rcid = self.by_remote.get((origin, m["lcid"]), 0)
        cid = self.ids.get(rcid)
        if cid is None and m["m"] in ("dreq", "drep"):
            self._after_disconnect(m, origin)
            return
        if cid is None or cid.peer is None or origin not in peer_origins(*cid.peer) \
                or (cid.remote_cid and cid.remote_cid != m["lcid"]) \
                or cm_sidr.wrong_kind(cid, m["m"]):
            self._refuse(origin, f"{m['m']} for no connection of that daemon")
            return
        getattr(self, "_on_" + m["m"])(cid, m)

    def _after_disconnect(self, m: dict, origin) -> None:
        """A DREQ or DREP naming no id here: the end of a disconnect this side is done
        with. Both sides sent a DREQ, each answered the other's and took that as the
        end, and the program destroyed its id before the DREP for its own DREQ came;
        or the id went in DREQ_SENT and the peer's DREQ came after. The IB CM drops
        such a DREP silently (cm_drep_handler) and answers such a DREQ with a DREP
        (cm_dreq_handler's cm_issue_drep), so that the peer's disconnect completes
        at once instead of after its DREQ's resends. Nothing here is refused: a DREP
        changes nothing, and a DREQ's answer only ends the sender's own wait."""
        if m["m"] == "drep":
            self.node.counters["cm_dreps_discarded"] += 1
            return
        self.node.counters["cm_dreqs_answered_after"] += 1
        self._transmit(self._reply_to(origin), {"t": "cm", "m": "drep", "lcid": m["rcid"],
                                                "rcid": m["lcid"], "dev": 0}, b"")

    def _refuse(self, origin, why: str) -> None:
        self.node.counters["cm_messages_refused"] += 1
        log.warning("CM message refused %s", kv(event="cm_refused", origin=str(origin),
                                                 reason=why))

    def _reply_to(self, origin) -> tuple[str, int]:
        host, port = origin
        return ("127.0.0.1" if host == "loopback" else host, port)

    def _on_req(self, m: dict, origin) -> None:
        peer = self._reply_to(origin)
        dup = self.by_remote.get((origin, m["lcid"]))
        if dup is not None:
            c = self.ids.get(dup)
            if c is not None and c.resend is not None and c.state == CMState.REP_SENT:
                self._transmit(c.peer, c.resend["header"], c.resend["data"])
            elif c is not None and c.state == CMState.REQ_RCVD:
                self._send(c, "mra", {})        # our MRA was lost: the REQ came again
            return
        if self.stale_req(m, origin, peer):
            return
        parent, port_listened = self.listener_for(m)
        if parent is None:
            # No listener on the port: the IB CM's invalid service id. One of the other
            # IP version only: rdma_cm's handler refuses the REQ, and the IB CM rejects
            # it as its consumer's (the kernel's answer to an IPv4 REQ at an AFONLY
            # `::` listener).
            reason = proto.REJ_CONSUMER if port_listened else proto.REJ_INVALID_SERVICE_ID
            self._transmit(peer, {"t": "cm", "m": "rej", "lcid": 1, "rcid": m["lcid"],
                                  "dev": 0, "reason": reason}, b"")
            return
        # A full backlog (or no id left for the child) drops the REQ unanswered, as the
        # kernel's ucma and ib_cm do (-ENOMEM: "do not reject, to allow future
        # retries"): the active side sends it again and gets in once there is room,
        # or ends UNREACHABLE.
        child = None
        if len(parent.pending) < parent.backlog:
            try:
                child = self.create_id(parent.owner, parent.ps, listener=parent.handle)
            except RDMAError:
                pass
        if child is None:
            self.node.counters["cm_backlog_drops"] += 1
            return
        addrs = self._take_req(parent, child, peer, origin, m)
        self._send(child, "mra", {})
        self._event(child, "connect_request", listen=parent.handle, qpn=m["qpn"],
                    psn=m["psn"], rr=m["rr"], depth=m["depth"], retry=m["retry"],
                    rnr=m["rnr"], _payload=proto.padded("req", m["private_data"]), **addrs)

    def _take_req(self, parent: CMId, child: CMId, peer, origin, m: dict) -> dict:
        """The new passive id ``child`` of listener ``parent`` takes the request ``m`` (a
        REQ or a SIDR_REQ that came from ``origin``, answered at ``peer``): its peer and
        addresses, REQ_RCVD, pending on the listener until accepted or rejected. Returns
        the addresses its connect_request event carries."""
        child.peer, child.peer_dev, child.remote_cid = peer, m["dev"], m["lcid"]
        # the child's address is the one the REQ names, in its family (an IPv4 REQ at
        # a `::` listener makes an IPv4 id, as the kernel's rdma_cm makes it)
        child.ip, child.port, child.dev = m["dip"], parent.port, parent.dev
        child.peer_ip, child.peer_port = m["sip"], m["sport"]
        child.remote_qpn = m.get("qpn", 0)      # none for a SIDR_REQ: UD has no timewait
        child.to(CMState.REQ_RCVD)
        parent.pending.add(child.handle)
        self.by_remote[(origin, m["lcid"])] = child.handle
        addrs = self._addrs(child)
        addrs.update(sip=m["dip"], sport=m["port"])
        return addrs

    def _on_sidr_rep(self, cid: CMId, m: dict) -> None:
        cm_sidr.on_rep(self, cid, m)

    def _on_rep(self, cid: CMId, m: dict) -> None:
        if cid.state in (CMState.REP_RCVD, CMState.ESTABLISHED) and cid.remote_cid == m["lcid"]:
            if cid.state == CMState.ESTABLISHED:
                self._send(cid, "rtu", {})      # our RTU was lost: the REP came again
            return
        if cid.state != CMState.REQ_SENT:
            return
        self._cancel(cid)
        cid.remote_cid, cid.peer_dev, cid.remote_qpn = m["lcid"], m["dev"], m["qpn"]
        cid.to(CMState.REP_RCVD)
        self._event(cid, "connect_response", qpn=m["qpn"], psn=m["psn"], rr=m["rr"],
                    depth=m["depth"], rnr=m["rnr"],
                    _payload=proto.padded("rep", m["private_data"]), **self._addrs(cid))

    def _on_mra(self, cid: CMId, m: dict) -> None:
        # The peer's consumer has the REQ: wait for its REP (or REJ) for longer, the
        # REQ resent only after that, and the peer's id known from now on.
        if cid.state != CMState.REQ_SENT or cid.resend is None:
            return
        cid.remote_cid = m["lcid"]
        cid.tries = self.timing.max_retries
        self._arm(cid, self.timing.mra_timeout)

    def _on_rej(self, cid: CMId, m: dict) -> None:
        # rdma_cm reports every REJ as REJECTED, its reason the status.
        if cid.state not in (CMState.REQ_SENT, CMState.REQ_RCVD, CMState.REP_SENT):
            return
        self._cancel(cid)
        self._unpend(cid)
        if cid.state == CMState.REQ_SENT and m["reason"] == proto.REJ_INVALID_SERVICE_ID:
            self.explain(cid, "rejected", cm_addresses.why_rejected(self, cid))
        cid.to(CMState.DISCONNECTED)
        self._event(cid, "rejected", status=m["reason"],
                    _payload=proto.padded("rej", m["private_data"]))

    def _on_rtu(self, cid: CMId, m: dict) -> None:
        if cid.state != CMState.REP_SENT:
            return
        self._cancel(cid)
        cid.to(CMState.ESTABLISHED)
        self._event(cid, "established")

    def _on_dreq(self, cid: CMId, m: dict) -> None:
        # Answered whatever the state (a DREQ resent after our DREP was lost).
        self._send(cid, "drep", {})
        if cid.state in (CMState.ESTABLISHED, CMState.REP_SENT, CMState.REP_RCVD,
                         CMState.DREQ_SENT):
            self._cancel(cid)
            cid.to(CMState.DISCONNECTED)
            self._event(cid, "disconnected")
            self.enter_timewait(cid)    # our DREP answered it: the disconnect is done

    def _on_drep(self, cid: CMId, m: dict) -> None:
        if cid.state != CMState.DREQ_SENT:
            return
        self._cancel(cid)
        cid.to(CMState.DISCONNECTED)
        self._event(cid, "disconnected")
        self.enter_timewait(cid)
