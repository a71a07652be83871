"""The RC QP state machine: which ibv_modify_qp transitions exist and which attributes
each requires and allows (``TRANSITIONS``), each attribute's value rule (``VALUES``), the
states in which each verb may be called (``VERBS``) and in which each role of the QP
works (``SENDING``, ``RECEIVING``), and the IBTA encodings of the attributes' timers.

Required attributes are ibv_modify_qp(3)'s table for IBV_QPT_RC (RESET -> INIT -> RTR
-> RTS); the optional ones and the other transitions (RTS -> RTS, RTS -> SQD, SQD ->
RTS, SQD -> SQD, to RESET and ERR from anywhere) are the kernel's ``qp_state_table``
that ``ib_modify_qp_is_ok`` checks every modify against. RC never enters SQE (only UD
and UC send queues fail into it), so no transition leads there.

Leniency, kept from softhca's client (``QP.connect`` sends no P_Key index, port or
access flags, and older clients no rd_atomic limits): a required attribute in
``KEPT_IF_ABSENT`` may be left out; the QP keeps the value it has (from ibv_create_qp,
an earlier modify, or the defaults here). The ones the QP cannot do without (the
peer's address vector, path MTU, destination QP number and both PSNs but sq_psn,
which is 0 unless given) are required as the man page says.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.enums import Mtu
from ..protocol.enums import QpAttrMask as M
from ..protocol.enums import QpState as S
from ..protocol.errors import einval, eopnotsupp
from ..protocol.opcodes import RNR_TIMER_MS


@dataclass(frozen=True)
class Transition:
    required: M
    optional: M = M(0)


_NONE = M(0)
_RTS_OPTIONAL = M.CUR_STATE | M.ACCESS_FLAGS | M.ALT_PATH | M.PATH_MIG_STATE | M.MIN_RNR_TIMER

# (current state, next state) -> the attributes besides IBV_QP_STATE.
TRANSITIONS: dict[tuple[S, S], Transition] = {
    (S.RESET, S.INIT): Transition(M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
    (S.INIT, S.INIT): Transition(_NONE, M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
    (S.INIT, S.RTR): Transition(
        M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER,
        M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX),
    (S.RTR, S.RTS): Transition(
        M.SQ_PSN | M.MAX_QP_RD_ATOMIC | M.RETRY_CNT | M.RNR_RETRY | M.TIMEOUT,
        _RTS_OPTIONAL),
    (S.RTS, S.RTS): Transition(_NONE, _RTS_OPTIONAL),
    # The send queue drains: WRs already started finish, no new one starts.
    (S.RTS, S.SQD): Transition(_NONE, M.EN_SQD_ASYNC_NOTIFY),
    (S.SQD, S.RTS): Transition(_NONE, _RTS_OPTIONAL),
    (S.SQD, S.SQD): Transition(_NONE, M.PKEY_INDEX | M.PORT | M.AV | M.ALT_PATH
                               | M.ACCESS_FLAGS | M.MIN_RNR_TIMER | M.PATH_MIG_STATE
                               | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY
                               | M.MAX_QP_RD_ATOMIC | M.MAX_DEST_RD_ATOMIC),
    **{(s, S.RESET): Transition(_NONE) for s in S if s != S.SQE},
    **{(s, S.ERR): Transition(_NONE) for s in S if s != S.SQE},
}

# Required attributes softhca lets a client leave out (see the module docstring).
KEPT_IF_ABSENT = (M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS | M.MAX_DEST_RD_ATOMIC
                  | M.MIN_RNR_TIMER | M.SQ_PSN | M.MAX_QP_RD_ATOMIC | M.RETRY_CNT
                  | M.RNR_RETRY | M.TIMEOUT)

# Attributes of struct ibv_qp_attr that name no modelled feature: automatic path
# migration (alternate path, migration state) and resizing the queues.
NOT_MODELLED = M.ALT_PATH | M.PATH_MIG_STATE | M.CAP

# The struct ibv_qp_attr field each mask bit applies. AV is the peer's address: on this
# wire, a daemon's dest_host and dest_port (and optionally dest_dev).
FIELDS: dict[M, str] = {
    M.STATE: "qp_state", M.CUR_STATE: "cur_qp_state",
    M.EN_SQD_ASYNC_NOTIFY: "en_sqd_async_notify", M.ACCESS_FLAGS: "qp_access_flags",
    M.PKEY_INDEX: "pkey_index", M.PORT: "port_num", M.QKEY: "qkey",
    M.AV: "dest_host/dest_port",
    M.PATH_MTU: "path_mtu", M.TIMEOUT: "timeout", M.RETRY_CNT: "retry_cnt",
    M.RNR_RETRY: "rnr_retry", M.RQ_PSN: "rq_psn", M.MAX_QP_RD_ATOMIC: "max_rd_atomic",
    M.ALT_PATH: "alt_ah_attr", M.MIN_RNR_TIMER: "min_rnr_timer", M.SQ_PSN: "sq_psn",
    M.MAX_DEST_RD_ATOMIC: "max_dest_rd_atomic", M.PATH_MIG_STATE: "path_mig_state",
    M.CAP: "cap", M.DEST_QPN: "dest_qp_num",
}
AV_FIELDS = ("dest_host", "dest_port")
# What a QP has before a modify gives them: the client's defaults (QP.connect).
DEFAULT_TIMEOUT = 17          # 4.096 us * 2^17, about half a second
DEFAULT_MIN_RNR_TIMER = 12    # 0.64 ms
# "Infinite" as a deadline a timer can still be armed with.
INFINITE_S = 1e9


def mask_of(attr: dict) -> M:
    """The attr_mask of the ibv_qp_attr fields present in ``attr`` (AV: both of the
    peer's dest_host and dest_port)."""
    mask = M(0)
    for bit, name in FIELDS.items():
        if name in attr:
            mask |= bit
    if all(name in attr for name in AV_FIELDS):
        mask |= M.AV
    return mask


def names(mask: int) -> str:
    """``mask`` as its fields and IBV_QP_* names, for an error message."""
    return ", ".join(f"{FIELDS[bit]} (IBV_QP_{bit.name})" for bit in FIELDS if mask & bit)


def ack_timeout_s(timeout: int) -> float:
    """ibv_modify_qp(3): the local ACK timeout is 4.096 us * 2^timeout; 0 means infinite."""
    return 4.096e-6 * (1 << timeout) if timeout else INFINITE_S


def rnr_timer_s(code: int) -> float:
    """The RNR NAK timer of min_rnr_timer code ``code`` (IBTA 9.7.5.2.8), in seconds."""
    return RNR_TIMER_MS[code] / 1000


def rnr_timer_code(seconds: float) -> int:
    """The code of the shortest RNR NAK timer of at least ``seconds`` (exactly a code's
    own time for a QP given min_rnr_timer; the longest, 0, past 655.36 ms)."""
    fits = [c for c in range(1, 32) if RNR_TIMER_MS[c] / 1000 >= seconds - 1e-12]
    return fits[0] if fits else 0


# The attributes whose values RCQP.modify checks and applies (AV is the daemon's).
_APPLIED = (M.STATE | M.CUR_STATE | M.PATH_MTU
            | M.DEST_QPN | M.RQ_PSN | M.SQ_PSN
            | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY
            | M.MIN_RNR_TIMER | M.MAX_QP_RD_ATOMIC
            | M.MAX_DEST_RD_ATOMIC | M.ACCESS_FLAGS
            | M.PKEY_INDEX | M.PORT | M.QKEY)


def _uint(bits: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << bits


def _is_mtu(v) -> bool:
    try:
        Mtu(v)
    except ValueError:
        return False
    return True


# Each attribute's value rule (ibv_modify_qp(3); IBTA field widths) and its words.
VALUES: dict[M, tuple] = {
    M.PATH_MTU: (_is_mtu, "is not an enum ibv_mtu value"),
    M.DEST_QPN: (_uint(24), "is not a QP number"),
    M.RQ_PSN: (_uint(24), "is not a 24-bit PSN"),
    M.SQ_PSN: (_uint(24), "is not a 24-bit PSN"),
    M.TIMEOUT: (_uint(5), "is not a 5-bit code"),
    M.MIN_RNR_TIMER: (_uint(5), "is not a 5-bit code"),
    M.RETRY_CNT: (_uint(3), "must be 0..7"),
    M.RNR_RETRY: (_uint(3), "must be 0..7"),
    # Zero would let no READ or atomic ever go: the WR would wait forever.
    M.MAX_QP_RD_ATOMIC: (lambda v: _uint(8)(v) and v >= 1, "must be 1..255"),
    M.MAX_DEST_RD_ATOMIC: (_uint(8), "must be 0..255"),
    M.ACCESS_FLAGS: (_uint(32), "is not an access flags word"),
    # One port, one P_Key.
    M.PKEY_INDEX: (lambda v: v == 0, "must be 0 (one P_Key)"),
    M.PORT: (lambda v: v == 1, "must be 1 (one port)"),
    M.EN_SQD_ASYNC_NOTIFY: (_uint(1), "must be 0 or 1"),
    M.QKEY: (_uint(32), "is not a 32-bit Q_Key"),
}


def check(cur: S, attr: dict, attr_mask: int, table: dict | None = None,
          kept: M = KEPT_IF_ABSENT, qp_type: str = "an RC") -> tuple[S, dict[M, object]]:
    """The next state and the attribute values of ibv_modify_qp(``attr``, ``attr_mask``)
    on a QP in ``cur``: EINVAL for a transition the table lacks, a missing or foreign
    attribute or a bad value, EOPNOTSUPP for an attribute of an unmodelled feature.
    ``table`` and ``kept`` are another QP type's TRANSITIONS and KEPT_IF_ABSENT
    (engine/datagram.py's UD and UC tables)."""
    mask = M(attr_mask)
    values = {bit: attr[name] for bit, name in FIELDS.items()
              if mask & bit and name in attr}
    lacking = [FIELDS[bit] for bit in _APPLIED if mask & bit and bit not in values]
    if lacking:
        raise einval(f"ibv_modify_qp: attr_mask names {', '.join(lacking)} but attr has "
                     "no value for it")
    if mask & M.CUR_STATE and values[M.CUR_STATE] != cur:
        raise einval(f"ibv_modify_qp: cur_qp_state {values[M.CUR_STATE]} is not "
                     f"the QP's state {cur.name}")
    try:
        nxt = S(values[M.STATE]) if mask & M.STATE else cur
    except ValueError:
        raise einval(f"ibv_modify_qp: qp_state {values[M.STATE]!r} is not an "
                     "enum ibv_qp_state value") from None
    step = f"ibv_modify_qp {cur.name} -> {nxt.name}"
    t = (TRANSITIONS if table is None else table).get((cur, nxt))
    if t is None:
        raise einval(f"{step} is not a transition of {qp_type} QP (ibv_modify_qp(3))")
    given = mask & ~M.STATE
    missing = t.required & ~given & ~kept
    if missing:
        raise einval(f"{step} needs {names(missing)}")
    extra = given & ~(t.required | t.optional)
    if extra:
        raise einval(f"{step} does not take {names(extra)}")
    if given & NOT_MODELLED:
        raise eopnotsupp(f"{step}: {names(given & NOT_MODELLED)} not modelled")
    for bit, value in values.items():
        rule = VALUES.get(bit)
        if rule is not None and not rule[0](value):
            raise einval(f"{step}: {FIELDS[bit]} {value!r} {rule[1]}")
    return nxt, values


# -- the states in which the QP works ---------------------------------------------------

# The states in which the requester works (SQD: it finishes what it started), and in
# which arriving packets are taken at all (IBTA: a QP in RESET, INIT or ERR silently
# drops them).
SENDING = (S.RTS, S.SQD)
RECEIVING = (S.RTR, S.RTS, S.SQD)


@dataclass(frozen=True)
class VerbRule:
    """The QP states in which a verb acts; ``flushes``: in ERR it takes its WR and
    completes it WR_FLUSH_ERR at once instead of refusing it."""

    states: tuple[S, ...]
    flushes: bool = False


VERBS: dict[str, VerbRule] = {
    # ibv_post_send(3): the send queue takes WRs in RTS, and in SQD, where they wait.
    "ibv_post_send": VerbRule(SENDING, flushes=True),
    "ibv_post_recv": VerbRule((S.INIT, S.RTR, S.RTS, S.SQD), flushes=True),
    # mlx5dv_wr_mkey_configure goes through the QP's send queue, started in RTS.
    "ibv_wr_mkey_configure": VerbRule((S.RTS,), flushes=True),
    # mlx5dv_qp_cancel_posted_send_wrs(3): "the QP must be in SQD state".
    "mlx5dv_qp_cancel_posted_send_wrs": VerbRule((S.SQD,)),
}


def require(verb: str, state: S) -> bool:
    """Whether ``verb`` acts on a QP in ``state``: True; False when the QP is in ERR and
    the verb's WR is to complete WR_FLUSH_ERR; EINVAL in any other state it lacks."""
    rule = VERBS[verb]
    if state in rule.states:
        return True
    if rule.flushes and state == S.ERR:
        return False
    raise einval(f"{verb} needs the QP in {'/'.join(s.name for s in rule.states)}, "
                 f"it is in {S(state).name}")
