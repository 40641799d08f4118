"""vLLM's tier types when vLLM is installed, stand-ins of vLLM 0.33's otherwise.

The stand-ins let :func:`kvtier.vllm.build_tier_config` and the namespace helpers run
where vLLM is absent (a configuration tool, a test without vLLM); with vLLM installed
every name here is vLLM's own class, so results and events cross into vLLM unchanged.
The interface check says what an installed vLLM lacks of the interface the adapter
implements, so a mismatch fails at construction instead of deep inside a step.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import inspect
import logging
from typing import Any

logger = logging.getLogger("kvtier.vllm")

#: vLLM releases this adapter is tested with (their tier interface is the one implemented).
TESTED_VLLM_VERSIONS = ("0.33.0",)

TIERING_MODULE = "vllm.v1.kv_offload.tiering.base"
OFFLOAD_MODULE = "vllm.v1.kv_offload.base"


def _import_vllm() -> Any:
    try:
        return importlib.import_module(TIERING_MODULE)
    except ImportError:
        return None


_vllm_tiering = _import_vllm()
#: True when this module runs inside an installed vLLM (and subclasses its base class).
HAVE_VLLM = _vllm_tiering is not None


class _LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class _Medium(enum.Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class _Locality(enum.Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclasses.dataclass
class _JobResult:
    job_id: int
    success: bool
    successful_keys: Any = None
    transfer_time: float | None = None
    transfer_bytes: int | None = None


@dataclasses.dataclass
class _OffloadingEvent:
    keys: list
    medium: Any
    removed: bool
    locality: Any = None


@dataclasses.dataclass
class _RequestOffloadingContext:
    policy: Any = None


@dataclasses.dataclass
class _ReqContext:
    req_id: str
    kv_transfer_params: dict | None = None


@dataclasses.dataclass
class _TransferJob:
    job_id: int
    keys: Any
    chunk_ids: Any
    is_promotion: bool = False
    req_context: Any = None


class _StandInBase:
    """vLLM 0.33's SecondaryTierManager defaults, for importing without vLLM."""

    def __init__(self, offloading_spec: Any, primary_kv_view: Any, tier_type: str, backpressure_detector: Any = None):
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = None
        self._bp_detector = backpressure_detector

    @property
    def bp_detector(self) -> Any:
        return self._bp_detector


if HAVE_VLLM:
    _offload = importlib.import_module(OFFLOAD_MODULE)
    SecondaryTierBase = _vllm_tiering.SecondaryTierManager
    LookupResult = _offload.LookupResult
    Medium = _offload.Medium
    Locality = _offload.Locality
    OffloadingEvent = _offload.OffloadingEvent
    ReqContext = _offload.ReqContext
    RequestOffloadingContext = _offload.RequestOffloadingContext
    JobResult = _vllm_tiering.JobResult
    TransferJob = _vllm_tiering.TransferJob
else:
    SecondaryTierBase = _StandInBase
    LookupResult = _LookupResult
    Medium = _Medium
    Locality = _Locality
    OffloadingEvent = _OffloadingEvent
    ReqContext = _ReqContext
    RequestOffloadingContext = _RequestOffloadingContext
    JobResult = _JobResult
    TransferJob = _TransferJob


def vllm_version() -> str | None:
    """The installed vLLM's version, or None without vLLM."""
    if not HAVE_VLLM:
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return getattr(importlib.import_module("vllm"), "__version__", "unknown")


def interface_mismatch() -> str | None:
    """What the installed vLLM's tier interface lacks of the one this adapter implements
    (vLLM 0.33's), or None when it matches or vLLM is not installed."""
    if not HAVE_VLLM:
        return None
    missing = []
    init = inspect.signature(SecondaryTierBase.__init__).parameters
    if "backpressure_detector" not in init:
        missing.append("SecondaryTierManager.__init__(backpressure_detector=...)")
    for cls, field_names in (
        (JobResult, ("job_id", "success", "successful_keys", "transfer_time", "transfer_bytes")),
        (TransferJob, ("job_id", "keys", "chunk_ids", "is_promotion", "req_context")),
    ):
        names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        missing += [f"{cls.__name__}.{n}" for n in field_names if n not in names]
    for name in ("MISS", "HIT", "RETRY"):
        if name not in LookupResult.__members__:
            missing.append(f"LookupResult.{name}")
    for name in ("has_pending_work", "touch", "build_metric_definitions", "get_stats", "config_info_keys", "config_info"):
        if not hasattr(SecondaryTierBase, name):
            missing.append(f"SecondaryTierManager.{name}")
    return ", ".join(missing) or None


_warned_untested = False


def check_vllm() -> None:
    """Fails with a clear message on a vLLM whose tier interface this adapter does not know."""
    global _warned_untested
    problem = interface_mismatch()
    if problem is not None:
        raise RuntimeError(
            f"kvtier.vllm implements the secondary-tier interface of vLLM 0.33 (tested with "
            f"{', '.join(TESTED_VLLM_VERSIONS)}); the installed vLLM {vllm_version()} lacks {problem}. "
            "Use a tested vLLM version."
        )
    version = vllm_version()
    if HAVE_VLLM and version not in TESTED_VLLM_VERSIONS and not _warned_untested:
        _warned_untested = True
        logger.warning(
            "kvtier.vllm is tested with vLLM %s; vLLM %s has the same tier interface but is untested",
            ", ".join(TESTED_VLLM_VERSIONS),
            version,
        )
