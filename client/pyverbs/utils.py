"""pyverbs.utils: text helpers for GIDs, QP types and states, MTUs and access flags."""

from __future__ import annotations

from . import enums as e
from .pyverbs_error import PyverbsUserError


def gid_str(subnet_prefix, interface_id):
    raw = int(subnet_prefix).to_bytes(8, "little") + int(interface_id).to_bytes(8, "little")
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def gid_str_to_array(val):
    text = val.replace(":", "")
    if len(text) != 32:
        raise PyverbsUserError(f"Invalid GID value ({val})")
    return [text[i:i + 2] for i in range(0, 32, 2)]


def _name(enum_cls, value, prefix):
    try:
        return enum_cls(value).name.removeprefix(prefix)
    except ValueError:
        return f"Invalid value {value}"


def qp_type_to_str(qp_type):
    return _name(e.ibv_qp_type, qp_type, "IBV_QPT_")


def qp_state_to_str(qp_state):
    return _name(e.ibv_qp_state, qp_state, "IBV_QPS_")


def mtu_to_str(mtu):
    return f"{128 << mtu}" if 1 <= mtu <= 5 else f"Invalid MTU {mtu}"


def access_flags_to_str(flags):
    return " ".join(m.name.removeprefix("IBV_ACCESS_") for m in e.ibv_access_flags
                    if flags & m.value)


def mig_state_to_str(mig):
    return _name(e.ibv_mig_state, mig, "IBV_MIG_")


def rereg_error_to_str(error):
    return _name(e.ibv_rereg_mr_err_code, error, "IBV_REREG_MR_ERR_")
