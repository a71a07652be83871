"""Host memory as the device sees it: protection domains and registered memory regions.

Apart from hca.py so that the objects which map memory (an MKEY's layout holds MRs)
can name them without importing the HCA that creates those objects: the engine's
modules depend one way, hca -> mkey -> memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..protocol.errors import einval


class Device(Protocol):
    """What the engine reads of a PD's device: its key table (an lkey or rkey names an MR
    or an MKEY), its DEKs, and the partial-block policy and counters. hca.HCA is the one
    implementation."""

    name: str
    keys: dict[int, Any]
    deks: dict[int, Any]
    strict_blocks: bool
    partial_blocks: dict[str, int]
    rc_window: int


@dataclass(eq=False)
class PD:
    hca: Device
    handle: int


@dataclass(eq=False)
class MR:
    """A registered memory region: ``length`` bytes at virtual address ``addr``."""

    pd: PD
    addr: int
    length: int
    access: int
    lkey: int
    buf: np.ndarray = field(repr=False)
    valid: bool = True
    # Memory windows bound to it (engine/mw.py): ibv_dereg_mr(3) fails while any are.
    bound_mws: int = 0

    @property
    def rkey(self) -> int:
        return self.lkey

    # The CPU touching host memory (what mr.write / mr.read are in the client).
    def write(self, data: bytes, offset: int = 0) -> None:
        if offset < 0 or offset + len(data) > self.length:
            raise einval(f"write of {len(data)} bytes at offset {offset} leaves MR "
                         f"lkey {self.lkey:#x} of {self.length} bytes")
        self.buf[offset:offset + len(data)] = np.frombuffer(data, dtype=np.uint8)

    def read(self, length: int | None = None, offset: int = 0) -> bytes:
        if length is None:
            length = self.length - offset
        if offset < 0 or length < 0 or offset + length > self.length:
            raise einval(f"read of {length} bytes at offset {offset} leaves MR "
                         f"lkey {self.lkey:#x} of {self.length} bytes")
        return self.buf[offset:offset + length].tobytes()
