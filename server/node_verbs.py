"""The requests of a control session that concern the daemon rather than the session's
own objects: fault rules (server/faults.py), the daemon's counters and subscriptions to
pushed events (server/taps.py).

Each handler is a function of the session's ``Verbs`` (server/verbs.py: its ``daemon``,
``session`` and ``peer``), the request and its id, named in this module's ``HANDLERS`` as
every handler module names its own.
"""

from __future__ import annotations

from ..protocol import control
from .logs import kv, log


def op_faults_add(v, r: control.FaultsAdd, rid: int) -> dict | None:
    # A session's rule matches its own QPs and goes with it; one that
    # reaches every session's traffic is asked for by name.
    wide = r.daemon_wide
    rule = v.daemon.faults.add(r.rule, owner=None if wide else v.session)
    log.info("fault rule added %s", kv(event="fault_add", peer=v.peer, id=rule.id,
                                        daemon_wide=wide, rule=rule.spec))
    return {"rule": rule.as_dict()}


def op_faults_list(v, r: control.FaultsList, rid: int) -> dict | None:
    return {"rules": v.daemon.faults.list(v.session)}


def op_faults_clear(v, r: control.FaultsClear, rid: int) -> dict | None:
    n = v.daemon.faults.clear(r.rule_id, v.session, r.daemon_wide)
    log.info("fault rules cleared %s", kv(event="fault_clear", peer=v.peer, n=n))
    return {"cleared": n}


def op_subscribe(v, r: control.Subscribe, rid: int) -> dict | None:
    kinds = set(r.events)
    v.daemon.events.subscribe(v.session, kinds, r.daemon_wide)
    if r.daemon_wide and kinds:
        log.info("daemon-wide tap %s", kv(event="subscribe_daemon_wide", peer=v.peer,
                                           kinds=",".join(sorted(kinds))))
    return {"events": sorted(kinds), "daemon_wide": r.daemon_wide}


def op_counters(v, r: control.Counters, rid: int) -> dict | None:
    # The daemon's counters, and the events this session's subscriptions lost
    # because it did not read them fast enough (server/session.py push).
    return {"counters": {**v.daemon.stats(),
                         "events_dropped": v.session.events_dropped}}


HANDLERS = {
    control.FaultsAdd: op_faults_add,
    control.FaultsList: op_faults_list,
    control.FaultsClear: op_faults_clear,
    control.Subscribe: op_subscribe,
    control.Counters: op_counters,
}
