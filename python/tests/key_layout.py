"""kvtier's key layout, restated independently for the tests (``core/src/key.rs``,
docs/stores.md, "Key layout"): where a key's object is, for the checks that read objects
straight from a store.
"""

from __future__ import annotations


def object_name(prefix: str, namespace: str, key: bytes) -> str:
    """kvtier's (and vLLM's obj tier's) object name of ``key``:
    ``<prefix>/<namespace>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin``, where ``h`` is the hex of
    the block hash (the key without its 4-byte big-endian group index); empty segments
    are dropped, so there is no leading or doubled slash."""
    key = bytes(key)
    h = key[:-4].hex()
    group = int.from_bytes(key[-4:], "big")
    parts = [p for p in (*prefix.split("/"), *namespace.split("/")) if p]
    parts += [p for p in (h[0:3], f"{h[3:5]}_g{group}") if p]
    return "/".join(parts + [f"{h}.bin"])
