"""Run one of rdma-core's rdma_cm test flows (its tests/rdmacm_utils.py connection class,
unmodified) with its two players in two threads of this process, where its own
base.py forks two processes: a threading.Barrier and a queue.Queue stand where it
passes multiprocessing's. The flow's steps (events, QPs, traffic, checks) are upstream's
own; only how the players are started differs.

    python upstream_cm_threads.py TESTS_DIR IP udp

TESTS_DIR is a release's ``tests`` directory; run with ``softhca pyverbs path`` on
PYTHONPATH. Prints ``OK`` or the players' tracebacks; the exit status is 0 on OK.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from pathlib import Path


def _udp_port_space():
    try:                                    # v44, v55
        import pyverbs.cm_enums as ce

        return ce.RDMA_PS_UDP
    except ImportError:                     # v59 names its enums' modules anew
        from pyverbs.librdmacm_enums import rdma_port_space

        return rdma_port_space.RDMA_PS_UDP


def main(argv: list[str]) -> int:
    tests, ip, flow = argv
    if flow != "udp":
        print(f"unknown flow {flow!r}")
        return 2
    # upstream's tests package imports its args_parser as a top-level module, and parses
    # sys.argv: only the program's name is left there
    sys.path[:0] = [str(Path(tests).parent), tests]
    sys.argv[1:] = []
    from tests.rdmacm_utils import CMAsyncConnection

    syncer, notifier, errors = threading.Barrier(2, timeout=15), queue.Queue(), []

    def play(passive: bool) -> None:
        try:
            player = CMAsyncConnection(ip_addr=ip, syncer=syncer, notifier=notifier,
                                       passive=passive, port_space=_udp_port_space(),
                                       ib_port=1)
            player.establish_connection()
            player.rdmacm_traffic()
            player.disconnect()
        except BaseException:
            errors.append(("passive" if passive else "active", traceback.format_exc()))
            syncer.abort()          # the other player stops waiting for this one

    players = [threading.Thread(target=play, args=(side,), daemon=True)
               for side in (True, False)]
    for t in players:
        t.start()
    for t in players:
        t.join(30)
    if any(t.is_alive() for t in players):
        print("a player is stuck after 30 s")
        return 1
    for side, tb in errors:
        print(f"{side} player:\n{tb}")
    if errors:
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
