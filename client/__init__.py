"""softhca.client: the application's API, pyverbs-shaped and awaited (docs/api.md).

``import softhca.client as sh`` gives the verbs objects (``sh.connect``, ``sh.embedded``),
the records (``sh.SendWR``, ``sh.SGE``, ``sh.QPInitAttr``, ``sh.Mlx5SigBlockAttr``, ...),
the one exception type ``sh.RDMAError`` (``errno_name``, ``message``) and every enum
under its C name with its C value (``sh.IBV_ACCESS_REMOTE_READ``, ``sh.IBV_WC_SUCCESS``).
"""

from ..protocol import attrs
from ..protocol.attrs import *  # noqa: F403 - the attribute records, as pyverbs names them
from ..protocol.enums import *  # noqa: F403 - the C names, as verbs.h / mlx5dv.h
from ..protocol.enums import C_NAMES
from ..protocol.errors import RDMAError
from .api import (
    CQ,
    DEK,
    MR,
    MW,
    PD,
    QP,
    WC,
    AsyncEvent,
    Context,
    CryptoLogin,
    Event,
    Faults,
    MKey,
    MkeyErr,
    Node,
    QPAttr,
    QPCap,
    QPInfo,
    QPInitAttr,
    RecvWR,
    SendWR,
    SigErr,
    Subscription,
    bind_wr,
    connect,
    embedded,
    route_address,
)

# pyverbs' names for the mlx5dv attribute structs.
Mlx5MkeyConfAttr = attrs.MkeyConfAttr
Mlx5SigBlockAttr = attrs.SigBlockAttr
Mlx5SigBlockDomain = attrs.SigBlockDomain
Mlx5SigCrc = attrs.SigCrc
Mlx5SigT10Dif = attrs.SigT10dif
Mlx5SigT10dif = attrs.SigT10dif
Mlx5MrInterleaved = attrs.MrInterleaved
Mlx5CryptoAttr = attrs.CryptoAttr
Mlx5DEKInitAttr = attrs.DEKInitAttr
PyverbsRDMAError = RDMAError

__all__ = [
    "AsyncEvent", "CQ", "CryptoLogin", "DEK", "MR", "PD", "QP", "WC", "Context", "Event", "Subscription", "Faults", "MKey",
    "MW", "MkeyErr", "Mlx5CryptoAttr", "Mlx5DEKInitAttr", "Mlx5MkeyConfAttr", "Mlx5MrInterleaved",
    "Mlx5SigBlockAttr", "Mlx5SigBlockDomain", "Mlx5SigCrc", "Mlx5SigT10Dif", "Mlx5SigT10dif",
    "Node", "PyverbsRDMAError", "QPAttr", "QPCap", "QPInfo", "QPInitAttr", "RDMAError",
    "RecvWR", "SendWR", "SigErr", "bind_wr", "connect", "embedded", "route_address", *attrs.__all__,
    *C_NAMES,
]
