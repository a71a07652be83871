"""softhca.client: the application's API, pyverbs-shaped and awaited (docs/api.md).

``import softhca.client as sh`` gives the verbs objects (``sh.connect``, ``sh.embedded``),
the records (``sh.SendWR``, ``sh.SGE``, ``sh.QPInitAttr``, ``sh.Mlx5SigBlockAttr``, ...),
the one exception type ``sh.RDMAError`` (``errno_name``, ``message``) and every enum
under its C name with its C value (``sh.IBV_ACCESS_REMOTE_READ``, ``sh.IBV_WC_SUCCESS``).
"""

from ..protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    MkeyConfAttr,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from ..protocol.enums import *  # noqa: F403 - the C names, as verbs.h / mlx5dv.h
from ..protocol.enums import C_NAMES
from ..protocol.errors import RDMAError
from .api import (
    CQ,
    DEK,
    MR,
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
    connect,
    embedded,
)

# pyverbs' names for the mlx5dv attribute structs.
Mlx5MkeyConfAttr = MkeyConfAttr
Mlx5SigBlockAttr = SigBlockAttr
Mlx5SigBlockDomain = SigBlockDomain
Mlx5SigCrc = SigCrc
Mlx5SigT10Dif = SigT10dif
Mlx5SigT10dif = SigT10dif
Mlx5MrInterleaved = MrInterleaved
Mlx5CryptoAttr = CryptoAttr
Mlx5DEKInitAttr = DEKInitAttr
PyverbsRDMAError = RDMAError

__all__ = [
    "AsyncEvent", "CQ", "CryptoLogin", "DEK", "MR", "PD", "QP", "SGE", "WC", "Context", "CryptoAttr", "Event", "Subscription", "Faults", "DEKInitAttr", "MKey",
    "MkeyConfAttr", "MkeyErr", "Mlx5CryptoAttr", "Mlx5DEKInitAttr", "Mlx5MkeyConfAttr",
    "Mlx5MrInterleaved", "Mlx5SigBlockAttr", "Mlx5SigBlockDomain", "Mlx5SigCrc", "Mlx5SigT10Dif",
    "Mlx5SigT10dif", "MrInterleaved", "Node", "PyverbsRDMAError", "QPAttr", "QPCap", "QPInfo",
    "QPInitAttr", "RDMAError", "RecvWR", "SendWR", "SigBlockAttr", "SigBlockDomain", "SigCrc",
    "SigErr", "SigT10dif", "connect", "embedded", *C_NAMES,
]
