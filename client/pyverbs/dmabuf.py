"""pyverbs.dmabuf: dma-buf memory is not modelled (EOPNOTSUPP)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "dma-buf memory", "DmaBuf")
