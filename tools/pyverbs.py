"""``softhca pyverbs path``: the directory to put first on PYTHONPATH so that
``import pyverbs`` is softhca's pyverbs (softhca.client.pyverbs) and existing pyverbs
code, rdma-core's tests included, runs unchanged on softhca."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import pyverbs_path


def path() -> Path:
    """softhca.pyverbs_path(), the public function, as a Path."""
    return Path(pyverbs_path())


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pyverbs", help="run pyverbs code unchanged on softhca",
                       description="softhca's synchronous pyverbs (rdma-core's API over "
                       "softhca's client). 'path' prints the directory to put first on "
                       "PYTHONPATH; pyverbs code then uses the daemon at SOFTHCA_TARGET "
                       "(token: SOFTHCA_TOKEN_FILE), or an embedded daemon with a device "
                       "mlx5_0 started in the process.")
    p.add_argument("what", choices=["path"], help="'path': print the directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(path())
    return 0
