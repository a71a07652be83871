"""softhca's pyverbs: rdma-core's pyverbs API (module paths, classes, keywords, defaults,
return shapes, exceptions, enums), synchronous, over softhca's async client.

It is imported as ``pyverbs`` through the alias package that ``softhca pyverbs path``
prints (client/pyverbs_path/pyverbs); inside softhca it is ``softhca.client.pyverbs``.
The daemon is ``SOFTHCA_TARGET`` (and ``SOFTHCA_TOKEN_FILE``), or an embedded one with
a device ``mlx5_0``. What softhca does not model raises PyverbsRDMAError(EOPNOTSUPP).
"""

# Every module of the package, for the alias package to register under ``pyverbs.``.
MODULES = (
    "pyverbs_error", "base", "enums", "cm_enums", "utils", "addr", "device", "pd", "mr",
    "cq", "wr", "qp", "srq", "xrcd", "wq", "flow", "spec", "cmid", "dmabuf", "fork",
    "mem_alloc", "dma_util", "providers", "providers.mlx5", "providers.mlx5.mlx5_enums",
    "providers.mlx5.mlx5dv", "providers.mlx5.mlx5dv_mkey", "providers.mlx5.mlx5dv_crypto",
    "providers.mlx5.mlx5dv_objects", "providers.mlx5.mlx5dv_flow",
    "providers.mlx5.mlx5dv_sched", "providers.mlx5.mlx5_vfio", "providers.mlx5.dr_action",
    "providers.mlx5.dr_domain", "providers.mlx5.dr_matcher", "providers.mlx5.dr_rule",
    "providers.mlx5.dr_table", "providers.efa", "providers.efa.efa_enums",
    "providers.efa.efadv",
    # v59 names of the enum modules (enums, cm_enums are the v44 ones)
    "libibverbs_enums", "librdmacm_enums",
    # v55 on
    "providers.mlx5.mlx5dv_dmabuf",
)
