"""The threads softhca's libraries start in a program (the provider's reader, our
librdmacm's reader) block every signal, so that a signal the program sends itself, and
blocks in its own threads, stays pending for them: tgtd blocks SIGUSR2 in its threads
and raises it for its event loop; a library thread with it unblocked took it, and
tgtd died of it. provider/tests/sigcheck.c prints each such thread's SigBlk against a
thread of its own started with a full mask, then sends itself SIGUSR2 (blocked in
main, with a handler)."""

from __future__ import annotations

import re

import native
import pytest

SIGCHECK = native.REPO / "provider" / "build" / "sigcheck"
CM_LIB = native.REPO / "provider" / "build" / "librdmacm.so.1"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    for built in (SIGCHECK, CM_LIB):
        if not built.is_file():
            pytest.skip(f"{built} is not built: `make provider` builds it")
    with native.place(tmp_path_factory.mktemp("threads")) as p:
        yield p


def test_library_threads_block_every_signal(where):
    r = where.run(where.server, [str(SIGCHECK)], timeout=60)
    print(r.output)
    assert r.returncode == 0, r.output
    threads = re.findall(r"^thread (\d+) SigBlk ([0-9a-f]+) (\S+)", r.output, re.M)
    # The provider's reader (the device's session) and librdmacm's (its own session).
    assert len(threads) >= 2, r.output
    assert re.search(rf"^threads {len(threads)}$", r.output, re.M), r.output
    assert all(verdict == "full" for _, _, verdict in threads), r.output
    # Sent to the process, SIGUSR2 found no thread to take it: pending, never handled.
    assert "SIGUSR2 pending, handler ran 0 times" in r.output, r.output
