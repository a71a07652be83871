"""pyverbs.providers.mlx5.mlx5dv_dmabuf (rdma-core v55 on): dma-buf MRs are not
modelled (EOPNOTSUPP), as pyverbs.dmabuf."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "dma-buf memory (mlx5dv_reg_dmabuf_mr)", "Mlx5DmaBufMR")
