"""The transfer pipeline: memory to wire (TX) and wire to memory (RX) through a key.

One call is one transfer through one key (docs/semantics.md section 5): an SGE of a
work request, or the remote range of an RDMA_READ / RDMA_WRITE on the responder.
On an MKEY the order of the stages is docs/semantics.md section 8:

- no signature: crypto on the one stream;
- SIGNATURE_AFTER_CRYPTO_ON_TX: TX = gather, crypto (memory stream), signature;
  RX = signature, crypto (memory stream), scatter;
- SIGNATURE_BEFORE_CRYPTO_ON_TX: TX = gather, signature, crypto (wire stream);
  RX = crypto (wire stream), signature, scatter.

Everything that can fail is checked before a byte moves, so a failed RX leaves
memory untouched. A trace callback, when given, sees every stage with the bytes
before and after; when it is None no trace work is done at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..protocol.enums import AccessFlags, SignatureCryptoOrder
from . import backend
from .completion import Fault, TransferError
from .crypto import CryptoConfig, check_xts_job
from .hca import MR, PD
from .keyplan import ScratchPool, Stage, plan_of, scratch
from .mkey import MKey
from .mw import MW
from .signature import BlockStage, SigPlan

TX, RX = "TX", "RX"


@dataclass(frozen=True)
class TraceEvent:
    """One stage of one transfer: what a block went through on its way."""

    direction: str          # TX or RX
    stage: str              # gather, encrypt, decrypt, check, strip, generate, scatter, wire
    key: int
    stream: str             # memory or wire: the domain the bytes are in after the stage
    offset: int             # where in that stream the bytes start (``at`` says what it is)
    data: bytes             # the bytes after the stage
    detail: dict = field(default_factory=dict)
    # What ``offset`` is: "mkey", an offset into the MKEY's stream (memory or wire
    # domain); "mr", from the MR's first byte; "reth", the virtual address a remote
    # access named (the RETH's, within this MR); "sge", the virtual address of a local
    # SGE (a receive buffer, where a READ's responses land).
    at: str = "mkey"


Trace = Callable[[TraceEvent], None] | None


@dataclass(frozen=True)
class Plan:
    """Where a transfer lands: the wire range and the memory range it maps to."""

    wire_offset: int
    wire_length: int
    mem_offset: int
    mem_length: int
    first_block: int = 0
    n_blocks: int = 0
    tail: int = 0

# The access rights a transfer asks for, as plain ints: ``int & IntFlag`` goes through
# enum's Python-level operator, a cost paid for every message.
_REMOTE_READ = int(AccessFlags.REMOTE_READ)
_REMOTE_WRITE = int(AccessFlags.REMOTE_WRITE)
_LOCAL_WRITE = int(AccessFlags.LOCAL_WRITE)


def _resolve(pd: PD, key: int, access: int, remote: bool, addr: int = 0, length: int = 0,
             qp_num: int | None = None) -> MR | MKey:
    """The MR or MKEY ``key`` names for this access; a memory window's rkey gives its
    MR once the window allows ``[addr, +length)`` to the responder QP ``qp_num``."""
    who = "rkey" if remote else "lkey"
    obj = pd.hca.keys.get(key)
    if obj is None:
        raise TransferError(Fault.ACCESS, f"{who} {key:#x} is unknown")
    if isinstance(obj, MW):
        if not remote:
            raise TransferError(Fault.ACCESS, f"lkey {key:#x} is a memory window's rkey")
        return obj.window(pd, access, qp_num, addr, length)
    if obj.pd is not pd:
        raise TransferError(Fault.ACCESS, f"{who} {key:#x} belongs to another PD")
    if not obj.valid:
        raise TransferError(Fault.ACCESS, f"{who} {key:#x} is invalidated")
    if access and not obj.access & access:
        raise TransferError(Fault.ACCESS, f"{who} {key:#x} lacks "
                            f"IBV_ACCESS_{AccessFlags(access).name}")
    return obj


def plan(mkey: MKey, offset: int, length: int) -> Plan:
    """Map a wire range of an MKEY to its memory range (docs/semantics.md section 5)."""
    if mkey.layout is None:
        raise TransferError(Fault.ACCESS, f"MKEY {mkey.lkey:#x} has no layout")
    if offset < 0 or length < 0:
        raise TransferError(Fault.ACCESS, f"negative offset or length on MKEY {mkey.lkey:#x}")
    sig = mkey.sig
    if sig is None:
        p = Plan(offset, length, offset, length)
    else:
        w, m, bs = sig.wire_width, sig.mem_width, sig.block_size
        if offset % w:
            raise TransferError(Fault.LENGTH, f"wire offset {offset} is not on a {w}-byte "
                                "protected block boundary")
        n, tail = divmod(length, w)
        if tail and mkey.pd.hca.strict_blocks:
            # docs/blocks.md: refused as a misaligned start is, by the MKEY's owner.
            raise TransferError(Fault.LENGTH, f"{length} wire bytes are not a whole number "
                                f"of {w}-byte protection blocks ({tail} bytes over); this "
                                "device runs with strict blocks")
        if tail > bs:
            raise TransferError(Fault.LENGTH, f"{length} wire bytes end {tail} bytes into a "
                                f"{w}-byte block: the tail would split its PI")
        first = offset // w
        p = Plan(offset, length, first * m, n * m + tail, first, n, tail)
    end = p.mem_offset + p.mem_length
    if end > mkey.layout.length:
        raise TransferError(Fault.ACCESS, f"[{offset}, +{length}) on MKEY {mkey.lkey:#x} ends "
                            f"at memory byte {end}, past its {mkey.layout.length} bytes")
    return p


def _partial(mkey: MKey, p: Plan) -> dict:
    """A transfer ending in a partial protection block is counted on its MKEY, and the
    trace's last stage says so (docs/blocks.md)."""
    if not p.tail or mkey.sig is None:
        return {}
    return {"partial_block": p.tail, "partial_block_transfers": mkey.count_partial("transfers")}


def _crypto_stream(mkey: MKey, p: Plan) -> tuple[str, int, int] | None:
    """(stream name, offset, length) that crypto runs on, or None."""
    cfg: CryptoConfig | None = mkey.crypto
    if cfg is None:
        return None
    if mkey.sig is not None and cfg.order == SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX:
        return "wire", p.wire_offset, p.wire_length
    return "memory", p.mem_offset, p.mem_length


def _precheck(mkey: MKey, p: Plan) -> tuple[str, int, int] | None:
    if mkey.has_crypto_flag and mkey.crypto is None:
        # mlx5dv_wr_set_mkey_crypto(3): "this setter must be called before the MKey
        # can be used or else traffic will fail, generating a CQE with error".
        raise TransferError(Fault.CRYPTO, f"MKEY {mkey.lkey:#x} was created with CRYPTO but "
                            "has no crypto attributes")
    cs = _crypto_stream(mkey, p)
    if cs is not None:
        check_xts_job(mkey.crypto, cs[1], cs[2])
    return cs


def _sig(obj: MKey, sp: SigPlan, stream: np.ndarray, p: Plan, pool: ScratchPool | None,
         t: _Tracer, sig_errors: list | None, out_stream: str, out_offset: int,
         final: bool = False, dest: np.ndarray | None = None) -> np.ndarray:
    """The signature stage of either direction: check and generate or strip through
    ``sp``, latch the first error on the MKEY (mlx5dv_mkey_check(3)), hand it to
    ``sig_errors`` too, and trace the block stages on ``out_stream``. ``final``: the
    native backend writes the last stage of a TX straight into the bytes handed out, and
    the last of an RX into ``dest``, the MR memory itself."""
    stages = t.stages()
    if dest is not None:
        out, err = sp.run(stream, p.n_blocks, p.tail, p.first_block, stages, dest)
    elif final:
        out, err = sp.run(stream, p.n_blocks, p.tail, p.first_block, stages, to_bytes=True)
    else:
        stage = Stage(pool, "sig", sp.out_size(p.n_blocks, p.tail))
        # Guards are computed on the data part of the output blocks, one view per block.
        views = stage.views(sp.out_w, sp.block_size, p.n_blocks)
        out, err = sp.run(stream, p.n_blocks, p.tail, p.first_block, stages, stage.out, views)
    obj.latch(err)
    if err is not None and sig_errors is not None:
        sig_errors.append(err)
    if stages is not None:
        for st in stages:
            t.emit(st.name, out_stream, out_offset, out, **st.detail)
    return out


class _Tracer:
    def __init__(self, trace: Trace, direction: str, key: int) -> None:
        self.trace, self.direction, self.key = trace, direction, key

    def emit(self, stage: str, stream: str, offset: int, data: np.ndarray, *,
             at: str = "mkey", **detail) -> None:
        if self.trace is not None:
            self.trace(TraceEvent(self.direction, stage, self.key, stream, offset,
                                  bytes(data), detail, at))

    def stages(self) -> list[BlockStage] | None:
        return [] if self.trace is not None else None


def _crypt(mkey: MKey, data: np.ndarray, cs, direction: str, t: _Tracer,
           pool: ScratchPool | None, final: bool = False,
           dest: np.ndarray | None = None) -> np.ndarray:
    cfg: CryptoConfig = mkey.crypto
    encrypt = cfg.encrypt_on_tx if direction == TX else not cfg.encrypt_on_tx
    dus = cfg.data_unit_size
    # Through the DEK, whose cached cipher writes into this stage's scratch, or (``final``)
    # into the new bytes a TX hands out (``final``), or into the MR memory an RX ends in.
    if dest is None and not final:
        dest = Stage(pool, "xts", len(data)).out
    done = cfg.dek.transform(data, dus, cs[1] // dus, cfg.initial_tweak, encrypt, out=dest)
    out = done if isinstance(done, np.ndarray) else np.frombuffer(done, dtype=np.uint8)
    t.emit("encrypt" if encrypt else "decrypt", cs[0], cs[1], out,
           data_unit_size=dus, first_tweak=cfg.initial_tweak + cs[1] // dus)
    return out


def tx(pd: PD, key: int, offset: int, length: int, *, remote: bool = False,
       trace: Trace = None, sig_errors: list | None = None, view: bool = False,
       qp_num: int | None = None):
    """Memory to wire: the wire bytes of ``length`` at ``offset`` through ``key``.
    ``offset`` is a virtual address for an MR and an offset for an MKEY. A signature
    error is latched on the MKEY and, given ``sig_errors``, appended to it too (signature
    pipelining stops the send queue on an error of this transfer, whatever is latched).
    With ``view``, an MR's bytes come as a view of its memory, read when they are sent
    (as an HCA DMAs READ response data as it sends it), not a copy."""
    obj = _resolve(pd, key, _REMOTE_READ if remote else 0, remote, offset, length,
                   qp_num)
    t = _Tracer(trace, TX, key)
    if isinstance(obj, MR):
        start = _mr_range(obj, offset, length)
        data = obj.buf[start:start + length]
        t.emit("gather", "memory", start, data, at="mr")
        return data if view else data.tobytes()
    p = plan(obj, offset, length)
    cs = _precheck(obj, p)
    kp = plan_of(obj)
    # The native backend writes the last stage into new bytes, which are handed out as
    # they are: the copy out of scratch below is then not needed.
    last = _last_tx_stage(kp, cs) if backend.native is not None else None
    with scratch() as pool:
        stream = obj.layout.piece_view(p.mem_offset, p.mem_length)
        if stream is None:
            stream = obj.layout.gather(p.mem_offset, p.mem_length,
                                       Stage(pool, "gather", p.mem_length).out)
        t.emit("gather", "memory", p.mem_offset, stream)
        if cs is not None and cs[0] == "memory":
            stream = _crypt(obj, stream, cs, TX, t, pool, last == "memory")
        if kp.sig_tx is not None:
            stream = _sig(obj, kp.sig_tx, stream, p, pool, t, sig_errors, "wire", p.wire_offset,
                          last == "sig")
        if cs is not None and cs[0] == "wire":
            stream = _crypt(obj, stream, cs, TX, t, pool, last == "wire")
        t.emit("wire", "wire", p.wire_offset, stream, **_partial(obj, p))
        if last is not None:
            return stream.base
        # A copy: nothing handed out may alias the scratch the next transfer reuses.
        return stream.tobytes()


def _last_tx_stage(kp, cs) -> str | None:
    """Which stage of a TX through an MKEY runs last: crypto on the wire stream, the
    signature, crypto on the memory stream, or none."""
    if cs is not None and cs[0] == "wire":
        return "wire"
    if kp.sig_tx is not None:
        return "sig"
    return "memory" if cs is not None else None


def rx(pd: PD, key: int, offset: int, wire, *, remote: bool = False,
       trace: Trace = None, sig_errors: list | None = None, qp_num: int | None = None) -> None:
    """Wire to memory: scatter ``wire`` bytes arriving for ``offset`` through ``key``
    (``sig_errors`` as for ``tx``)."""
    obj = _resolve(pd, key, _REMOTE_WRITE if remote else _LOCAL_WRITE,
                   remote, offset, len(wire), qp_num)
    stream = np.frombuffer(wire, dtype=np.uint8)
    t = _Tracer(trace, RX, key)
    is_mr = isinstance(obj, MR)
    t.emit("wire", "wire", offset, stream,
           at=("reth" if remote else "sge") if is_mr else "mkey")
    if is_mr:
        start = _mr_range(obj, offset, len(stream))
        obj.buf[start:start + len(stream)] = stream
        t.emit("scatter", "memory", start, stream, at="mr")
        return
    p = plan(obj, offset, len(stream))
    cs = _precheck(obj, p)
    kp = plan_of(obj)
    # The native backend writes the last stage straight into the MR memory when one
    # piece holds the whole range: no scratch for it and no scatter copy after it.
    last = _last_rx_stage(kp, cs)
    dest = (obj.layout.piece_view(p.mem_offset, p.mem_length)
            if backend.native is not None and last is not None else None)
    with scratch() as pool:
        if cs is not None and cs[0] == "wire":
            stream = _crypt(obj, stream, cs, RX, t, pool,
                            dest=dest if last == "wire" else None)
        if kp.sig_rx is not None:
            stream = _sig(obj, kp.sig_rx, stream, p, pool, t, sig_errors, "memory",
                          p.mem_offset, dest=dest if last == "sig" else None)
        if cs is not None and cs[0] == "memory":
            stream = _crypt(obj, stream, cs, RX, t, pool, dest=dest)
        if dest is None:
            obj.layout.scatter(p.mem_offset, stream)
        t.emit("scatter", "memory", p.mem_offset, stream, **_partial(obj, p))


def _last_rx_stage(kp, cs) -> str | None:
    """Which stage of an RX through an MKEY runs last: crypto on the memory stream, the
    signature, crypto on the wire stream, or none."""
    if cs is not None and cs[0] == "memory":
        return "memory"
    if kp.sig_rx is not None:
        return "sig"
    return "wire" if cs is not None else None


def check_rx(pd: PD, key: int, offset: int, length: int, *, remote: bool = False,
             qp_num: int | None = None) -> None:
    """Every check ``rx`` of ``length`` bytes would make, without moving a byte: a
    responder validates a WRITE's RETH at its first packet (IBTA 9.7.4.1: the RETH
    is checked before the data is accepted), so it never buffers a message it could
    not place. Raises TransferError as rx would."""
    obj = _resolve(pd, key, _REMOTE_WRITE if remote else _LOCAL_WRITE,
                   remote, offset, length, qp_num)
    if isinstance(obj, MR):
        _mr_range(obj, offset, length)
        return
    _precheck(obj, plan(obj, offset, length))


def atomic(pd: PD, key: int, addr: int, update: Callable[[int], int], *,
           qp_num: int | None = None, access: int = AccessFlags.REMOTE_ATOMIC) -> int:
    """An IBTA atomic on the responder: the 8 bytes at ``addr`` through rkey ``key``, a
    little-endian 64-bit value, are replaced by ``update(original)``; returns the original.

    The key is checked as for any remote access, with IBV_ACCESS_REMOTE_ATOMIC; then the
    atomic's own rules, as LENGTH faults (NAK Invalid Request): IBTA 9.4.5 requires an
    8-byte aligned address, and an atomic cannot be given PI or encrypted, so a signature
    or crypto MKEY is refused. Nothing is written when a check fails.
    """
    obj = _resolve(pd, key, access, True, addr, 8, qp_num)
    if isinstance(obj, MR):
        start = _mr_range(obj, addr, 8)
    else:
        if obj.sig is not None or obj.has_crypto_flag:
            raise TransferError(Fault.LENGTH, f"rkey {key:#x} is a signature or crypto MKEY: "
                                "no atomics through it")
        start = plan(obj, addr, 8).mem_offset
    if addr % 8:
        raise TransferError(Fault.LENGTH, f"atomic address {addr:#x} is not 8-byte aligned")
    if isinstance(obj, MR):
        original = int.from_bytes(obj.buf[start:start + 8].tobytes(), "little")
        obj.buf[start:start + 8] = np.frombuffer(update(original).to_bytes(8, "little"),
                                                 dtype=np.uint8)
    else:
        original = int.from_bytes(obj.layout.gather(start, 8).tobytes(), "little")
        obj.layout.scatter(start, np.frombuffer(update(original).to_bytes(8, "little"),
                                                dtype=np.uint8))
    return original


def _mr_range(mr: MR, addr: int, length: int) -> int:
    start = addr - mr.addr
    if length < 0 or start < 0 or start + length > mr.length:
        raise TransferError(Fault.ACCESS, f"[{addr:#x}, +{length}) leaves MR {mr.lkey:#x} "
                            f"[{mr.addr:#x}, +{mr.length})")
    return start


def wire_length(pd: PD, key: int) -> int:
    """How many wire bytes an MKEY (or MR) spans: its memory length seen from the wire."""
    obj = pd.hca.keys.get(key)
    if isinstance(obj, MR):
        return obj.length
    if obj is None or obj.layout is None:
        return 0
    if obj.sig is None:
        return obj.layout.length
    n, tail = divmod(obj.layout.length, obj.sig.mem_width)
    return n * obj.sig.wire_width + min(tail, obj.sig.block_size)
