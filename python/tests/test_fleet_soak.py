"""A fleet on one namespace: engines, gc and eviction at once, each in its own process
(fleet.py has the fleet, what it does and what it checks).

On the local store, s3s-fs and Ceph RGW (the ``store`` fixture's parameters; moto is left
to the other suites). The fleet runs fleet.RUN_S seconds once up (``KVTIER_FLEET_SOAK_S``
overrides; bench/fleet_soak.py runs the same fleet longer); the test prints one summary
line per store and fails on any problem ``fleet.check`` finds.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("needs vLLM (scripts/install-tools.sh installs it)", allow_module_level=True)

import fleet  # noqa: E402


@pytest.fixture
def fleet_store(store, request):
    """The store fixture's stores but moto: the soak's CI time goes to the local store,
    s3s-fs and Ceph RGW (moto is in every other suite)."""
    name = request.node.callspec.id
    if name == "moto":
        pytest.skip("the fleet soak runs on the local store, s3s-fs and Ceph RGW")
    return name, store


def test_fleet_soak(fleet_store, tmp_path):
    name, store = fleet_store
    run_s = float(os.environ.get("KVTIER_FLEET_SOAK_S", fleet.RUN_S))
    result = fleet.run_fleet(store.kind, store.store_config, store.prefix, tmp_path, run_s=run_s)
    s = fleet.check(result)
    print("\n" + fleet.summary_line(name, result, s))
    print(f"fleet soak [{name}] timeline (s): " + "; ".join(result["timeline"]))
    workers = dict(result["engines"], evictor=result["evictor"])
    print(f"fleet soak [{name}] per worker: " + "; ".join(
        f"{n} {r['rounds']} rounds, {r['loads']} loads, {r['stores']} stores, {r.get('wrong', 0)} wrong, "
        f"statuses {dict(fleet.statuses_of(r))}" for n, r in workers.items()))
    windows = {what: (down, up) for what, down, up in result["outage_windows"]}
    jobs = {(e["worker"], e["t0"], e["status"]): e for e in s["excused_details"]}  # one line a job
    for e in list(jobs.values())[:6]:
        down, up = windows[e["window"]]
        print(f"fleet soak [{name}] in the {e['window']} ({up - down:.2f} s): {e['worker']} {e.get('kind', 'gc')} "
              f"{e['status']}, job from {e['t0'] - down:+.2f} s to {e['t1'] - down:+.2f} s: {e['message'][-400:]}")
    assert not s["problems"], "\n".join(s["problems"])
    assert s["wrong"] == 0
    assert s["found_after"] == s["stored_after_miss"] > 0
