"""ibv_reg_mr of memory that is already shared (provider/tests/shmcheck.c): SysV
segments (UCX's default allocator), MAP_SHARED anonymous memory and a program's own
memfds are handed to the daemon as they are, never moved: a peer's RDMA WRITE is seen
through another mapping of the same memory, an RDMA READ returns what the program put
there. Files their owner can shrink under the daemon (a /dev/shm file, a memfd that
cannot be sealed) are refused EINVAL with a line saying why."""

from __future__ import annotations

import re
import shutil

import native
import pytest

pytestmark = pytest.mark.readme_row("`ibv_reg_mr` of SysV shared memory")

SHMCHECK = native.REPO / "provider" / "build" / "shmcheck"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("shared_memory")) as p:
        yield p


def _shared(output: str, kind: str) -> None:
    for line in ("ibv_reg_mr succeeds", "an RDMA WRITE into it completes (status 0)",
                 "the WRITE's bytes are in the program's mapping (0 differ)",
                 "and in another mapping of the same memory, no copy (0 differ)",
                 "an RDMA READ of it completes (status 0)",
                 "the READ returns what the program wrote through the other mapping "
                 "(0 differ)", "ibv_dereg_mr succeeds"):
        assert f"shmcheck: ok: {kind}: {line}" in output, output
    assert f"shmcheck: ok: {kind}: the mapping is not moved" in output, output


def test_a_sysv_segment_is_registered_in_place(where):
    r = where.run(where.server, [str(SHMCHECK), "sysv"], timeout=30)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    _shared(r.output, "SysV segment")
    assert re.search(r"not moved \(rw-s /SYSV[0-9a-f]{8} \(deleted\),", r.output), r.output


# CAP_SYS_ADMIN is capability 21, CAP_CHECKPOINT_RESTORE 40 (capability.h)
NO_MAP_FILES = ["setpriv", "--bounding-set", "-sys_admin,-checkpoint_restore"]


def test_a_sysv_segment_is_registered_in_place_without_the_privilege(where):
    """A program that cannot open /proc/self/map_files (neither CAP_SYS_ADMIN nor
    CAP_CHECKPOINT_RESTORE, as in a container) has no fd of its segment: the provider
    names it by its shmid and the daemon attaches it itself."""
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) to drop the capabilities")
    r = where.run(where.server, [*NO_MAP_FILES, "sh", "-c",
                                 f"grep ^CapEff /proc/self/status; exec {SHMCHECK} sysv"],
                  timeout=30)
    eff = int(re.search(r"^CapEff:\s+([0-9a-f]+)$", r.output, re.M).group(1), 16)
    assert not eff & (1 << 21 | 1 << 40), r.output
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    _shared(r.output, "SysV segment")
    assert re.search(r"not moved \(rw-s /SYSV[0-9a-f]{8} \(deleted\),", r.output), r.output


def test_shared_anonymous_memory_is_registered_in_place(where):
    r = where.run(where.server, [str(SHMCHECK), "anon"], timeout=30)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    _shared(r.output, "MAP_SHARED|MAP_ANONYMOUS")
    assert "not moved (rw-s /dev/zero (deleted)," in r.output, r.output


def test_a_programs_memfd_is_registered_in_place_and_sealed(where):
    r = where.run(where.server, [str(SHMCHECK), "memfd"], timeout=30)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    _shared(r.output, "a memfd of the program's")
    _shared(r.output, "a memfd of the program's, its fd closed")
    assert "not moved (rw-s /memfd:program-pool (deleted)," in r.output, r.output
    assert "shmcheck: ok: a memfd of the program's: it is now sealed against shrinking" \
        in r.output, r.output
    # F_ADD_SEALS is EPERM on a memfd made without MFD_ALLOW_SEALING (memfd_create(2))
    assert "shmcheck: ok: a memfd without MFD_ALLOW_SEALING: ibv_reg_mr fails: Invalid " \
        "argument" in r.output, r.output
    assert re.search(r"softhca: ibv_reg_mr\(0x[0-9a-f]+, 65336\): EINVAL: the memfd "
                     r"/memfd:unsealable \(deleted\) cannot be sealed against shrinking",
                     r.output), r.output


@pytest.mark.readme_row("`ibv_reg_mr` of a stack buffer")
def test_a_file_its_owner_can_shrink_is_refused_with_a_reason(where):
    r = where.run(where.server, [str(SHMCHECK), "file"], timeout=30)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    assert "shmcheck: ok: a /dev/shm file: ibv_reg_mr fails: Invalid argument" in r.output
    assert re.search(r"softhca: ibv_reg_mr\(0x[0-9a-f]+, 65336\): EINVAL: the pages are "
                     r"a MAP_SHARED mapping of /dev/shm/shmcheck-\d+ \(deleted\), a file "
                     r"its owner can shrink under the daemon", r.output), r.output
