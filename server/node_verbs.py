"""The requests of a control session that concern the daemon rather than the session's
own objects: fault rules (server/faults.py), the daemon's counters and subscriptions to
pushed events (server/taps.py).

``NodeVerbs`` is mixed into server/verbs.py's ``Verbs`` (its ``daemon``, ``session`` and
``peer``); its handlers are in server/verbs.py's ``HANDLERS`` with the others.
"""

from __future__ import annotations

from ..protocol import control
from .logs import kv, log


class NodeVerbs:
    """The handlers of a session's requests about the daemon."""

    def op_faults_add(self, r: control.FaultsAdd, rid: int) -> dict | None:
        # A session's rule matches its own QPs and goes with it; one that
        # reaches every session's traffic is asked for by name.
        wide = r.daemon_wide
        rule = self.daemon.faults.add(r.rule, owner=None if wide else self.session)
        log.info("fault rule added %s", kv(event="fault_add", peer=self.peer, id=rule.id,
                                            daemon_wide=wide, rule=rule.spec))
        return {"rule": rule.as_dict()}

    def op_faults_list(self, r: control.FaultsList, rid: int) -> dict | None:
        return {"rules": self.daemon.faults.list(self.session)}

    def op_faults_clear(self, r: control.FaultsClear, rid: int) -> dict | None:
        n = self.daemon.faults.clear(r.rule_id, self.session, r.daemon_wide)
        log.info("fault rules cleared %s", kv(event="fault_clear", peer=self.peer, n=n))
        return {"cleared": n}

    def op_subscribe(self, r: control.Subscribe, rid: int) -> dict | None:
        kinds = set(r.events)
        self.daemon.events.subscribe(self.session, kinds, r.daemon_wide)
        if r.daemon_wide and kinds:
            log.info("daemon-wide tap %s", kv(event="subscribe_daemon_wide", peer=self.peer,
                                               kinds=",".join(sorted(kinds))))
        return {"events": sorted(kinds), "daemon_wide": r.daemon_wide}

    def op_counters(self, r: control.Counters, rid: int) -> dict | None:
        # The daemon's counters, and the events this session's subscriptions lost
        # because it did not read them fast enough (server/session.py push).
        return {"counters": {**self.daemon.stats(),
                             "events_dropped": self.session.events_dropped}}
