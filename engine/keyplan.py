"""The per-configuration plan of an MKEY, and the scratch buffers transfers run in.

Everything a transfer through an MKEY needs that depends on its configuration alone
(the signature of each direction with its widths, masks, guard functions and fixed
tags) is worked out once, when the first transfer after a configure asks for it, and
kept on the MKEY. The XTS key's AES-ECB contexts live one level down, on the DEK
(hca.DEK.transform, engine/xts.py XtsCipher), so MKEYs sharing a DEK share them. A transfer then costs
O(1) Python set-up plus, on the Python engine, one C call per protection block for the
guards; on the native one (engine/backend.py), one C call per stage.

The plan remembers the configuration objects it was made from (layout, SigConfig,
CryptoConfig and the DEK's key) and is rebuilt as soon as any of them is not the
one the MKEY holds: mlx5dv_wr_mkey_configure(3) replaces them (engine/mkey_configure.py
also drops the plan when it applies a configuration), so a reconfigured MKEY never
runs on a stale plan.

Scratch: the intermediate stages of a transfer (XTS output, signature output) are
written into buffers shared by every transfer of the process, grown once and reused,
because a fresh multi-megabyte temporary per stage costs its page faults on every
call, which measured more than the AES and CRC work. This is safe because nothing
a transfer hands out aliases them: tx returns bytes (a copy), rx scatters into the
MRs, trace events carry bytes. The engine is single-threaded; a transfer started
from inside another one (a trace callback transferring) finds the pool in use and
runs on fresh arrays instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .signature import SigPlan

if TYPE_CHECKING:
    from .mkey import MKey

MIB = 1 << 20
# A transfer whose stage needs more than this runs on fresh arrays rather than grow
# process-wide scratch that would then be kept for good.
SCRATCH_MAX = 16 * MIB
# Per-block buffer views kept per scratch buffer: one list per (stride, length).
_MAX_VIEW_GEOMETRIES = 4


class _Slot:
    """One scratch buffer and the memoryviews of its blocks made so far."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)
        self._views: dict[tuple[int, int], list[memoryview]] = {}

    def views(self, stride: int, length: int, n: int) -> list[memoryview]:
        """Buffers of ``length`` bytes every ``stride`` bytes from the start, at least n
        (n blocks must fit the buffer). Made once per geometry and extended when a
        longer transfer comes: a transfer's guards are then one C call per view."""
        got = self._views.get((stride, length))
        if got is None:
            if len(self._views) >= _MAX_VIEW_GEOMETRIES:
                self._views.clear()
            got = self._views[(stride, length)] = []
        if len(got) < n:
            mv = memoryview(self.buf)
            got.extend(mv[i:i + length] for i in range(len(got) * stride, n * stride, stride))
        return got


class ScratchPool:
    """Named scratch buffers, one per pipeline stage (an output never lands in the slot
    its input is in)."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self.in_use = False

    def slot(self, name: str, nbytes: int) -> _Slot | None:
        """A slot of at least ``nbytes``; None when that is over SCRATCH_MAX."""
        if nbytes > SCRATCH_MAX:
            return None
        slot = self._slots.get(name)
        if slot is None or len(slot.buf) < nbytes:
            # Grow geometrically so a run of slowly growing transfers reallocates rarely.
            have = len(slot.buf) if slot is not None else 0
            slot = self._slots[name] = _Slot(min(SCRATCH_MAX, max(nbytes, 2 * have, 64 * 1024)))
        return slot

    def release(self) -> None:
        """Drop every buffer (tests, and a process that wants its memory back)."""
        self._slots.clear()


POOL = ScratchPool()


class Stage:
    """Where one stage writes: a scratch slot's buffer, or a fresh array."""

    def __init__(self, pool: ScratchPool | None, name: str, nbytes: int) -> None:
        self._slot = pool.slot(name, nbytes) if pool is not None else None
        self.out = (self._slot.buf[:nbytes] if self._slot is not None
                    else np.empty(nbytes, dtype=np.uint8))

    def views(self, stride: int, length: int, n: int) -> list[memoryview] | None:
        return self._slot.views(stride, length, n) if self._slot is not None else None


@contextmanager
def scratch() -> Iterator[ScratchPool | None]:
    """The shared pool for one transfer, or None inside another transfer."""
    if POOL.in_use:
        yield None
        return
    POOL.in_use = True
    try:
        yield POOL
    finally:
        POOL.in_use = False


class KeyPlan:
    """What a transfer through one configuration of an MKEY needs, made once."""

    def __init__(self, mkey: MKey) -> None:
        self.layout = mkey.layout
        self.sig = mkey.sig
        self.crypto = mkey.crypto
        self.dek_key = self.crypto.dek.key if self.crypto is not None else None
        sig = self.sig
        if sig is not None:
            # TX: memory domain in, wire domain out; RX the other way round.
            self.sig_tx = SigPlan(sig.mem, sig.wire, sig.block_size, sig.check_mask,
                                  sig.copy_mask)
            self.sig_rx = SigPlan(sig.wire, sig.mem, sig.block_size, sig.check_mask,
                                  sig.copy_mask)
        else:
            self.sig_tx = self.sig_rx = None

    def current(self, mkey: MKey) -> bool:
        """Whether this plan was made from the configuration the MKEY holds now."""
        crypto = mkey.crypto
        return (mkey.layout is self.layout and mkey.sig is self.sig and crypto is self.crypto
                and (crypto is None or crypto.dek.key is self.dek_key))


def plan_of(mkey: MKey) -> KeyPlan:
    """The MKEY's plan, made (again) when its configuration changed since the last one."""
    kp = mkey.keyplan
    if kp is None or not kp.current(mkey):
        kp = mkey.keyplan = KeyPlan(mkey)
    return kp
