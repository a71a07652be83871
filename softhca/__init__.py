"""softhca: a software mlx5-class RDMA HCA (README.md).

The package holds five subpackages, bottom to top: ``softhca.protocol``,
``softhca.engine``, ``softhca.server`` (the daemon), ``softhca.client`` (the
application API, ``import softhca.client as sh``) and ``softhca.tools`` (the
``softhca`` command, ``python -m softhca``). This module itself loads none of them:

- ``__version__``: the installed distribution's version (pyproject.toml's);
- ``pyverbs_path()``: the directory to put first on ``sys.path`` (or ``PYTHONPATH``) for
  ``import pyverbs`` to be softhca's pyverbs, as ``softhca pyverbs path`` prints it.
"""

from __future__ import annotations

from pkgutil import extend_path

__all__ = ["__version__", "pyverbs_path"]

# This folder is the package ``softhca`` only when it is installed; in a source tree it
# sits beside the five folders it names, not above them. ``python -m softhca`` run from
# the repository root finds this folder first (the current directory leads sys.path), and
# without this line ``softhca.tools`` would be looked for in it alone, missing the
# installed copy of a regular (non-editable) install. With it, the subpackages are found
# in every ``softhca`` folder on sys.path: the installed one's. An editable install maps
# them by its own finder and needs none of this.
__path__ = extend_path(__path__, __name__)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("softhca")
    except PackageNotFoundError:    # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    # ``__version__`` looked up when first asked for, then kept: every ``softhca`` command
    # imports this package, and the metadata lookup was some 30 ms of each start.
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pyverbs_path() -> str:
    """The directory whose ``pyverbs`` package is softhca's pyverbs (rdma-core's API over
    softhca.client): put it first on ``sys.path`` or ``PYTHONPATH``. It is never installed
    as a top-level ``pyverbs``, so an rdma-core installation stays untouched. Without
    SOFTHCA_TARGET (and SOFTHCA_TOKEN_FILE) pyverbs code then starts a daemon embedded in
    its process, with one device, mlx5_0."""
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("softhca.client")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("softhca.client is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))).resolve() / "pyverbs_path")
