"""kvtier: a secondary KV-cache tier on object storage, from Python.

* :class:`Tier` is the thin binding of the C ABI (``include/kvtier.h``).
* :mod:`kvtier.vllm` is a drop-in secondary tier for vLLM's tiered KV offloading
  (imported separately; it imports vLLM itself when vLLM is installed).

The native library is found through ``KVTIER_LIBRARY``, else the copy bundled by
``pip install``, else the Cargo build of the source tree (``target/release``).
"""

from .errors import (
    AuthError,
    BlockBusyError,
    UndecryptableError,
    BucketNotFoundError,
    CancelledError,
    ConfigError,
    ConnectError,
    CorruptError,
    DuplicateJobError,
    ForkedError,
    InvalidArgumentError,
    KvtierError,
    LengthMismatchError,
    NotFoundError,
    NullArgumentError,
    PanicError,
    PermissionDeniedError,
    ShutDownError,
    StateError,
    Status,
    StorageIOError,
    TimedOutError,
    TlsError,
)
from ._schema import check_config, config_schema, stats_fields
from .tier import (
    DEFAULT_KEY_BYTES,
    KEY_GROUP_BYTES,
    MAX_KEYS_PER_JOB,
    MAX_RANGES_PER_JOB,
    MAX_RANGES_PER_KEY,
    Event,
    JobKind,
    JobOutcome,
    Locality,
    LookupResult,
    Tier,
    library_path,
    status_str,
    version,
    vllm_namespace,
)

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "BlockBusyError",
    "UndecryptableError",
    "BucketNotFoundError",
    "CancelledError",
    "ConfigError",
    "ConnectError",
    "CorruptError",
    "DEFAULT_KEY_BYTES",
    "DuplicateJobError",
    "Event",
    "ForkedError",
    "InvalidArgumentError",
    "JobKind",
    "JobOutcome",
    "KEY_GROUP_BYTES",
    "KvtierError",
    "LengthMismatchError",
    "Locality",
    "LookupResult",
    "MAX_KEYS_PER_JOB",
    "MAX_RANGES_PER_JOB",
    "MAX_RANGES_PER_KEY",
    "NotFoundError",
    "NullArgumentError",
    "PanicError",
    "PermissionDeniedError",
    "ShutDownError",
    "StateError",
    "Status",
    "StorageIOError",
    "Tier",
    "check_config",
    "config_schema",
    "TimedOutError",
    "TlsError",
    "library_path",
    "stats_fields",
    "status_str",
    "version",
    "vllm_namespace",
]
