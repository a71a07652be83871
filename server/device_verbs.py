"""The handlers of a session's device, PD, MR and asynchronous event requests:
ibv_get_device_list, ibv_open_device / ibv_query_device / ibv_close_device,
ibv_alloc_pd / ibv_dealloc_pd, ibv_reg_mr / ibv_dereg_mr, the MR's bytes read and written
over the control connection, ibv_get_async_event / ibv_ack_async_event.

Each is a function of the session's ``Verbs`` (server/verbs.py), the request and its id,
named in this module's ``HANDLERS`` as every handler module names its own.
"""

from __future__ import annotations

from ..engine.hca import MR
from ..protocol import control
from ..protocol.errors import RDMAError
from .device_attr import device_attr
from .mw_verbs import refuse_bound

# Bytes of a max_frame kept for the reply's header (the client's chunking keeps as many).
READ_HEADROOM = 4096


# -- verbs: device and memory -------------------------------------------------------
def op_devices(v, r: control.Devices, rid: int) -> dict | None:
    return {"devices": list(v.daemon.hcas)}


def op_open_device(v, r: control.OpenDevice, rid: int) -> dict | None:
    hca = v.daemon.hcas.get(r.name)
    if hca is None:
        raise RDMAError("ENOENT", f"no device {r.name!r} on this daemon (it has "
                                  f"{', '.join(v.daemon.hcas)})")
    return {"ctx": v.add("ctx", hca), "name": hca.name}


def op_query_device(v, r: control.QueryDevice, rid: int) -> dict | None:
    return {"attr": device_attr(v, v.get(r.ctx, "ctx"))}


def op_close_device(v, r: control.CloseDevice, rid: int) -> dict | None:
    v.get(r.ctx, "ctx")
    # The context's crypto logins end with it, as libmlx5's do with the context.
    for handle, (kind, o) in list(v.objects.items()):
        if kind == "crypto_login" and o.ctx == r.ctx:
            v.destroy_handle(handle, "crypto_login")
    return v.destroy_handle(r.ctx, "ctx")


def op_alloc_pd(v, r: control.AllocPd, rid: int) -> dict | None:
    hca = v.get(r.ctx, "ctx")
    pd = hca.alloc_pd()
    handle = v.add("pd", pd)
    v.ctx_of_pd[handle] = r.ctx
    return {"pd": handle}


def op_dealloc_pd(v, r: control.DeallocPd, rid: int) -> dict | None:
    pd = v.get(r.pd, "pd")
    for kind, o in v.objects.values():
        if kind in ("mr", "mkey", "qp", "dek", "ah", "mw", "srq") and o.pd is pd:
            raise RDMAError("EBUSY", f"ibv_dealloc_pd: PD {r.pd} still has a {kind}")
    return v.destroy_handle(r.pd, "pd")


def op_reg_mr(v, r: control.RegMr, rid: int) -> dict | None:
    pd = v.get(r.pd, "pd")
    n = r.length
    v.charge_registration(n)
    mr = pd.hca.reg_mr(pd, n, r.access)
    v.registered_bytes += n
    v.daemon.registered_bytes += n
    return {"mr": v.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}


def op_dereg_mr(v, r: control.DeregMr, rid: int) -> dict | None:
    refuse_bound(v.get(r.mr, "mr"))
    return v.destroy_handle(r.mr, "mr")


def op_mr_write(v, r: control.MrWrite, rid: int) -> dict | None:
    mr: MR = v.get(r.mr, "mr")
    mr.write(r.data, r.offset)
    return {}


def op_mr_read(v, r: control.MrRead, rid: int) -> dict | None:
    mr: MR = v.get(r.mr, "mr")
    # The reply is one frame: a read larger than the frame limit the daemon announced
    # in its welcome is refused before a byte is copied (the client reads in chunks).
    most = v.daemon.max_frame - READ_HEADROOM
    if r.length > most:
        raise RDMAError("EMSGSIZE", f"mr_read of {r.length} bytes: one reply carries "
                                    f"at most {most} (max_frame {v.daemon.max_frame})")
    return {"_payload": mr.read(r.length, r.offset)}


# -- async events (ibv_get_async_event(3), ibv_ack_async_event(3)) ------------------
def op_get_async_event(v, r: control.GetAsyncEvent, rid: int) -> dict | None:
    v.get(r.ctx, "ctx")
    ev = v.async_events.take(r.ctx)
    if ev is not None or r.timeout <= 0:
        return {"event": ev}
    v.room_to_wait("ibv_get_async_event")

    async def wait() -> None:
        found = await v.async_events.get(r.ctx, float(r.timeout))
        if not v.gone:
            v.session.reply_to("get_async_event", rid, event=found)

    v.start_wait(wait())
    return None


def op_ack_async_event(v, r: control.AckAsyncEvent, rid: int) -> dict | None:
    v.async_events.ack(r.event)
    return {}


HANDLERS = {
    control.Devices: op_devices,
    control.OpenDevice: op_open_device,
    control.QueryDevice: op_query_device,
    control.CloseDevice: op_close_device,
    control.AllocPd: op_alloc_pd,
    control.DeallocPd: op_dealloc_pd,
    control.RegMr: op_reg_mr,
    control.DeregMr: op_dereg_mr,
    control.MrWrite: op_mr_write,
    control.MrRead: op_mr_read,
    control.GetAsyncEvent: op_get_async_event,
    control.AckAsyncEvent: op_ack_async_event,
}
