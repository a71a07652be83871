"""pyverbs.fork: ibv_fork_init(3). softhca keeps no memory in this process that a fork
could disturb (MR buffers live in the daemon), so there is nothing for fork_init to
protect, and the parent's objects keep working after a fork.

The child is another matter: every call runs on an event loop in a thread of the
process that made the first Context, and fork(2) copies only the calling thread. Once
the parent has used pyverbs, a forked child's verbs (on the parent's objects or on a
Context of its own) raise PyverbsRDMAError with errno EIO saying so, rather than waiting
for a loop that no thread runs. A child started with exec (multiprocessing's "spawn"),
or forked before the parent's first Context, has its own loop and works."""

_initialized = False


def fork_init():
    global _initialized
    _initialized = True
    return 0


def is_fork_initialized():
    from .enums import IBV_FORK_ENABLED, IBV_FORK_UNNEEDED

    return IBV_FORK_ENABLED if _initialized else IBV_FORK_UNNEEDED
