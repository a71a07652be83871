"""pyverbs.cq: completion queues, work completions, the extended CQ's polling API."""

from __future__ import annotations

import errno

from . import _sync
from . import enums as e
from ._objects import Record, Resource, check_alloc_type, unsupported
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .wr import host_to_be32_field

# How long ibv_get_cq_event's wait is, per request to the daemon (it loops).
EVENT_WAIT = 60.0


class CompChannel(Resource):
    """ibv_create_comp_channel(3). softhca's daemon pushes completions, not completion
    events; the channel waits for a completion pushed to an armed CQ instead, and keeps
    it in the CQ for the next poll, so nothing is lost. One difference: a CQ armed while it already holds completions reports an
    event at once, where a hardware CQ would wait for the next one."""

    def __init__(self, context):
        super().__init__()
        from .device import Context

        if not isinstance(context, Context):
            raise PyverbsUserError("A completion channel is created on a Context")
        context._check()
        self.context = context
        self._ctx = context
        self._obj = True       # nothing to destroy in the daemon
        context._children.add(self)

    def close(self):
        self._obj = None

    def __del__(self):
        self._obj = None

    def get_cq_event(self, expected_cq):
        """ibv_get_cq_event(3): waits for an event of ``expected_cq`` (armed with
        req_notify), then disarms it, as the C call does."""
        cq = expected_cq
        if cq.comp_channel is not self:
            raise PyverbsUserError("The CQ is not bound to this completion channel")
        if cq._ctx._node is not None:
            _sync.refuse_inherited(cq._ctx._node, "Failed to get CQ event")
        if not cq._armed:
            raise PyverbsRDMAError("Failed to get CQ event: the CQ is not armed "
                                   "(ibv_req_notify_cq)", errno.EINVAL)
        while not cq._stash:
            cq._stash.extend(cq._poll_daemon(1, EVENT_WAIT))
        cq._armed = False
        cq._events += 1


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
              imm_data=imm, wc_flags=w.wc_flags, src_qp=w.src_qp)


def cqe_size(requested=None) -> int:
    """The CQE size of a new CQ as the mlx5 provider picks it: mlx5dv's cqe_size when
    given, else MLX5_CQE_SIZE from the environment, else 64; anything but 64 or 128 is
    EINVAL. It is the layout of hardware CQEs in memory: softhca's polled completions
    are the same either way, so both sizes are accepted and have no other effect."""
    import os

    size = requested
    if size is None:
        env = os.environ.get("MLX5_CQE_SIZE")
        try:
            size = int(env) if env else 64
        except ValueError:
            size = 0
    if size not in (64, 128):
        raise PyverbsRDMAError(f"Failed to create CQ: CQE size {size} is not 64 or 128",
                               errno.EINVAL)
    return size


class _CQBase(Resource):
    def _create(self, context, cqe, size=None):
        from .device import Context

        if not isinstance(context, Context):
            raise PyverbsUserError("A CQ is created on a Context")
        context._check()
        self.cqe_size = cqe_size(size)
        cqe = int(cqe)
        limit = context._raw_attr().get("max_cqe", 0)
        if not 1 <= cqe <= limit:
            raise PyverbsRDMAError(f"Failed to create CQ: cqe {cqe} is outside 1..{limit} "
                                   "(the device's max_cqe)", errno.EINVAL)
        check_alloc_type("MLX_CQ", "CQ")
        self.context = context
        self._cqe = cqe
        self._stash: list[WC] = []
        self._adopt(context, _sync.run(context._actx.create_cq(cqe), "Failed to create CQ"))

    def _dependents(self):
        return [c for c in list(self._ctx._children)
                if self in (getattr(c, "_scq", None), getattr(c, "_rcq", None))]

    _channel = None
    _armed = False
    _events = 0

    def _poll_daemon(self, n: int, timeout: float = 0.0) -> list[WC]:
        if self._obj is None:
            raise PyverbsUserError("The CQ is closed")
        return [_wc(w) for w in _sync.run(self._obj.poll(n, timeout), "Failed to poll CQ")]

    def _poll(self, n: int) -> list[WC]:
        if self._stash and self._ctx._node is not None:
            # A fork child's copy of its parent's taken completions is not its own.
            _sync.refuse_inherited(self._ctx._node, "Failed to poll CQ")
        # Completions a completion channel's wait took out first, in order.
        out, self._stash[:] = self._stash[:n], self._stash[n:]
        if len(out) < n:
            out += self._poll_daemon(n - len(out))
        return out

    @property
    def cqe(self):
        return self._cqe

    @property
    def comp_channel(self):
        return self._channel

    def req_notify(self, solicited_only=False):
        """ibv_req_notify_cq(3). softhca has no solicited events: solicited_only arms for
        any completion, which includes the solicited ones."""
        if self._channel is None:
            raise PyverbsRDMAError("Failed to request notification: the CQ has no "
                                   "completion channel", errno.EINVAL)
        self._armed = True

    def ack_events(self, num_events):
        if num_events > self._events:
            raise PyverbsUserError(f"ack_events({num_events}) but {self._events} events "
                                   "were not acknowledged")
        self._events -= num_events


def _check_vector(context, comp_vector):
    if not 0 <= comp_vector < context.num_comp_vectors:
        raise PyverbsRDMAError(f"Failed to create CQ: comp_vector {comp_vector} is outside "
                               f"0..{context.num_comp_vectors - 1}", errno.EINVAL)


class CQ(_CQBase):
    """ibv_create_cq(3). ``poll`` returns ``(npolled, wcs)`` as pyverbs does."""

    def __init__(self, context, cqe, cq_context=None, channel=None, comp_vector=0):
        super().__init__()
        if channel is not None and not isinstance(channel, CompChannel):
            raise PyverbsUserError("channel must be a CompChannel")
        _check_vector(context, comp_vector)
        self._create(context, cqe)
        self._channel = channel

    def poll(self, num_entries=1):
        wcs = self._poll(num_entries)
        return len(wcs), wcs

    def resize(self, cqe):
        """ibv_resize_cq(3): EINVAL below the completions not polled yet."""
        self._ctx._check()
        cqe = int(cqe)
        if cqe < len(self._stash):
            raise PyverbsRDMAError(f"Failed to resize CQ: {len(self._stash)} completions "
                                   "are not polled yet", errno.EINVAL)
        _sync.run(self._obj.resize(cqe), "Failed to resize CQ")
        self._cqe = cqe


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

    def __init__(self, context, init_attr=None, _cqe_size=None):
        super().__init__()
        init_attr = init_attr or CqInitAttrEx()
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
        self._create(context, init_attr.cqe, _cqe_size)
        self._channel = init_attr.channel

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
