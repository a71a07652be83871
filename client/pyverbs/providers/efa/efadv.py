"""pyverbs.providers.efa.efadv: softhca hosts no EFA devices; every EFA object is
EOPNOTSUPP."""

from ..._objects import attributes, unmodelled
from ...addr import AH
from ...cq import CQEX
from ...device import Context
from ...qp import QP, QPEx

_WHAT = "EFA devices"
EfaContext = unmodelled("EfaContext", _WHAT, Context)
EfaAH = unmodelled("EfaAH", _WHAT, AH)
SRDQP = unmodelled("SRDQP", _WHAT, QP)
SRDQPEx = unmodelled("SRDQPEx", _WHAT, QPEx)
EfaCQ = unmodelled("EfaCQ", _WHAT, CQEX)
EfaDVDeviceAttr = attributes("EfaDVDeviceAttr")
EfaDVAHAttr = attributes("EfaDVAHAttr")
EfaQPInitAttr = attributes("EfaQPInitAttr")
EfaDVCQInitAttr = attributes("EfaDVCQInitAttr")
