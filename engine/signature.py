"""Block signature: validating the sig setter, and checking, copying, generating
and stripping the protection information (PI) of every block of a transfer.

The rules are mlx5dv_wr_set_mkey_sig_block(3) as restated in docs/semantics.md
sections 2, 4, 6 and 7. All blocks of a transfer are handled at once as an
(n, block_size + PI) numpy array: the guards come from `guards.guards_many`, and
every comparison and PI byte is a vectorised array operation, never a loop over
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..protocol.attrs import T10DIF_PI_FIELDS, SigBlockAttr, SigBlockDomain
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    CRC_PI_BYTES,
    T10DIF_PI_BYTES,
    MkeyErrType,
    SigBlockAttrFlags,
    SigCrcType,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
)
from ..protocol.errors import einval, eopnotsupp
from . import backend
from .guards import BlockGuard, guards_many

CRC_GUARD_KIND = {SigCrcType.CRC32: "crc32", SigCrcType.CRC32C: "crc32c",
                  SigCrcType.CRC64_XP10: "crc64_xp10"}
# mlx5dv_wr_set_mkey_sig_block(3): "Only the following values are supported as a seed".
CRC_SEEDS = {SigCrcType.CRC32: (0, 0xFFFFFFFF), SigCrcType.CRC32C: (0, 0xFFFFFFFF),
             SigCrcType.CRC64_XP10: (0, 0xFFFFFFFFFFFFFFFF)}
T10DIF_BG_SEEDS = (0, 0xFFFF)
T10DIF_FLAGS = int(SigT10difFlags.REF_REMAP | SigT10difFlags.APP_ESCAPE
                | SigT10difFlags.APP_REF_ESCAPE)

# The T10DIF PI's byte columns of each field (protocol/attrs.py's layout).
GUARD_COLS, APP_COLS, REF_COLS = (tuple(range(*T10DIF_PI_FIELDS[f]))
                                  for f in ("guard", "app_tag", "ref_tag"))
APP_ESCAPE_TAG = 0xFFFF
REF_ESCAPE_TAG = 0xFFFFFFFF


def mask_cols(mask: int, pi_size: int) -> tuple[int, ...]:
    """The PI byte columns a check_mask / copy_mask selects (bit 7 is PI byte 0)."""
    return tuple(i for i in range(pi_size) if mask >> (7 - i) & 1)


@dataclass(frozen=True)
class DomainSpec:
    """One domain's signature, validated and flattened for the block pipeline."""

    sig_type: int
    block_size: int
    pi_size: int
    guard_kind: str
    guard_seed: int
    crc_type: int | None = None
    bg_type: int | None = None
    app_tag: int = 0
    ref_tag: int = 0
    flags: int = 0

    @property
    def width(self) -> int:
        """Bytes per block in this domain: data plus PI."""
        return self.block_size + self.pi_size


@dataclass(frozen=True)
class SigConfig:
    """The signature attributes an MKEY keeps between configures."""

    mem: DomainSpec | None
    wire: DomainSpec | None
    check_mask: int
    copy_mask: int          # effective: the explicit mask with COPY_MASK, else computed
    attr: SigBlockAttr      # as given, for mkey queries and the trace

    @property
    def block_size(self) -> int:
        return (self.mem or self.wire).block_size

    @property
    def mem_width(self) -> int:
        return self.mem.width if self.mem else self.block_size

    @property
    def wire_width(self) -> int:
        return self.wire.width if self.wire else self.block_size


@dataclass(frozen=True)
class SigError:
    """What mlx5dv_mkey_check(3) reports for the first failing block."""

    err_type: int
    actual_value: int
    expected_value: int
    offset: int


NO_SIG_ERROR = SigError(MkeyErrType.NO_ERR, 0, 0, 0)


# -- the sig setter's rules (docs/semantics.md section 4) ----------------------------

def _domain_spec(name: str, d: SigBlockDomain) -> DomainSpec:
    if d.comp_mask:
        raise einval(f"{name} domain comp_mask {d.comp_mask:#x} must be 0")
    if d.block_size not in BLOCK_SIZE_BYTES:
        raise einval(f"{name} domain block_size {d.block_size} is not an mlx5dv_block_size (0..4)")
    bs = BLOCK_SIZE_BYTES[d.block_size]
    if d.sig_type == SigType.T10DIF:
        dif = d.dif
        if dif is None:
            raise einval(f"{name} domain is MLX5DV_SIG_TYPE_T10DIF but has no dif attributes")
        if dif.bg_type not in (SigT10difBgType.CRC, SigT10difBgType.CSUM):
            raise einval(f"{name} domain T10DIF bg_type {dif.bg_type} is unknown")
        if dif.bg not in T10DIF_BG_SEEDS:
            raise einval(f"{name} domain T10DIF bg {dif.bg:#x} must be 0 or 0xFFFF")
        if dif.flags & ~T10DIF_FLAGS:
            raise einval(f"{name} domain T10DIF flags {dif.flags:#x} has unknown bits")
        if not 0 <= dif.app_tag <= 0xFFFF or not 0 <= dif.ref_tag <= 0xFFFFFFFF:
            raise einval(f"{name} domain T10DIF app_tag is 16 bits and ref_tag 32 bits")
        kind = "t10dif_crc" if dif.bg_type == SigT10difBgType.CRC else "t10dif_csum"
        return DomainSpec(SigType.T10DIF, bs, T10DIF_PI_BYTES, kind, dif.bg,
                          bg_type=dif.bg_type, app_tag=dif.app_tag, ref_tag=dif.ref_tag,
                          flags=dif.flags)
    if d.sig_type == SigType.CRC:
        crc = d.crc
        if crc is None:
            raise einval(f"{name} domain is MLX5DV_SIG_TYPE_CRC but has no crc attributes")
        if crc.crc_type not in CRC_PI_BYTES:
            raise einval(f"{name} domain CRC type {crc.crc_type} is unknown")
        pi = CRC_PI_BYTES[crc.crc_type]
        # mlx5dv_wr_set_mkey_sig_block(3): "only the 32 least significant bits are
        # used for CRC32/CRC32C".
        seed = crc.seed & ((1 << (8 * pi)) - 1)
        if seed not in CRC_SEEDS[crc.crc_type]:
            raise einval(f"{name} domain {SigCrcType(crc.crc_type).name} seed {crc.seed:#x} "
                         f"must be 0 or all ones")
        return DomainSpec(SigType.CRC, bs, pi, CRC_GUARD_KIND[crc.crc_type], seed,
                          crc_type=crc.crc_type)
    raise einval(f"{name} domain sig_type {d.sig_type} is unknown")


def same_structure(a: DomainSpec | None, b: DomainSpec | None) -> bool:
    """Same block size and signature type (and CRC type): what COPY_MASK needs."""
    return (a is not None and b is not None and a.sig_type == b.sig_type
            and a.block_size == b.block_size and a.crc_type == b.crc_type)


def copy_mask_fields(mem: DomainSpec | None, wire: DomainSpec | None,
                     ) -> tuple[tuple[str, int, bool], ...]:
    """The rule of the computed copy mask (docs/semantics.md 6.2), field by field: for
    each PI field a copy could take, (field, its check_mask / copy_mask bits, whether
    the device copies it when COPY_MASK is not set). A field is copied when both
    domains would generate it alike; nothing is copied between domains of different
    structure, and a CRC is copied whole."""
    if not same_structure(mem, wire):
        return ()
    if mem.sig_type == SigType.CRC:
        return (("crc", 0xFF, True),)
    return (("guard", 0xC0, mem.bg_type == wire.bg_type and mem.guard_seed == wire.guard_seed),
            ("app_tag", 0x30, mem.app_tag == wire.app_tag),
            ("ref_tag", 0x0F, mem.ref_tag == wire.ref_tag))


def computed_copy_mask(mem: DomainSpec | None, wire: DomainSpec | None) -> int:
    """The copy mask the device computes when COPY_MASK is not set."""
    mask = 0
    for _, bits, copied in copy_mask_fields(mem, wire):
        if copied:
            mask |= bits
    return mask


def validate_sig_block_attr(attr: SigBlockAttr) -> SigConfig:
    """Apply every rule of the sig setter; raise RDMAError(EINVAL) naming the broken one."""
    if attr.comp_mask:
        raise einval(f"sig_block_attr comp_mask {attr.comp_mask:#x} must be 0")
    if attr.flags & ~int(SigBlockAttrFlags.COPY_MASK):
        raise einval(f"sig_block_attr flags {attr.flags:#x} has unknown bits")
    if attr.mem is None and attr.wire is None:
        raise einval("sig_block_attr has neither a memory nor a wire domain")
    if not 0 <= attr.check_mask <= 0xFF or not 0 <= attr.copy_mask <= 0xFF:
        raise einval("check_mask and copy_mask are 8-bit masks")
    mem = _domain_spec("memory", attr.mem) if attr.mem is not None else None
    wire = _domain_spec("wire", attr.wire) if attr.wire is not None else None
    if attr.flags & SigBlockAttrFlags.COPY_MASK:
        if not same_structure(mem, wire):
            raise einval("MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK needs both domains with the same "
                         "sig_type, block_size and CRC type")
        copy_mask = attr.copy_mask
    else:
        copy_mask = computed_copy_mask(mem, wire)
    if mem is not None and wire is not None and mem.block_size != wire.block_size:
        # docs/semantics.md section 5 maps wire block b to memory block b; domains of
        # different block sizes would re-block the data, which is not modelled.
        raise eopnotsupp(f"memory block size {mem.block_size} and wire block size "
                         f"{wire.block_size} differ; softhca models equal block sizes only")
    return SigConfig(mem, wire, attr.check_mask, copy_mask, attr)


# -- the per-block processing (docs/semantics.md section 6) --------------------------

def _be_values(pi: np.ndarray, cols: tuple[int, ...]) -> np.ndarray:
    """Big-endian integers from the PI byte columns ``cols`` (contiguous, in order)."""
    out = np.zeros(pi.shape[0], dtype=np.uint64)
    for c in cols:
        out = (out << np.uint64(8)) | pi[:, c].astype(np.uint64)
    return out


def _be_bytes(values: np.ndarray, nbytes: int) -> np.ndarray:
    """(n,) integers to (n, nbytes) big-endian bytes."""
    be = values.astype(np.uint64).astype(">u8").view(np.uint8).reshape(-1, 8)
    return be[:, 8 - nbytes:]


@dataclass
class BlockStage:
    """What one stage did to the blocks of a transfer, for the trace."""

    name: str
    detail: dict


class _GuardCache:
    """Guards over the same data with the same (kind, seed) are computed once
    (a T10DIF -> T10DIF configuration checks and generates the same guard).

    ``block_guards`` are a SigPlan's prepared BlockGuards by (kind, seed), used with
    ``views`` (see BlockGuard); any other guard goes through guards_many."""

    def __init__(self, data: np.ndarray, views: list | None = None,
                 block_guards: dict[tuple[str, int], BlockGuard] | None = None) -> None:
        self.data = data
        self._views = views
        self._block_guards = block_guards or {}
        self._cache: dict[tuple[str, int], np.ndarray] = {}

    def get(self, kind: str, seed: int) -> np.ndarray:
        key = (kind, seed)
        if key not in self._cache:
            prepared = self._block_guards.get(key)
            self._cache[key] = (prepared(self.data, self._views) if prepared is not None
                                else guards_many(self.data, kind, seed))
        return self._cache[key]


def _expected_ref(spec: DomainSpec, first_block: int, n: int) -> np.ndarray:
    if spec.flags & SigT10difFlags.REF_REMAP:
        idx = np.arange(first_block, first_block + n, dtype=np.uint64)
        return (idx + np.uint64(spec.ref_tag)) & np.uint64(0xFFFFFFFF)
    return np.full(n, spec.ref_tag, dtype=np.uint64)


def _check(spec: DomainSpec, pi: np.ndarray, guards: _GuardCache, check_mask: int,
           first_block: int) -> tuple[SigError | None, np.ndarray]:
    """Check the input PI. Returns the first failing block's error and, per block,
    the err_type found (NO_ERR where the block passed, was escaped or not checked)."""
    n = pi.shape[0]
    result = np.zeros(n, dtype=np.uint8)
    cols = mask_cols(check_mask, spec.pi_size)
    if not cols or n == 0:
        return None, result
    if spec.sig_type == SigType.CRC:
        all_cols = tuple(range(spec.pi_size))
        actual = guards.get(spec.guard_kind, spec.guard_seed)
        stored = _be_values(pi, all_cols)
        computed = _be_bytes(actual, spec.pi_size)
        bad = (computed[:, cols] != pi[:, cols]).any(axis=1)
        result[bad] = MkeyErrType.BAD_GUARD
        fields = [(MkeyErrType.BAD_GUARD, bad, actual, stored)]
    else:
        stored_app = _be_values(pi, APP_COLS)
        stored_ref = _be_values(pi, REF_COLS)
        # docs/semantics.md 6.1: APP_REF_ESCAPE wins when both escape flags are set.
        if spec.flags & SigT10difFlags.APP_REF_ESCAPE:
            escaped = (stored_app == APP_ESCAPE_TAG) & (stored_ref == REF_ESCAPE_TAG)
        elif spec.flags & SigT10difFlags.APP_ESCAPE:
            escaped = stored_app == APP_ESCAPE_TAG
        else:
            escaped = np.zeros(n, dtype=bool)
        fields = []
        for err_type, fcols, width in ((MkeyErrType.BAD_GUARD, GUARD_COLS, 2),
                                       (MkeyErrType.BAD_APPTAG, APP_COLS, 2),
                                       (MkeyErrType.BAD_REFTAG, REF_COLS, 4)):
            checked = tuple(c for c in cols if c in fcols)
            if not checked:
                continue
            if err_type == MkeyErrType.BAD_GUARD:
                actual = guards.get(spec.guard_kind, spec.guard_seed)
            elif err_type == MkeyErrType.BAD_APPTAG:
                actual = np.full(n, spec.app_tag, dtype=np.uint64)
            else:
                actual = _expected_ref(spec, first_block, n)
            computed = _be_bytes(actual, width)
            rel = [c - fcols[0] for c in checked]
            bad = (computed[:, rel] != pi[:, list(checked)]).any(axis=1) & ~escaped
            fields.append((err_type, bad, actual, _be_values(pi, fcols)))
        # Only the first failing field of a block counts, in the order GUARD, APPTAG, REFTAG.
        for err_type, bad, _, _ in reversed(fields):
            result[bad] = err_type
    failing = np.flatnonzero(result)
    if failing.size == 0:
        return None, result
    b = int(failing[0])
    for err_type, bad, actual, stored in fields:
        if bad[b]:
            return SigError(int(err_type), int(actual[b]), int(stored[b]), b * spec.width), result
    raise AssertionError("unreachable: a failing block has a failing field")


def _pi_dtype(pi_size: int) -> np.dtype:
    """A whole PI as one big-endian integer (PI byte 0 most significant)."""
    return np.dtype(">u8" if pi_size == 8 else ">u4")


def _pi_ints(pi: np.ndarray) -> np.ndarray:
    """(n, pi_size) PI bytes as n integers, through a view when the rows allow one."""
    try:
        return pi.view(_pi_dtype(pi.shape[1]))[:, 0].astype(np.uint64)
    except ValueError:  # the last axis is not contiguous
        return _be_values(pi, tuple(range(pi.shape[1])))


def _generate(spec: DomainSpec, guards: _GuardCache, copy_cols: tuple[int, ...],
              pi_in: np.ndarray | None, first_block: int, n: int,
              plan: _DomainPlan | None = None) -> np.ndarray:
    """The (n, pi_size) PI bytes of the output domain: generated, except the columns
    copied from the input PI. Built as one big-endian integer per block (``plan`` holds
    what the configuration fixes), returned as a C-contiguous byte view of them."""
    dp = plan if plan is not None else _DomainPlan(spec)
    generated = [c for c in range(spec.pi_size) if c not in copy_cols]
    if generated:
        need_guard = any(c in dp.guard_cols for c in generated)
        g = guards.get(spec.guard_kind, spec.guard_seed) if need_guard else None
        values = dp.values(g, first_block, n)
    else:
        values = np.zeros(n, dtype=np.uint64)
    if copy_cols and pi_in is not None:
        bits = _cols_bits(copy_cols, spec.pi_size)
        values &= ~bits
        values |= _pi_ints(pi_in) & bits
    return values.astype(_pi_dtype(spec.pi_size)).view(np.uint8).reshape(n, spec.pi_size)


def _pi_view(buf: np.ndarray, n: int, width: int, block_size: int, pi_size: int) -> np.ndarray:
    """The PI of each of the ``n`` blocks ``width`` bytes apart in the 1-D ``buf``, as one
    big-endian integer per block (PI byte 0 most significant, as check_mask bit 7 is byte 0):
    a strided view, no copy, and unaligned access is numpy's business."""
    dtype = _pi_dtype(pi_size)
    if n == 0:
        return np.empty(0, dtype=dtype)
    return np.ndarray((n,), dtype=dtype, buffer=buf,
                      offset=block_size, strides=(width,))


def _cols_bits(cols: tuple[int, ...], pi_size: int) -> np.uint64:
    """The bits of a PI integer (as _pi_view reads it) that the byte columns ``cols`` hold."""
    return np.uint64(sum(0xFF << 8 * (pi_size - 1 - c) for c in cols))


class _DomainPlan:
    """What one domain's PI is expected to hold, prepared once per configuration."""

    def __init__(self, spec: DomainSpec) -> None:
        self.spec = spec
        self.guard = BlockGuard(spec.guard_kind, spec.guard_seed, spec.block_size)
        t10 = spec.sig_type == SigType.T10DIF
        self.guard_cols = GUARD_COLS if t10 else tuple(range(spec.pi_size))
        self.guard_shift = np.uint64(48 if t10 else 0)
        self.remap = bool(t10 and spec.flags & SigT10difFlags.REF_REMAP)
        ref = 0 if self.remap or not t10 else spec.ref_tag
        self.static = np.uint64((spec.app_tag << 32 | ref) if t10 else 0)

    def values(self, guard: np.ndarray | None, first_block: int, n: int) -> np.ndarray:
        """The PI integer of each of n blocks; guard columns are 0 when ``guard`` is None."""
        out = guard << self.guard_shift if guard is not None else np.zeros(n, dtype=np.uint64)
        if self.static:
            out |= self.static
        if self.remap:
            # docs/semantics.md 6.1: REF_REMAP gives block b the ref tag ref_tag + b.
            start = first_block + self.spec.ref_tag
            out |= np.arange(start, start + n, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
        return out


class SigPlan:
    """One direction of a signature configuration, input domain to output domain, with
    everything that does not depend on the transfer worked out once: widths, the columns
    check_mask and copy_mask select as bit masks, each domain's guard and fixed tags.

    A transfer then costs a fixed number of numpy calls plus one guard call per block:
    data is copied as one strided 2-D copy, PI is read and written through a strided
    big-endian integer view, and a check that finds nothing wrong compares one masked
    integer per block. Only a transfer with a failing block goes through `_check`, the
    field-by-field analysis that names the error mlx5dv_mkey_check(3) reports.
    """

    def __init__(self, inp: DomainSpec | None, out: DomainSpec | None, block_size: int,
                 check_mask: int, copy_mask: int) -> None:
        self.inp, self.out, self.block_size = inp, out, block_size
        self.check_mask, self.copy_mask = check_mask, copy_mask
        self.in_w = block_size + (inp.pi_size if inp else 0)
        self.out_w = block_size + (out.pi_size if out else 0)
        self._in = _DomainPlan(inp) if inp else None
        self._out = _DomainPlan(out) if out else None
        self.check_cols = mask_cols(check_mask, inp.pi_size) if inp else ()
        self._check_bits = _cols_bits(self.check_cols, inp.pi_size) if inp else np.uint64(0)
        self.copy_cols = (mask_cols(copy_mask, out.pi_size)
                          if out and same_structure(inp, out) else ())
        self._check_guard = bool(self._in and set(self.check_cols) & set(self._in.guard_cols))
        self._block_guards = {(d.guard.kind, d.guard.seed): d.guard
                              for d in (self._in, self._out) if d is not None}
        self._native = None     # the accelerator's SigPlan, made on first native run

    def out_size(self, n: int, tail: int) -> int:
        return n * self.out_w + tail

    def run(self, stream: np.ndarray, n: int, tail: int, first_block: int,
            stages: list[BlockStage] | None = None, out: np.ndarray | None = None,
            views: list | None = None, to_bytes: bool = False,
            ) -> tuple[np.ndarray, SigError | None]:
        """Turn ``n`` full blocks plus a ``tail`` of the input domain's stream into the
        output domain's stream, written to ``out`` (a fresh array when None). The tail is
        plain data (docs/semantics.md section 5). ``views``, when given, are buffers of the
        data part of each output block, in order (see BlockGuard). ``to_bytes`` (native
        backend only): the output is a view of new bytes, its ``base``."""
        if backend.native is not None:
            return self._run_native(backend.native, stream, n, tail, first_block, stages, out,
                                    to_bytes)
        bs, in_w, out_w = self.block_size, self.in_w, self.out_w
        if out is None:
            out = np.empty(self.out_size(n, tail), dtype=np.uint8)
        in_blocks = stream[:n * in_w].reshape(n, in_w)
        out_blocks = out[:n * out_w].reshape(n, out_w)
        out_data = out_blocks[:, :bs]
        out_data[...] = in_blocks[:, :bs]
        out[n * out_w:] = stream[n * in_w:n * in_w + tail]

        # Guards are computed on the output's copy of the data, once per (kind, seed).
        guards = _GuardCache(out_data, views, self._block_guards)
        pi_in = in_blocks[:, bs:] if self.inp is not None else None
        error = None
        if self.inp is not None:
            per_block = None
            if self.check_cols and n:
                g = (guards.get(self.inp.guard_kind, self.inp.guard_seed)
                     if self._check_guard else None)
                want = self._in.values(g, first_block, n)
                stored = _pi_view(stream, n, in_w, bs, self.inp.pi_size).astype(np.uint64)
                if ((stored ^ want) & self._check_bits).any():
                    error, per_block = _check(self.inp, pi_in, guards, self.check_mask,
                                              first_block)
            if stages is not None:
                if per_block is None:
                    per_block = np.zeros(n, dtype=np.uint8)
                stages.append(BlockStage("check", {
                    "domain_pi": self.inp.pi_size, "check_mask": self.check_mask,
                    "results": per_block.tolist(), "error": error}))
        if self.out is not None:
            pi = _generate(self.out, guards, self.copy_cols, pi_in, first_block, n,
                           plan=self._out)
            if pi.flags.c_contiguous and pi.dtype == np.uint8 and pi.shape == (n, self.out.pi_size):
                np.copyto(_pi_view(out, n, out_w, bs, self.out.pi_size),
                          pi.view(_pi_dtype(self.out.pi_size)).reshape(n))
            else:
                out_blocks[:, bs:] = pi
            if stages is not None:
                stages.append(BlockStage("generate", {"copied_cols": self.copy_cols,
                                                      "pi_size": self.out.pi_size}))
        elif self.inp is not None and stages is not None:
            stages.append(BlockStage("strip", {"pi_size": self.inp.pi_size}))
        return out, error

    def _run_native(self, module, stream: np.ndarray, n: int, tail: int, first_block: int,
                    stages: list[BlockStage] | None, out: np.ndarray | None,
                    to_bytes: bool) -> tuple[np.ndarray, SigError | None]:
        """``run`` as one call of the native accelerator (engine/backend.py) over every
        block: the same bytes, the same first error, the same trace stages."""
        if self._native is None:
            copy_bits = _cols_bits(self.copy_cols, self.out.pi_size) if self.copy_cols else 0
            self._native = module.SigPlan(self.block_size, _native_spec(self.inp),
                                          _native_spec(self.out),
                                          self.check_mask if self.check_cols else 0,
                                          int(copy_bits))
        results = np.zeros(n, dtype=np.uint8) if stages is not None else None
        src = np.ascontiguousarray(stream)
        if to_bytes:
            data, got = self._native.run_bytes(src, n, tail, first_block, results)
            out = np.frombuffer(data, dtype=np.uint8)
        else:
            if out is None:
                out = np.empty(self.out_size(n, tail), dtype=np.uint8)
            got = self._native.run(src, out, n, tail, first_block, results)
        error = SigError(*got) if got is not None else None
        if stages is not None:
            if self.inp is not None:
                stages.append(BlockStage("check", {
                    "domain_pi": self.inp.pi_size, "check_mask": self.check_mask,
                    "results": results.tolist(), "error": error}))
            if self.out is not None:
                stages.append(BlockStage("generate", {"copied_cols": self.copy_cols,
                                                      "pi_size": self.out.pi_size}))
            elif self.inp is not None:
                stages.append(BlockStage("strip", {"pi_size": self.inp.pi_size}))
        return out, error


# The accelerator's guard kinds (accel/native.c), by guards.py's names.
_NATIVE_KIND = {"t10dif_crc": 0, "t10dif_csum": 1, "crc32": 2, "crc32c": 3, "crc64_xp10": 4}


def _native_spec(spec: DomainSpec | None) -> tuple | None:
    """A domain as the accelerator's SigPlan takes it."""
    if spec is None:
        return None
    return (_NATIVE_KIND[spec.guard_kind], int(spec.sig_type == SigType.T10DIF), spec.pi_size,
            spec.guard_seed, spec.app_tag, spec.ref_tag, int(spec.flags))
