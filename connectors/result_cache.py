"""The result cache's store: computed outputs, keyed by a hash of what determines them.

A **key** (:func:`cache_key`) is a blake2b-128 digest of the model name, the full
``model_version`` (``label/sha256:…[/runtime-precision]``: weights, runtime and
precision) and every input tensor's name, dtype, shape and bytes, each field
length-prefixed so no two inputs hash the same bytes. A new version, precision or
runtime is a new key: an entry is never read across versions. Under the ``owner`` scope
(``--cache-scope``, the default) the request's owner is hashed too, so one tenant never
reads what another computed: a hit would tell it that someone sent those exact inputs.

An **entry** (:class:`CacheEntry`) is a msgpack map ``{"v": 1, "model_version",
"outputs", "compute_s"}``: the outputs in the tensor codec, the version that computed
them and the per-row compute time of the batch they came from (what a hit saves).

:class:`RedisResultCache` keeps entry ``{ns}:cache:{digest}`` as a plain string with a
TTL. A batch costs one ``MGET`` for its lookups and one pipeline of ``SET … EX`` for its
new entries. Driver errors come out as ``ResultStoreError``; an entry that does not
decode reads as a miss.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any, Final

import msgpack
import numpy as np
import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.values import CacheEntry
from batchfleet.schemas.errors import ConfigError, ResultStoreError, SchemaError
from batchfleet.schemas.names import Names
from batchfleet.schemas.tensors import Array, Tensors, decode_tensors, encode_tensors

ENTRY_VERSION: Final = 1
#: Bumped when the key's layout changes, so old entries are simply never read again.
_KEY_DOMAIN: Final = b"batchfleet-result-cache/1"


def _field(h: Any, data: bytes | memoryview) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _tensor(h: Any, name: str | None, array: Array) -> None:
    _field(h, b"\x00" if name is None else b"\x01" + name.encode())
    _field(h, array.dtype.str.encode())
    _field(h, ",".join(map(str, array.shape)).encode())
    _field(h, np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


#: The ``model_version`` a version-free key hashes instead of a real one (those are
#: ``label/sha256:…``, never this): the fallback ``cache`` step's entries, kept beside the
#: versioned ones and written only for models whose chain has that step
#: (docs/degradation.md). The entry itself names the version that computed it.
ANY_VERSION: Final = "*any-version*"

#: ``scope`` of :func:`cache_key`: one scope per owner (the default), or one for everyone.
SCOPE_OWNER: Final = "owner"
SCOPE_SHARED: Final = "shared"
SCOPES: Final = (SCOPE_OWNER, SCOPE_SHARED)


def cache_key(model: str, model_version: str, inputs: Tensors, *,
              owner: str | None = None, scope: str = SCOPE_OWNER) -> str:
    """The entry's digest (32 hex characters) for these inputs on this exact version.

    ``scope="owner"`` hashes ``owner`` as well (requests with no owner share one scope
    among themselves); ``"shared"`` leaves it out, the key every owner shares. The owner
    field starts with a byte (2 or 3) no tensor field starts with (0 or 1), so an owned
    key never equals a shared one.

    ``dtype.str`` carries the byte order, so float32 and float64 (or ``<f4`` and ``>f4``)
    never share a key, and the shape is hashed beside the bytes, so a (2, 5) and a
    (10,) array of the same bytes differ too.
    """
    h = hashlib.blake2b(digest_size=16)
    _field(h, _KEY_DOMAIN)
    _field(h, model.encode())
    _field(h, model_version.encode())
    if scope == SCOPE_OWNER:
        _field(h, b"\x03" if owner is None else b"\x02" + owner.encode())
    elif scope != SCOPE_SHARED:
        raise ConfigError(f"cache scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if isinstance(inputs, dict):
        for name in sorted(inputs):
            _tensor(h, name, inputs[name])
    else:
        _tensor(h, None, inputs)
    return h.hexdigest()


def encode_entry(entry: CacheEntry) -> bytes:
    return msgpack.packb({  # type: ignore[no-any-return]
        "v": ENTRY_VERSION, "model_version": entry.model_version,
        "outputs": encode_tensors(entry.outputs), "compute_s": float(entry.compute_s)},
        use_bin_type=True)


def decode_entry(raw: bytes) -> CacheEntry | None:
    """The entry, or None when the bytes are not one this version reads (a miss)."""
    try:
        obj = msgpack.unpackb(raw, raw=False)
        if not isinstance(obj, dict) or obj.get("v") != ENTRY_VERSION:
            return None
        version, seconds = obj.get("model_version"), obj.get("compute_s", 0.0)
        if not isinstance(version, str) or not isinstance(seconds, int | float) \
                or isinstance(seconds, bool) or not math.isfinite(seconds):
            return None
        return CacheEntry(version, decode_tensors(obj.get("outputs"), "outputs"),
                          max(0.0, float(seconds)))
    except (ValueError, SchemaError, msgpack.UnpackException):
        return None


class RedisResultCache:
    """The ``ResultCache`` seam on Redis: one MGET per lookup, one pipeline per store."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._prefix = f"{names.plane}:cache:"

    def key(self, digest: str) -> str:
        return self._prefix + digest

    @wrap_errors(ResultStoreError, "cannot read the result cache")
    async def get_many(self, digests: Sequence[str]) -> list[CacheEntry | None]:
        if not digests:
            return []
        raw = await self._redis.mget([self.key(d) for d in digests])
        return [decode_entry(r) if isinstance(r, bytes) else None for r in raw]

    @wrap_errors(ResultStoreError, "cannot write the result cache")
    async def put_many(self, entries: Sequence[tuple[str, CacheEntry]], ttl_s: int) -> None:
        if not entries or ttl_s <= 0:
            return
        pipe = self._redis.pipeline(transaction=False)
        for digest, entry in entries:
            pipe.set(self.key(digest), encode_entry(entry), ex=ttl_s)
        await pipe.execute()
