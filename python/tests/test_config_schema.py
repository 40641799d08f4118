"""Every key the library publishes (``kvt_config_schema``) works through the vLLM drop-in.

The cases are generated from the schema, so a key added to the library is tested here
without a change to this file, and a key the drop-in cannot pass down (the bug where
``transfer_thread_nice`` landed inside ``store``) fails. The C ABI and the command line
are checked the same way by ``cli/tests/config_schema.rs``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import kvtier
from kvtier.vllm import config as vllm_config

#: Top-level keys vLLM's own keywords set (prefix, enable_kv_events, locality) or the
#: adapter derives (namespace); they are not part of ``store_config``.
KEYWORD_KEYS = {"prefix", "namespace", "enable_kv_events", "locality"}

#: How a check refuses a keyring it cannot read (a qemu-user emulator reports a missing
#: program as a command that failed).
KEYRING_UNREAD = (
    "encryption: cannot read the keyring file ",
    "encryption: the keyring variable ",
    "encryption: cannot run the keyring command ",
    "encryption: the keyring command ",
)


def schema_keys() -> list[dict]:
    return kvtier.config_schema()["keys"]


def sample(entry: dict):
    """A valid value of a key: its default, else its example, else its first allowed value."""
    if entry["default"] is not None:
        return entry["default"]
    if entry.get("example") is not None:
        return entry["example"]
    if entry["allowed"]:
        return entry["allowed"][0]
    by_type = {"integer": 1, "number": 1, "boolean": True, "string": "x"}
    assert entry["type"] in by_type, f"{entry['key']}: no sample for type {entry['type']}"
    return by_type[entry["type"]]


def wrong(entry: dict):
    return {"integer": "not-a-number", "boolean": 2.5, "string": 12, "object": "not-an-object"}.get(entry["type"])


def base_store_config(store_type: str) -> dict:
    """vLLM's ``store_config`` for a store type: its type and its required keys."""
    config = {"type": store_type}
    for entry in schema_keys():
        if entry["store"] == store_type and entry["required"]:
            config[entry["key"].removeprefix("store.")] = sample(entry)
    return config


def with_key(store_config: dict, entry: dict, value) -> dict:
    """``store_config`` with a key set the way a vLLM user writes it: store keys and tier
    keys side by side, nested tier keys (``eviction.max_bytes``) inside their object."""
    config = json.loads(json.dumps(store_config))
    name = entry["key"].removeprefix("store.")
    if entry["store"] is None and "." in name:
        parent, child = name.split(".", 1)
        parent_entry = next(e for e in schema_keys() if e["key"] == parent)
        seed = dict(sample(parent_entry))
        if child.startswith("keyring_"):
            # The keyring's sources are alternatives (exactly one): the one being set
            # replaces the one the parent's sample names.
            seed = {k: v for k, v in seed.items() if not k.startswith("keyring_")}
        config.setdefault(parent, seed)[child] = value
    else:
        config[name] = value
    return config


def cases() -> list[tuple[str, dict]]:
    cases = []
    for entry in schema_keys():
        if entry["key"] in ("store", "store.type") or entry["key"] in KEYWORD_KEYS:
            continue
        for store_type in [entry["store"]] if entry["store"] else kvtier.config_schema()["store_types"]:
            cases.append((store_type, entry))
    return cases


def test_the_schema_documents_every_key():
    keys = schema_keys()
    assert len(keys) > 40
    undocumented = [e["key"] for e in keys if len(e["doc"].strip()) < 10]
    assert not undocumented, f"keys without docs: {undocumented}"
    tier_keys = {e["key"].split(".")[0] for e in keys if e["store"] is None} - {"store"}
    # Every tier key reaches the tier, from store_config or from vLLM's keywords.
    assert tier_keys - KEYWORD_KEYS == set(vllm_config.TIER_KEYS)
    assert {"transfer_thread_nice", "separate_lookup_lane"} <= vllm_config.TIER_KEYS


@pytest.mark.parametrize(
    "store_type,entry", [pytest.param(s, e, id=f"{s}:{e['key']}") for s, e in cases()]
)
def test_every_key_passes_through_the_vllm_store_config(store_type, entry):
    store_config = with_key(base_store_config(store_type), entry, sample(entry))
    config = vllm_config.build_tier_config(store_config, prefix="kv", enable_kv_events=True, locality="REMOTE")
    try:
        kvtier.check_config(config)  # raises ConfigError with the library's message
    except kvtier.ConfigError as e:
        # The check reads the keyring as a tier's start does, once the keys are accepted:
        # an encryption key's sample names a keyring file, variable or command this
        # machine lacks, and only that read may fail.
        unread = e.message.removeprefix("configuration error: ").startswith(KEYRING_UNREAD)
        if not (entry["key"].startswith("encryption") and unread):
            raise
    # The key landed where the library reads it.
    if entry["store"] is None:
        top = entry["key"].split(".")[0]
        assert top in config and top not in config["store"], config
    else:
        name = entry["key"].removeprefix("store.")
        # vLLM leaves out empty credentials and regions, as the library's default.
        assert name in config["store"] or sample(entry) == "", config


@pytest.mark.parametrize(
    "store_type,entry",
    [pytest.param(s, e, id=f"{s}:{e['key']}") for s, e in cases() if wrong(e) is not None and s in ("local", "s3")],
)
def test_a_bad_value_is_refused_naming_the_key_path(store_type, entry):
    store_config = with_key(base_store_config(store_type), entry, wrong(entry))
    config = vllm_config.build_tier_config(store_config, prefix="kv")
    with pytest.raises(kvtier.ConfigError) as raised:
        kvtier.check_config(config)
    assert entry["key"] in str(raised.value), str(raised.value)


def test_check_config_takes_text_and_refuses_malformed_json():
    kvtier.check_config('{"store": {"type": "memory"}}')
    with pytest.raises(kvtier.ConfigError):
        kvtier.check_config('{"store": ')


def test_stats_fields_name_every_counter_of_a_tier():
    fields = kvtier.stats_fields()
    assert all(len(help_text) > 5 for _, help_text in fields)
    with kvtier.Tier({"store": {"type": "memory"}}) as tier:
        assert [name for name, _ in fields] == list(tier.stats())


def test_the_readme_keys_start_vllm_through_its_own_factory(tmp_path):
    """The issue's report, as a vLLM user hits it: README keys in ``store_config`` of a
    ``secondary_tiers`` entry, constructed by vLLM's factory and used for a round trip."""
    pytest.importorskip("vllm", reason="needs vLLM (scripts/install-tools.sh installs it)")
    from vllm.v1.kv_offload.base import LookupResult, make_offload_key
    from vllm_engine import Engine

    store_config = {
        "type": "local",
        "path": str(tmp_path / "store"),
        "transfer_thread_nice": 1,
        "separate_lookup_lane": False,
        "max_inflight_lookups": 8,
        "eviction": {"max_bytes": 1 << 30, "interval_ms": 3_600_000},
    }
    entry = {"type": "KvtierTier", "module_path": "kvtier.vllm", "store_config": store_config, "prefix": "kv"}
    keys = [make_offload_key(hashlib.sha256(f"readme-{i}".encode()).digest(), 0) for i in range(3)]
    writer = Engine([entry])
    try:
        (tier,) = writer.tiers
        assert str(tmp_path / "store") in tier._tier.location
        blocks = {k: np.full(writer.pool.shape[1], i + 1, dtype=np.uint8) for i, k in enumerate(keys)}
        writer.store("w", blocks)
        writer.settle()
        assert tier.kvtier_stats()["keys_stored"] == 3
    finally:
        writer.shutdown()
    reader = Engine([entry])
    try:
        assert set(reader.promote(keys, "r").values()) == {LookupResult.HIT}
        for key, row in zip(keys, reader.read(keys, "r")):
            assert np.array_equal(row, blocks[key])
    finally:
        reader.shutdown()
