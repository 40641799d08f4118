#!/usr/bin/env python3
"""bench/run.py: one way to run every comparison of bench/.

    bench/run.py --list                 # the comparisons: question, command, result file, minutes
    bench/run.py NAME [OPTIONS...]      # a comparison as published (its preset), then OPTIONS
    bench/run.py DRIVER [OPTIONS...]    # a driver by its file name, with its own defaults only
    bench/run.py NAME --help            # the driver's options
    bench/run.py -n NAME [OPTIONS...]   # print the command instead of running it

A comparison (bench/comparisons.py) is a driver, the interpreter it needs and the options of
its published run; options given here come after the preset, so they win (argparse keeps the
last). Drivers that need vLLM or SGLang run in the test tools' venv (tools/venv, made by
scripts/install-tools.sh); bench/compare makes and uses its own (tools/bench-venv). Every
driver still runs on its own, as its docstring says; this only starts it. A run rewrites its
comparison's current result files under bench/results; `python3 bench/report.py` then
rewrites docs/benchmarks.md from them.
"""

import os
import shlex
import sys

import comparisons

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def interpreter(kind, check=True):
    """The Python a driver needs: "tools/venv" (vLLM, SGLang, pytest), else this one."""
    if kind == "tools/venv":
        python = os.path.join(ROOT, "tools", "venv", "bin", "python")
        if check and not os.path.exists(python):
            sys.exit(f"{python} does not exist: scripts/install-tools.sh makes it")
        return python
    return sys.executable


def command(name, options, check=True):
    """The argv that runs ``name`` (a comparison or a driver) with ``options``."""
    entry = comparisons.by_name(name)
    if entry is not None:
        driver, kind, preset = entry["driver"], entry["interpreter"], entry["preset"]
    else:
        key = name if name in comparisons.DRIVERS else name + ".py"
        if key not in comparisons.DRIVERS:
            sys.exit(f"bench/run.py: no comparison or driver {name!r}; `bench/run.py --list` lists them")
        (driver, kind), preset = comparisons.DRIVERS[key], []
    return [interpreter(kind, check), os.path.join(ROOT, driver[0]), *driver[1:], *preset, *options]


def listing():
    width = max(len(c["name"]) for c in comparisons.COMPARISONS)
    lines = ["Comparisons (bench/run.py NAME [options]; bench/README.md has the same table):", ""]
    for c in comparisons.COMPARISONS:
        lines.append(f"  {c['name']:<{width}}  {c['question']}")
        run = " ".join([*c["driver"], *map(shlex.quote, c["preset"])])
        results = f"writes bench/results/{c['results'][0]}" if c["results"] else "prints its summary"
        lines.append(f"  {'':<{width}}  runs {run}; {results}; about {c['minutes']} min")
        if c.get("note"):
            lines.append(f"  {'':<{width}}  {c['note']}")
    lines += ["", "Drivers, with their own defaults: " + ", ".join(sorted(comparisons.DRIVERS)) + "."]
    return "\n".join(lines)


def main(argv):
    dry = False
    if argv[:1] in (["-n"], ["--dry-run"]):
        dry, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "--list":
        print(listing())
        return 0
    cmd = command(argv[0], argv[1:], check=not dry)
    if dry:
        print(shlex.join(cmd))
        return 0
    print(f"bench/run.py: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
