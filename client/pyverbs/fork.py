"""pyverbs.fork: ibv_fork_init(3). softhca keeps no memory in this process that a fork
could disturb (MR buffers live in the daemon), so there is nothing for fork_init to
protect, and the parent's objects keep working after a fork.

The child of fork(2) starts softhca's bridge afresh (client/pyverbs/_sync.py): it opens
its own Context and makes its own PDs, CQs, QPs, MRs and rdma_cm ids, which work as
the parent's do and connect to the parent's. The objects the parent made are the
parent's, as without fork support in rdma-core: a verb on one in the child raises
PyverbsRDMAError with errno EIO, and closing or collecting it in the child only drops
the child's copy, never the parent's object, session or socket."""

_initialized = False


def fork_init():
    global _initialized
    _initialized = True
    return 0


def is_fork_initialized():
    from .enums import IBV_FORK_ENABLED, IBV_FORK_UNNEEDED

    return IBV_FORK_ENABLED if _initialized else IBV_FORK_UNNEEDED
