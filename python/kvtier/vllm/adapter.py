"""The vLLM secondary tier: vLLM's tier calls mapped onto one kvtier tier.

vLLM's tiering manager calls a secondary tier from its scheduler thread: lookups per
key (answered RETRY until the step's batch of existence checks answers), store and load
jobs, and a poll for finished jobs each step. This module maps those calls onto
:class:`kvtier.Tier`; the configuration, namespace and metrics come from the sibling
modules, the job bookkeeping from :mod:`kvtier._engine_adapter`.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Mapping

from .._engine_adapter import CounterGrowth, FinishedJob, JobBook, LookupMirror, closed_on_failure
from ..errors import ConfigError, ForkedError, KvtierError, TimedOutError
from ..tier import JobKind, Tier
from ..tier import LookupResult as _KvtLookup
from ..tier import stats_dict, stats_values
from .._native import STATS_FIELDS
from ..tier import version as kvtier_version
from . import metrics
from ._shims import (
    JobResult,
    LookupResult,
    Medium,
    OffloadingEvent,
    RequestOffloadingContext,
    SecondaryTierBase,
    check_vllm,
)
from .config import build_tier_config, parse_locality
from .namespace import derive_namespace

logger = logging.getLogger("kvtier.vllm")

# kvtier's verdict -> vLLM's (by name), once rather than per lookup.
_VERDICTS = {verdict: LookupResult[verdict.name] for verdict in _KvtLookup}

_DRAIN_WARN_AFTER_S = 5.0
_monotonic = time.monotonic  # patched by tests


def _events_enabled_globally(spec: Any) -> bool | None:
    """vLLM's global KV-event flag, or None when the spec does not say."""
    for owner in (spec, getattr(spec, "vllm_config", None)):
        events_config = getattr(owner, "kv_events_config", None)
        if events_config is not None and hasattr(events_config, "enable_kv_cache_events"):
            return bool(events_config.enable_kv_cache_events)
    return None


def _job_result(job: FinishedJob) -> Any:
    successful = None
    if job.kind is JobKind.LOAD and not job.ok:
        # The keys that did load, in job order; None (all failed) when there are none.
        successful = job.succeeded_keys() or None
    return JobResult(
        job_id=job.job_id,
        success=job.ok,
        successful_keys=successful,
        transfer_time=job.seconds,
        transfer_bytes=job.nbytes,
    )


class KvtierTier(SecondaryTierBase):
    """A vLLM secondary tier backed by kvtier (S3-compatible stores, or a local directory).

    Keywords (vLLM's obj tier, plus ``namespace``):

    * ``store_config`` (required): vLLM's ``ObjStoreConfig`` keys plus kvtier extras; see
      :func:`build_tier_config`.
    * ``prefix``: leading path of every object name (default ``""``).
    * ``io_threads``: sizes kvtier's I/O runtime (``runtime_threads``); concurrency is
      ``max_inflight_transfers`` / ``max_inflight_lookups`` in ``store_config``.
    * ``enable_kv_events``: emit one BlockStored event per successful store job
      (effective only with vLLM's global ``enable_kv_cache_events``).
    * ``locality``: ``"LOCAL"``, ``"REMOTE"`` or ``None``, carried on events.
    * ``namespace``: the namespace segment of object names. By default it is vLLM's
      (``<model>_<digest>_r<rank>``, computed from the offloading spec as vLLM's obj tier
      does), so a bucket is shared with vLLM's own obj tier.
    * ``backpressure_detector``: passed by vLLM's factory (from the entry's
      ``backpressure`` block); vLLM's tiering manager feeds it from this tier's results.
    """

    medium = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: Any,
        tier_type: str,
        store_config: Mapping[str, Any] | None = None,
        prefix: str = "",
        io_threads: int | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: Any = None,
        *,
        namespace: str | None = None,
    ) -> None:
        check_vllm()
        if store_config is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'store_config'")
        if primary_kv_view is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'primary_kv_view'")
        view = memoryview(primary_kv_view)
        if view.ndim != 2:
            raise ValueError(f"primary_kv_view must be 2-D (num_slots, row_bytes), not {view.ndim}-D")
        super().__init__(offloading_spec, view, tier_type, backpressure_detector)
        self._tier: Tier | None = None
        self._closed = False
        # vLLM's jobs in flight, and the library jobs (one per key length) each consists of.
        self._jobs = JobBook(logger, on_failed_loads=self._mark_miss)
        self._lookups: LookupMirror | None = None
        self._req_ids: dict[Any, int] = {}
        self._next_req_id = itertools.count(1)
        self._counters = CounterGrowth(metrics.stat_help())
        # The library's counters and the binding's ``kvt_stats`` layout name the same
        # counters in the same order (one library): growth is then taken from the raw tuple.
        self._counters_in_stats_order = tuple(metrics.stat_help()) == tuple(STATS_FIELDS)
        self._stats_seen: bytes | None = None  # kvt_stats's bytes at the last report

        if not isinstance(prefix, str):
            raise TypeError("prefix must be a string")
        if io_threads is not None and (isinstance(io_threads, bool) or int(io_threads) < 1):
            raise ValueError(f"io_threads must be a positive integer, not {io_threads!r}")
        self.locality = parse_locality(locality)

        events = bool(enable_kv_events)
        if events and _events_enabled_globally(offloading_spec) is False:
            logger.warning(
                "enable_kv_events is set on secondary tier '%s' but KV cache events are "
                "disabled globally; the tier will not emit events.",
                tier_type,
            )
            events = False
        self.events_enabled = events

        if namespace is None:
            namespace = derive_namespace(offloading_spec)
            if namespace is None:
                if offloading_spec is not None:
                    raise ValueError(
                        "cannot derive vLLM's namespace from this offloading spec; "
                        "set 'namespace' in the tier's configuration"
                    )
                namespace = ""
        if not isinstance(namespace, str):
            raise TypeError("namespace must be a string")
        self.namespace = namespace

        config = build_tier_config(
            store_config,
            prefix=prefix,
            namespace=namespace,
            io_threads=io_threads,
            enable_kv_events=events,
            locality=self.locality,
        )
        try:
            tier = Tier(config)
        except ConfigError:
            raise
        except KvtierError as exc:
            raise type(exc)(
                exc.status,
                f"kvtier tier could not start: {exc.message}. Check store_config "
                "(bucket, endpoint_override, scheme) and the credentials (access_key/secret_key, "
                "or the default credential chain)",
            ) from exc
        with closed_on_failure(tier):
            self._config_info = {
                "kvtier_version": kvtier_version(),
                "kvtier_store": config["store"]["type"],
                "kvtier_location": tier.location,
            }
            tier.register_memory(view)
        self._tier = tier
        self._lookups = LookupMirror(tier, _VERDICTS, logger)
        self.row_bytes = self._tier.block_bytes
        self.num_slots = self._tier.num_blocks
        logger.info(
            "kvtier tier '%s': %s, %d slots of %d bytes",
            tier_type,
            self._config_info["kvtier_location"],
            self.num_slots,
            self.row_bytes,
        )

    # -- lookups ---------------------------------------------------------------------

    def _req_id(self, req_context: Any) -> int:
        key = getattr(req_context, "req_id", req_context)
        rid = self._req_ids.get(key)
        if rid is None:
            rid = self._req_ids[key] = next(self._next_req_id)
        return rid

    def lookup(self, key: bytes, req_context: Any):
        """HIT, MISS, or RETRY until the check sent at the next ``on_schedule_end`` answers.

        Answered here, from the verdicts the tier handed back (kvtier's rules, see
        :class:`~kvtier._engine_adapter.LookupMirror`): no call into the library per key."""
        lookups = self._lookups
        if lookups is None:
            return LookupResult.MISS
        rid = self._req_ids.get(getattr(req_context, "req_id", req_context))
        if rid is None:
            rid = self._req_id(req_context)
        return lookups.lookup(rid, key if type(key) is bytes else bytes(key))

    def _mark_miss(self, keys: list) -> None:
        if self._lookups is not None:
            self._lookups.mark_miss(keys)

    def on_new_request(self, req_context: Any):
        return RequestOffloadingContext()

    def on_schedule_end(self, context: Any = None) -> None:
        """Sends this step's new lookups as one deduplicated batch of existence checks."""
        if self._lookups is not None:
            try:
                self._lookups.schedule_end()
            except KvtierError as exc:
                logger.warning("kvtier schedule_end failed: %s", exc)

    def on_request_finished(self, req_context: Any) -> None:
        """Drops the verdicts only this request held."""
        rid = self._req_ids.pop(getattr(req_context, "req_id", req_context), None)
        if rid is not None and self._lookups is not None:
            try:
                self._lookups.request_finished(rid)
            except KvtierError as exc:
                logger.warning("kvtier request_finished failed: %s", exc)

    def touch(self, keys, req_context) -> None:
        """Accepted and ignored: eviction (the ``eviction`` config) deletes the oldest-stored
        blocks first; kvtier keeps no recency order that a touch could refresh."""
        return None

    # -- jobs ------------------------------------------------------------------------

    def submit_store(self, job_metadata: Any) -> None:
        """Stores the job's primary slots under its keys. Never raises for a bad job."""
        self._submit(job_metadata, JobKind.STORE)

    def submit_load(self, job_metadata: Any) -> None:
        """Loads the job's keys into its primary slots. Never raises for a bad job."""
        self._submit(job_metadata, JobKind.LOAD)

    def _submit(self, job: Any, kind: JobKind) -> None:
        # A library job has keys of one length; vLLM's keys have the length of their hash,
        # which may differ within a job (vLLM's own tests mix 1- and 2-byte hashes). The
        # book makes each length one library job; vLLM sees one result when all finished.
        # A job without chunk ids fails alone (at submission), as any other bad job.
        self._jobs.submit(self._tier, kind, job.job_id, job.keys, getattr(job, "chunk_ids", None))

    def get_finished_jobs(self) -> list:
        """Every job finished since the last call, each exactly once. With jobs in flight
        and none finished (the tier's event fd not readable), no call into the library."""
        if self._lookups is not None and self._jobs.has_pending():
            self._lookups.before_poll()
        finished = self._jobs.collect(self._tier)
        return [_job_result(job) for job in finished] if finished else []

    def has_pending_work(self) -> bool:
        """True while a submitted job has not been returned by ``get_finished_jobs``."""
        return self._jobs.has_pending()

    def take_events(self) -> list:
        """KV events, oldest first (empty when disabled): BlockStored for successful store
        jobs, and BlockRemoved (``removed=True``) for keys kvtier deleted (eviction, or a
        corrupt object deleted under ``on_corrupt = fail_and_delete``)."""
        if self._tier is None or not self.events_enabled or not self._tier.events_pending():
            return []
        try:
            events = self._tier.take_events()
        except ForkedError:  # a fork() child: the events are the parent's
            return []
        return [
            OffloadingEvent(keys=list(e.keys), medium=Medium.STORAGE, removed=e.removed, locality=self.locality)
            for e in events
        ]

    def drain_jobs(self) -> None:
        """Blocks until no job is in flight; results wait for the next get_finished_jobs.

        Never cancels and never gives up; logs one warning after 5 s.
        """
        if self._tier is None:
            return
        start = _monotonic()
        warned = False
        while True:
            try:
                self._tier.drain(1000)
                return
            except TimedOutError:
                if not warned and _monotonic() - start >= _DRAIN_WARN_AFTER_S:
                    warned = True
                    logger.warning(
                        "kvtier drain_jobs: %d transfers still in flight after %.0f s; "
                        "a stuck transfer will block the engine",
                        self._tier.jobs_in_flight(),
                        _DRAIN_WARN_AFTER_S,
                    )
            except KvtierError as exc:  # shut down
                logger.warning("kvtier drain_jobs: %s", exc)
                return

    def shutdown(self) -> None:
        """Stops the tier; idempotent. When it returns, nothing touches the primary pool."""
        if self._closed:
            return
        self._closed = True
        tier, self._tier = self._tier, None
        lookups, self._lookups = self._lookups, None
        if lookups is not None:
            lookups.clear()
        self._jobs.clear()
        self._req_ids.clear()
        if tier is not None:
            tier.close()  # cancels queued work, waits for I/O in progress, frees the handle
        self._primary_kv_view = None

    # -- metrics ---------------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict) -> dict:
        """kvtier's counters (:data:`STAT_HELP`) and its jobs-in-flight gauge, for vLLM's
        Prometheus exposition; every one is labelled with the tier's ``type``."""
        return metrics.metric_definitions()

    def get_stats(self) -> Any:
        """What kvtier's counters grew by since the last call, and the jobs in flight."""
        if self._tier is None:
            return None
        try:
            raw = self._tier.stats_raw()
            # No job of this tier's unpolled: none is in flight in the library either.
            in_flight = self._tier.jobs_in_flight() if self._jobs.has_pending() else 0
        except ForkedError:  # a fork() child: the counters are the parent's
            return None
        if raw == self._stats_seen:
            grown = {}  # nothing grew: the counters are not read one by one
        elif self._counters_in_stats_order:
            grown = self._counters.since_last_values(stats_values(raw))
            self._stats_seen = raw
        else:
            grown = self._counters.since_last(stats_dict(raw))
            self._stats_seen = raw
        return metrics.connector_stats(grown, in_flight, self.tier_type)

    @classmethod
    def config_info_keys(cls, tier_config: dict) -> tuple:
        return metrics.CONFIG_INFO_KEYS

    def config_info(self) -> dict:
        """kvtier's version, the store type and where objects go (never a credential)."""
        return dict(self._config_info)

    # -- extras ----------------------------------------------------------------------

    @property
    def tier(self) -> Tier | None:
        """The underlying :class:`kvtier.Tier` (None after shutdown)."""
        return self._tier

    def kvtier_stats(self) -> dict:
        """kvtier's counters (existence checks, keys stored/loaded...); {} after shutdown."""
        return self._tier.stats() if self._tier is not None else {}

    def __repr__(self) -> str:
        state = "shut down" if self._closed else f"{getattr(self, 'num_slots', 0)} slots"
        return f"<{type(self).__name__} {self.tier_type!r} namespace={self.namespace!r} {state}>"


#: The same class under a name that reads well in a vLLM configuration
#: (``"type": "ObjectStoreTier"``).
ObjectStoreTier = KvtierTier
