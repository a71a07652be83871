"""``pyverbs`` as softhca's: the directory ``softhca pyverbs path`` prints holds only this
package, put first on PYTHONPATH so that ``import pyverbs`` (and every ``pyverbs.x``
module) is softhca.client.pyverbs.

It lives as data inside the softhca distribution, never installed as a top-level
package, so it cannot shadow a real rdma-core installation unless asked to. The modules
are registered under their ``pyverbs.`` names here rather than imported by relative
paths, because the implementation belongs to softhca's tower (softhca.client).
"""

import importlib
import sys

_impl = importlib.import_module("softhca.client.pyverbs")
for _name in _impl.MODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"{_impl.__name__}.{_name}")
_impl.__path__ = list(_impl.__path__)
sys.modules[__name__] = _impl
