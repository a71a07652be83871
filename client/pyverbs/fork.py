"""pyverbs.fork: ibv_fork_init(3). softhca keeps no memory in this process that a fork
could disturb (MR buffers live in the daemon), so fork is always safe."""

_initialized = False


def fork_init():
    global _initialized
    _initialized = True
    return 0


def is_fork_initialized():
    from .enums import IBV_FORK_ENABLED, IBV_FORK_UNNEEDED

    return IBV_FORK_ENABLED if _initialized else IBV_FORK_UNNEEDED
