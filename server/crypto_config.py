"""The crypto configuration a daemon's devices start with (docs/crypto-import.md).

``softhca serve --crypto-config FILE``, ``softhca.client.embedded(crypto_config=...)``
and, for embedded daemons given none, the environment variable ``SOFTHCA_CRYPTO_CONFIG``
name it: a JSON object such as ``{"mode": "wrapped"}`` (see DeviceCrypto.from_dict).
Without one a device is in plaintext import method.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..engine.crypto_login import DeviceCrypto

ENV_VAR = "SOFTHCA_CRYPTO_CONFIG"


class CryptoConfigError(ValueError):
    """The crypto configuration cannot be read or is not a valid one."""


def load_crypto_config(source: DeviceCrypto | dict | str | os.PathLike) -> DeviceCrypto:
    """A DeviceCrypto from itself, its JSON dict, a JSON file's path, or JSON text
    (a string starting with '{', as an environment variable may hold it)."""
    if isinstance(source, DeviceCrypto):
        return source
    where = "crypto configuration"
    if isinstance(source, (str, os.PathLike)) and not str(source).lstrip().startswith("{"):
        where = f"crypto configuration {os.fspath(source)}"
        try:
            source = Path(source).read_text()
        except OSError as e:
            raise CryptoConfigError(f"cannot read {where}: {e.strerror}") from None
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            raise CryptoConfigError(f"{where} is not JSON: {e}") from None
    try:
        return DeviceCrypto.from_dict(source)
    except ValueError as e:
        raise CryptoConfigError(f"{where}: {e}") from None


def crypto_config_from_env(environ: dict | None = None) -> DeviceCrypto | None:
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    if not value:
        return None
    try:
        return load_crypto_config(value)
    except CryptoConfigError as e:
        raise CryptoConfigError(f"{ENV_VAR}: {e}") from None
