"""pyverbs.cq: completion queues, work completions, the extended CQ's polling API."""

from __future__ import annotations

import errno

from . import _sync
from . import enums as e
from ._objects import Record, Resource, unmodelled, unsupported
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .wr import host_to_be32_field

CompChannel = unmodelled("CompChannel", "Completion channels (ibv_create_comp_channel)")


class WC(Record):
    """struct ibv_wc; ``imm_data`` holds the C field's ``__be32`` bits (and, with
    IBV_WC_WITH_INV, the invalidated rkey that shares it)."""

    _fields = (("wr_id", 0), ("status", 0), ("opcode", 0), ("vendor_err", 0), ("byte_len", 0),
               ("qp_num", 0), ("src_qp", 0), ("imm_data", 0), ("wc_flags", 0),
               ("pkey_index", 0), ("slid", 0), ("sl", 0), ("dlid_path_bits", 0))

    def __str__(self):
        return (f"WC(wr_id={self.wr_id}, status={self.status}, opcode={self.opcode}, "
                f"byte_len={self.byte_len}, qp_num={self.qp_num:#x})")


def _wc(w) -> WC:
    if w.wc_flags & e.IBV_WC_WITH_INV:
        imm = w.invalidated_rkey
    elif w.imm_data is not None:
        imm = host_to_be32_field(w.imm_data)
    else:
        imm = 0
    return WC(wr_id=w.wr_id, status=int(w.status), opcode=int(w.opcode),
              vendor_err=w.vendor_err, byte_len=w.byte_len, qp_num=w.qp_num,
              imm_data=imm, wc_flags=w.wc_flags)


class _CQBase(Resource):
    def _create(self, context, cqe):
        from .device import Context

        if not isinstance(context, Context):
            raise PyverbsUserError("A CQ is created on a Context")
        context._check()
        cqe = int(cqe)
        limit = context._raw_attr().get("max_cqe", 0)
        if not 1 <= cqe <= limit:
            raise PyverbsRDMAError(f"Failed to create CQ: cqe {cqe} is outside 1..{limit} "
                                   "(the device's max_cqe)", errno.EINVAL)
        self.context = context
        self._cqe = cqe
        self._adopt(context, _sync.run(context._actx.create_cq(cqe), "Failed to create CQ"))

    def _dependents(self):
        return [c for c in list(self._ctx._children)
                if self in (getattr(c, "_scq", None), getattr(c, "_rcq", None))]

    def _poll(self, n: int) -> list[WC]:
        if self._obj is None:
            raise PyverbsUserError("The CQ is closed")
        return [_wc(w) for w in _sync.run(self._obj.poll(n), "Failed to poll CQ")]

    @property
    def cqe(self):
        return self._cqe

    @property
    def comp_channel(self):
        return None


def _check_vector(context, comp_vector):
    if not 0 <= comp_vector < context.num_comp_vectors:
        raise PyverbsRDMAError(f"Failed to create CQ: comp_vector {comp_vector} is outside "
                               f"0..{context.num_comp_vectors - 1}", errno.EINVAL)


class CQ(_CQBase):
    """ibv_create_cq(3). ``poll`` returns ``(npolled, wcs)`` as pyverbs does."""

    def __init__(self, context, cqe, cq_context=None, channel=None, comp_vector=0):
        super().__init__()
        if channel is not None:
            raise unsupported("Completion channels")
        _check_vector(context, comp_vector)
        self._create(context, cqe)

    def poll(self, num_entries=1):
        wcs = self._poll(num_entries)
        return len(wcs), wcs

    def req_notify(self, solicited_only=False):
        raise unsupported("Completion events (ibv_req_notify_cq)")

    def ack_events(self, num_events):
        raise unsupported("Completion events (ibv_ack_cq_events)")

    def resize(self, cqe):
        raise unsupported("ibv_resize_cq")


class CqInitAttrEx(Record):
    _fields = (("cqe", 100), ("channel", None), ("comp_vector", 0),
               ("wc_flags", 0), ("comp_mask", 0), ("flags", 0), ("parent_domain", None))

    @property
    def comp_channel(self):
        return self.channel


class PollCqAttr(Record):
    _fields = (("comp_mask", 0),)


class WcTmInfo(Record):
    _fields = (("tag", 0), ("priv", 0))


# ibv_create_cq_ex(3): the fields a softhca completion carries. The LID fields of
# IBV_WC_STANDARD_FLAGS are part of it: on a RoCE port they read 0, as on any RoCE device.
_WC_FLAGS = e.IBV_WC_STANDARD_FLAGS


class CQEX(_CQBase):
    """ibv_create_cq_ex(3): start_poll / poll_next / end_poll and the read_* accessors
    over the same completions. start_poll and poll_next return ENOENT (2) when the CQ is
    empty, as the C calls do."""

    def __init__(self, context, init_attr=None):
        super().__init__()
        init_attr = init_attr or CqInitAttrEx()
        if init_attr.channel is not None:
            raise unsupported("Completion channels")
        if init_attr.parent_domain is not None:
            raise unsupported("Parent domains")
        extra = init_attr.wc_flags & ~_WC_FLAGS
        if extra:
            raise unsupported(f"ibv_create_cq_ex wc_flags {extra:#x} (completion timestamps, "
                              "flow tags, CVLAN, tag matching)")
        if init_attr.flags or init_attr.comp_mask & ~(e.IBV_CQ_INIT_ATTR_MASK_FLAGS
                                                      | e.IBV_CQ_INIT_ATTR_MASK_PD):
            raise unsupported("ibv_create_cq_ex flags")
        self._wc = None
        _check_vector(context, init_attr.comp_vector)
        self._create(context, init_attr.cqe)

    def _next(self):
        wcs = self._poll(1)
        if not wcs:
            self._wc = None
            return errno.ENOENT
        self._wc = wcs[0]
        return 0

    def start_poll(self, attr):
        return self._next()

    def poll_next(self):
        return self._next()

    def end_poll(self):
        self._wc = None

    def _cur(self) -> WC:
        if self._wc is None:
            raise PyverbsUserError("No completion is being polled (call start_poll first)")
        return self._wc

    @property
    def status(self):
        return self._cur().status

    @status.setter
    def status(self, val):
        self._cur().status = val

    @property
    def wr_id(self):
        return self._cur().wr_id

    @wr_id.setter
    def wr_id(self, val):
        self._cur().wr_id = val

    def read_opcode(self):
        return self._cur().opcode

    def read_vendor_err(self):
        return self._cur().vendor_err

    def read_byte_len(self):
        return self._cur().byte_len

    def read_imm_data(self):
        return self._cur().imm_data

    def read_qp_num(self):
        return self._cur().qp_num

    def read_src_qp(self):
        return self._cur().src_qp

    def read_wc_flags(self):
        return self._cur().wc_flags

    def _unmodelled_read(self, what):
        raise unsupported(what)

    def read_slid(self):
        self._cur()
        return 0

    def read_sl(self):
        self._cur()
        return 0

    def read_dlid_path_bits(self):
        self._cur()
        return 0

    def read_timestamp(self):
        return self._unmodelled_read("Completion timestamps")

    def read_completion_wallclock_ns(self):
        return self._unmodelled_read("Completion timestamps")

    def read_cvlan(self):
        return self._unmodelled_read("CVLAN stripping")

    def read_flow_tag(self):
        return self._unmodelled_read("Flow tags")

    def read_tm_info(self):
        return self._unmodelled_read("Tag matching")


def cqe_status_to_str(status):
    try:
        return e.ibv_wc_status(status).name
    except ValueError:
        return f"Unknown status {status}"


def cqe_opcode_to_str(opcode):
    try:
        return e.ibv_wc_opcode(opcode).name
    except ValueError:
        return f"Unknown opcode {opcode}"
