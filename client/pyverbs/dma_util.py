"""pyverbs.dma_util: barriers and MMIO writes for direct device access, which softhca
has no device memory for (EOPNOTSUPP)."""

from ._objects import unsupported


def udma_to_dev_barrier():
    raise unsupported("DMA barriers")


def udma_from_dev_barrier():
    raise unsupported("DMA barriers")


def mmio_write64_as_be(addr, val):
    raise unsupported("MMIO writes")


def mmio_write32_as_be(addr, val):
    raise unsupported("MMIO writes")
