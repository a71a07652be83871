"""The MKEY: an indirect key over a layout of MR pieces, with optional block
signature and crypto attributes (mlx5dv_create_mkey(3), mlx5dv_wr_mkey_configure(3)).

The MKEY is zero-based: an SGE's addr on it is an offset into the concatenation of
its layout's pieces, the memory domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..protocol.enums import MkeyErrType, MkeyInitAttrFlags
from ..protocol.errors import einval
from .completion import Fault, TransferError
from .signature import NO_SIG_ERROR, SigConfig, SigError

if TYPE_CHECKING:
    # For the annotations only: hca.py creates MKEYs (HCA.create_mkey), so the engine's
    # objects depend one way, hca -> mkey.
    from .hca import MR, PD


@dataclass(frozen=True)
class Layout:
    """Pieces (mr, offset in the MR, length) in MKEY order; ``entries`` is what the
    layout costs of max_entries (interleaved uses one extra for its header)."""

    kind: str
    pieces: tuple[tuple[MR, int, int], ...]
    entries: int

    def __post_init__(self) -> None:
        lengths = np.array([p[2] for p in self.pieces], dtype=np.int64)
        object.__setattr__(self, "_starts", np.concatenate(([0], np.cumsum(lengths))))

    @property
    def length(self) -> int:
        return int(self._starts[-1])

    def _walk(self, offset: int, length: int):
        """(mr, mr_offset, stream_offset, n) for each piece the range touches."""
        i = int(np.searchsorted(self._starts, offset, side="right")) - 1
        pos = offset
        end = offset + length
        while pos < end:
            mr, mr_off, plen = self.pieces[i]
            inner = pos - int(self._starts[i])
            n = min(plen - inner, end - pos)
            if not mr.valid:
                raise TransferError(Fault.ACCESS, f"MR lkey {mr.lkey:#x} in the MKEY layout "
                                    "was deregistered")
            yield mr, mr_off + inner, pos - offset, n
            pos += n
            i += 1

    def gather(self, offset: int, length: int) -> np.ndarray:
        """The memory bytes of [offset, +length); a view when one piece holds them all
        (every later stage writes a new buffer, so the view is never written through)."""
        parts = [mr.buf[o:o + n] for mr, o, _, n in self._walk(offset, length)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)

    def scatter(self, offset: int, data: np.ndarray) -> None:
        for mr, o, s, n in self._walk(offset, len(data)):
            mr.buf[o:o + n] = data[s:s + n]


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
