"""The MKEY: an indirect key over a layout of MR pieces, with optional block
signature and crypto attributes (mlx5dv_create_mkey(3), mlx5dv_wr_mkey_configure(3)).

The MKEY is zero-based: an SGE's addr on it is an offset into the concatenation of
its layout's pieces, the memory domain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..protocol.enums import MkeyErrType, MkeyInitAttrFlags
from ..protocol.errors import einval
from .completion import Fault, TransferError
from .memory import MR, PD
from .signature import NO_SIG_ERROR, SigConfig, SigError


@dataclass(frozen=True)
class Layout:
    """One period of pieces (mr, offset in the MR, length) in MKEY order, repeated
    ``repeat`` times, piece i advancing ``strides[i]`` bytes in its MR each time; a list
    layout is one period. ``entries`` is what the layout costs of max_entries
    (interleaved uses one extra for its header).

    The repetition is never expanded: a layout costs O(entries) to build and keep, and a
    transfer O(entries) Python steps plus numpy copies of the bytes it moves, whatever
    repeat_count is (mlx5dv_wr_set_mkey_layout_interleaved(3) allows 2^32 - 1)."""

    kind: str
    pieces: tuple[tuple[MR, int, int], ...]
    entries: int
    repeat: int = 1
    strides: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        lengths = np.array([p[2] for p in self.pieces], dtype=np.int64)
        object.__setattr__(self, "_starts", np.concatenate(([0], np.cumsum(lengths))))
        if not self.strides:
            object.__setattr__(self, "strides", (0,) * len(self.pieces))

    @property
    def period(self) -> int:
        return int(self._starts[-1])

    @property
    def length(self) -> int:
        return self.period * self.repeat

    def _walk(self, offset: int, length: int):
        """(mr, mr_offset, stream_offset, n) for each piece the range touches, for a range
        inside one period."""
        period = self.period
        rep, pos = divmod(offset, period)
        end = pos + length
        i = int(np.searchsorted(self._starts, pos, side="right")) - 1
        while pos < end:
            mr, mr_off, plen = self.pieces[i]
            inner = pos - int(self._starts[i])
            n = min(plen - inner, end - pos)
            if n:
                _check(mr)
                yield mr, mr_off + rep * self.strides[i] + inner, \
                    rep * period + pos - offset, n
            pos += n
            i += 1

    def _spans(self, offset: int, length: int):
        """The range as (stream offset, piece walk) parts and at most one run of whole
        periods: ("walk", start, length) or ("periods", start, first period, count)."""
        period = self.period
        if length <= 0 or period == 0:
            return []
        first, inner = divmod(offset, period)
        last, tail = divmod(offset + length, period)
        if first == last:
            return [("walk", offset, length)]
        out = []
        if inner:
            out.append(("walk", offset, period - inner))
            first += 1
        if last > first:
            out.append(("periods", first * period, first, last - first))
        if tail:
            out.append(("walk", last * period, tail))
        return out

    def _move(self, offset: int, stream: np.ndarray, gather: bool) -> None:
        """Copy between ``stream`` (the bytes of [offset, +len)) and the MRs: per piece of
        a partial period, and per entry for a run of whole periods, with one strided
        numpy copy of every period's bytes of that entry."""
        period = self.period
        for span in self._spans(offset, len(stream)):
            if span[0] == "walk":
                for mr, o, s, n in self._walk(span[1], span[2]):
                    s += span[1] - offset
                    if gather:
                        stream[s:s + n] = mr.buf[o:o + n]
                    else:
                        mr.buf[o:o + n] = stream[s:s + n]
                continue
            _, start, rep, count = span
            rows = stream[start - offset:start - offset + count * period].reshape(count, period)
            for (mr, mr_off, plen), stride, st in zip(self.pieces, self.strides,
                                                      self._starts[:-1], strict=False):
                if not plen:
                    continue
                _check(mr)
                base = mr.buf[mr_off + rep * stride:]
                mem = np.lib.stride_tricks.as_strided(base, shape=(count, plen),
                                                      strides=(stride, 1))
                st = int(st)
                if gather:
                    rows[:, st:st + plen] = mem
                else:
                    mem[...] = rows[:, st:st + plen]

    def piece_view(self, offset: int, length: int) -> np.ndarray | None:
        """The MR bytes of [offset, +length) as a view when one piece holds them all
        (a whole period of a one-piece layout included), else None."""
        period = self.period
        if length > 0 and period and offset % period + length <= period:
            parts = list(self._walk(offset, length))
            if len(parts) == 1:
                mr, o, _, n = parts[0]
                return mr.buf[o:o + n]
        return None

    def gather(self, offset: int, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """The memory bytes of [offset, +length); a view when one piece holds them all
        (every later stage writes a new buffer, so the view is never written through),
        else copied into ``out`` (``length`` bytes) or a fresh array."""
        view = self.piece_view(offset, length)
        if view is not None:
            return view
        if out is None:
            out = np.empty(max(length, 0), dtype=np.uint8)
        self._move(offset, out, True)
        return out

    def scatter(self, offset: int, data: np.ndarray) -> None:
        self._move(offset, np.asarray(data), False)


def _check(mr: MR) -> None:
    if not mr.valid:
        raise TransferError(Fault.ACCESS, f"MR lkey {mr.lkey:#x} in the MKEY layout "
                            "was deregistered")


class MKey:
    def __init__(self, pd: PD, lkey: int, create_flags: int, max_entries: int) -> None:
        self.pd = pd
        self.lkey = lkey
        self.create_flags = create_flags
        self.max_entries = max_entries
        # A created MKEY is free until its first configure makes it valid.
        self.valid = False
        self.access = 0
        self.layout: Layout | None = None
        self.sig: SigConfig | None = None
        self.crypto = None
        # engine/keyplan.py: what transfers through this configuration reuse; it checks
        # itself against layout/sig/crypto, and a configure drops it.
        self.keyplan = None
        self.sig_error: SigError | None = None
        # Not whole protection blocks (docs/blocks.md): configures that left a layout
        # of a partial block, transfers whose length ended in one.
        self.partial_block_layouts = 0
        self.partial_block_transfers = 0

    def count_partial(self, what: str) -> int:
        """One more partial-block ``what`` ("layouts" or "transfers") on this MKEY and
        its device; returns this MKEY's count."""
        name = f"partial_block_{what}"
        n = getattr(self, name) + 1
        setattr(self, name, n)
        self.pd.hca.partial_blocks[name] += 1
        return n

    @property
    def rkey(self) -> int:
        return self.lkey

    @property
    def has_crypto_flag(self) -> bool:
        return bool(self.create_flags & MkeyInitAttrFlags.CRYPTO)

    def invalidate(self) -> None:
        """LOCAL_INV / SEND_WITH_INV: later use fails until the MKEY is configured again."""
        self.valid = False

    def latch(self, error: SigError | None) -> None:
        # mlx5dv_mkey_check(3): the first error is kept until it is read.
        if error is not None and self.sig_error is None:
            self.sig_error = error

    def mkey_check(self) -> SigError:
        """mlx5dv_mkey_check(3): the latched error, cleared by reading it. EINVAL only for
        an MKEY created without MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE: one created
        with it answers MLX5DV_MKEY_NO_ERR even while configured without signature (the
        mlx5 provider keeps the signature context from mlx5dv_create_mkey on; rdma-core's
        test_mlx5_mkey checks such an MKEY)."""
        if not self.create_flags & MkeyInitAttrFlags.BLOCK_SIGNATURE:
            raise einval(f"MKEY {self.lkey:#x} was not created with "
                         "MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE: nothing to check")
        err, self.sig_error = self.sig_error or NO_SIG_ERROR, None
        return err

    def __repr__(self) -> str:
        err = MkeyErrType(self.sig_error.err_type).name if self.sig_error else "NO_ERR"
        return (f"MKey(lkey={self.lkey:#x}, valid={self.valid}, access={self.access:#x}, "
                f"length={self.layout.length if self.layout else 0}, sig={self.sig is not None}, "
                f"crypto={self.crypto is not None}, err={err})")
