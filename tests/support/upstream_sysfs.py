"""A private view of /sys/class/infiniband for the upstream run, as on a host where
softhca's devices were registered with the kernel: rdma-core's tests from v55 on read a
port's P_Key with ``cat /sys/class/infiniband/<dev>/ports/<port>/pkeys/<index>``
(test_device.test_get_pkey_index). The tree holds just that, from softhca's own answer
(pyverbs' query_pkey), and no ``device/`` directory, so the tests still find no netdev,
PCI device or SR-IOV function, as before.

It exists only in the run's private mount namespace (``unshare --mount``): a tmpfs over
/sys/class carrying bind mounts of the real entries, plus ``infiniband``; the host's
/sys is never written, as with ``softhca run``'s /dev (tools/native.py). Without root or
unshare, ``wrap`` returns None and the run goes without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

_SCRIPT = r"""
tree=$1; shift
old=$(mktemp -d)
mount --bind /sys/class "$old" || exit 97
mount -t tmpfs -o mode=0755 softhca-sys-class /sys/class || exit 97
for e in "$old"/*; do
  n=${e##*/}; mkdir "/sys/class/$n" && mount --rbind "$e" "/sys/class/$n"
done
[ -e /sys/class/infiniband ] || mkdir /sys/class/infiniband
mount --bind "$tree" /sys/class/infiniband || exit 97
umount -l "$old"; rmdir "$old"
exec "$@"
"""


def write_tree(root: Path, devices: dict[str, int]) -> Path:
    """``root``/<dev>/ports/1/pkeys/0 holding each device's P_Key 0 (sysfs' 0x%04x)."""
    for dev, pkey in devices.items():
        d = root / dev / "ports" / "1" / "pkeys"
        d.mkdir(parents=True, exist_ok=True)
        (d / "0").write_text(f"0x{pkey:04x}\n")
    return root


def wrap(tree: Path) -> list[str] | None:
    """The command prefix that runs a program with the view, or None when it cannot be
    made here (not root, no unshare, mounts refused)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return None
    prefix = [unshare, "--mount", "--propagation", "private", "sh", "-c", _SCRIPT, "sh",
              str(tree)]
    seen = [f"/sys/class/infiniband/{p.relative_to(tree)}" for p in tree.glob("*/ports/1/pkeys/0")]
    probe = subprocess.run([*prefix, "cat", *seen], capture_output=True, text=True, timeout=60)
    return prefix if probe.returncode == 0 else None
