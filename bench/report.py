#!/usr/bin/env python3
"""bench/report.py: the benchmark pages, generated from bench/comparisons.py and the result
files it names as current; no number in them is typed by hand.

    python3 bench/report.py            # rewrite them
    python3 bench/report.py --check    # exit 1, naming the stale ones, when one differs

Writes:
  docs/benchmarks.md         one section per heading of bench/comparisons.py: what is
                             measured, the command, the tables (and targets, where the result
                             file judges them) of the current result files
  bench/results/INDEX.md     the current result files of every comparison, and the archive
  bench/README.md            its table of comparisons (between the two marker lines; the
                             rest of the file is written by hand)
  README.md                  for each comparison with a "readme" entry, the tables it names
                             of the comparison's result file (between that comparison's two
                             marker lines)

Only the standard library; reads nothing but bench/comparisons.py and bench/results.
"""

import argparse
import os
import re
import sys

import comparisons

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
INDEX = os.path.join(RESULTS, "INDEX.md")
README = os.path.join(BENCH, "README.md")
FRONT_README = os.path.join(ROOT, "README.md")
TABLE_BEGIN = "<!-- comparisons: begin (bench/report.py writes this table from bench/comparisons.py) -->"
TABLE_END = "<!-- comparisons: end -->"
REGENERATE = "python3 bench/report.py"


def read(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        return f.read()


def link(name, from_docs=True):
    """A markdown link to a result file, from docs/ or from bench/results."""
    return f"[`bench/results/{name}`](../bench/results/{name})" if from_docs else f"[{name}]({name})"


def anchor(heading):
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def command(c):
    """How the published run is started (bench/run.py NAME), and what that runs."""
    preset = " ".join(c["preset"])
    return f"`bench/run.py {c['name']}` (runs `{' '.join(c['driver'] + ([preset] if preset else []))}`)"


# ------------------------------------------------------------------------------------------
# Markdown of the result files


def split_sections(text):
    """(title of the file's `# ` line or None, lines before the first `## `, [(`## ` title,
    lines)])."""
    lines = text.strip("\n").split("\n")
    title = None
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:].strip(), lines[1:]
    head, sections = [], []
    for line in lines:
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif sections:
            sections[-1][1].append(line)
        else:
            head.append(line)
    return title, head, sections


def tidy(lines, level):
    """Lines of a result file as a part of the docs: its headings moved below ``level`` (the
    file's `##` becomes level + 1), a blank line around every table, runs of blank lines as
    one, no blank lines at either end."""
    out = []
    for line in lines:
        m = re.match(r"^(#{2,6}) (.*)$", line)
        if m:
            line = "#" * min(6, level + len(m.group(1)) - 1) + " " + m.group(2)
        is_table = line.startswith("|")
        if out and out[-1] and (is_table != out[-1].startswith("|")):
            out.append("")
        if m and out and out[-1]:
            out.append("")
        if m:
            out += [line, ""]
            continue
        if line.strip() or (out and out[-1].strip()):
            out.append(line.rstrip())
    while out and not out[-1].strip():
        out.pop()
    return out


def table_rows(lines):
    """The rows of the first markdown table in ``lines`` as dicts by header."""
    rows, header = [], None
    for line in lines:
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line.replace("|", "").strip()) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


# ------------------------------------------------------------------------------------------
# Renderers: a comparison's current report as lines of the docs


def render_markdown(c, level):
    title, head, sections = split_sections(read(c["results"][0]))
    lines = head[:]
    for name, body in sections:
        lines += ["", "#" * 2 + " " + name, *body]
    return title, tidy(lines, level)


def render_soak(c, level):
    title, lines = render_markdown(c, level)
    kept = [line for line in lines if not line.startswith("|")]
    while kept and not kept[-1].strip():
        kept.pop()
    return title, kept + ["", f"The samples, one a row: {link(c['results'][0])}."]


COMPARE_SECTIONS = ["header", "pivot", "floor", "targets", "existence", "kvtier-only"]


def pivot(c, sections, level):
    """bench/compare's Transfers tables as MiB/s / client CPU-s per GiB, a column per client:
    the headline cell (``c["headline"]``: a block size and a concurrency) first, then every
    cell; or every cell."""
    rows, clients = [], []
    for name, body in sections:
        if name != "Transfers":
            continue
        server, part = None, []
        for line in body + ["### end"]:
            if line.startswith("### "):
                for r in table_rows(part):
                    failed = not r.get("status", "ok").startswith("ok")
                    mib = r["MiB/s (min–max)"].split(" (")[0]
                    cell = "fails" if failed else f"{mib} / {r['CPU-s/GiB']}"
                    rows.append((server, r["block"], r["c"], r["op"], r["client"], cell))
                    if r["client"] not in clients:
                        clients.append(r["client"])
                server, part = line[4:].strip(), []
            else:
                part.append(line)
    cells = {}
    for server, block, conc, op, client, cell in rows:
        cells.setdefault((server, block, conc, op), {})[client] = cell

    def table(keys, columns):
        out = ["| " + " | ".join(columns + clients) + " |", "|" + "---|" * len(columns) + "---:|" * len(clients)]
        for key in keys:
            shown = [k for k, col in zip(key, ("server", "block", "c", "op")) if col in columns]
            out.append("| " + " | ".join(shown + [cells[key].get(cl, "–") for cl in clients]) + " |")
        return out

    keys = list(cells)
    blocks, concs = list(dict.fromkeys(k[1] for k in keys)), list(dict.fromkeys(k[2] for k in keys))
    unit = "MiB/s / client CPU-s per GiB (medians; `fails`: the client failed)"
    out = []
    headline = c.get("headline")
    if headline:
        picked = [k for k in keys if k[1] == headline["block"] and k[2] == headline["c"]]
        out += [f"{headline['block']} blocks, {headline['c']} requests in flight, {unit}:", "",
                *table(picked, ["server", "op"]), ""]
        if len(picked) < len(keys):
            out += ["<details><summary>Every block size and concurrency</summary>", "",
                    *table(keys, ["server", "block", "c", "op"]), "", "</details>", ""]
        return out
    columns = ["server"] + (["block"] if len(blocks) > 1 else []) + (["c"] if len(concs) > 1 else []) + ["op"]
    fixed = ([f"{blocks[0]} blocks"] if len(blocks) == 1 else []) + ([f"{concs[0]} in flight"] if len(concs) == 1 else [])
    return [f"{', '.join(fixed + [unit])}:" if fixed else f"{unit}:", "", *table(keys, columns), ""]


def render_compare(c, level):
    title, head, sections = split_sections(read(c["results"][0]))
    wanted = c.get("sections", COMPARE_SECTIONS)
    paragraphs = [p for p in "\n".join(head).split("\n\n") if p.strip()]
    lines = []
    for p in paragraphs:
        if p.startswith(("Generated by", "Link:")) or "header" in wanted:
            lines += [p.strip(), ""]
    if "pivot" in wanted:
        lines += pivot(c, sections, level)
    kinds = {"floor": "Raw loopback floor", "targets": "Targets", "existence": "Existence",
             "kvtier-only": "kvtier only"}
    for name, body in sections:
        kind = next((k for k, prefix in kinds.items() if name.startswith(prefix)), None)
        if kind in wanted:
            lines += ["## " + name, *body, ""]
    return title, tidy(lines, level)


def _num(value, digits=0):
    return "–" if value is None else f"{value:,.{digits}f}"


def render_scheduler(c, level):
    """bench/scheduler_cost.py's JSON: scheduler CPU per step by mix and tier, the cost of
    each tier call, the steps until a lookup is answered, and the issue's targets judged."""
    import json

    report = json.loads(read(c["results"][0]))
    results = report["results"]
    tiers = report["settings"]["tiers"]
    mixes = list(dict.fromkeys(r["mix"] for r in results))
    by = {(r["mix"], r["tier"]): r for r in results}
    s = report["settings"]
    lines = [
        f"{report['date']}, git {report['git']}, {report['machine']}, vLLM {report['vllm']}; "
        f"{s['steps']} measured steps after {s['warmup']} of warm-up, {s['gap_ms']} ms between steps, "
        f"{s['reps']} runs of each tier per mix, alternated; medians over runs. "
        + (f"{report['label']}." if report.get("label") else ""),
        "",
        "Mixes (per step): " + "; ".join(
            f"**{m}**: {v['new_keys']} new keys looked up ({v['in_primary']} in the CPU tier, {v['in_tier']} in the "
            f"secondary tier), {v['stores']} stores in {v['store_jobs']} jobs" for m, v in s["mixes"].items()) + ".",
        "",
        "## Scheduler-thread CPU per step",
        "",
        "Stores refused: `prepare_store` calls vLLM's CPU tier refused over all runs (its blocks still "
        "held by stores in flight to a slower tier); a refused store costs the step less, so the "
        "store-heavy rows of tiers that refuse many do not compare with those that refuse none.",
        "",
        "| mix | tier | mean µs | p99 µs | vs fs (mean / p99) | vs obj (mean / p99) | "
        "steps to the tier's answer (mean / max) | steps to HIT | stores refused |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def versus(r, base):
        if not base:
            return "–"
        return (f"{r['step_cpu_us_mean'] / base['step_cpu_us_mean']:.2f}× / "
                f"{r['step_cpu_us_p99'] / base['step_cpu_us_p99']:.2f}×")

    for m in mixes:
        fs, obj = by.get((m, "fs")), by.get((m, "obj"))
        for t in tiers:
            r = by.get((m, t))
            if r is None:
                continue
            lines.append(f"| {m} | {t} | {_num(r['step_cpu_us_mean'])} | {_num(r['step_cpu_us_p99'])} | "
                         f"{versus(r, fs)} | {versus(r, obj)} | "
                         f"{_num(r['steps_to_answer_mean'], 2)} / {r['steps_to_answer_max']} | "
                         f"{_num(r['steps_to_hit_mean'], 2)} | {_num(r.get('refused_stores'))} |")
    calls = [("lookup", "lookup, per key"), ("submit_store", "submit_store, per job"),
             ("submit_load", "submit_load, per job"), ("collect_empty", "get_finished_jobs, nothing finished"),
             ("collect", "get_finished_jobs, some finished"), ("events_empty", "take_events, none"),
             ("events", "take_events, some"), ("get_stats", "get_stats")]
    lines += ["", "## Per call, scheduler-thread CPU (median µs)", "",
              "| mix | call | " + " | ".join(tiers) + " |", "|---|---|" + "---:|" * len(tiers)]
    for m in mixes:
        for name, what in calls:
            cells = [((by.get((m, t)) or {}).get("calls") or {}).get(name, {}).get("median_us") for t in tiers]
            if all(v is None for v in cells):
                continue
            lines.append(f"| {m} | {what} | " + " | ".join(_num(v, 2) for v in cells) + " |")
    if "kvtier" in tiers and "fs" in tiers:
        lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]

        def step_ratio_rows(tier, peer, limit, target):
            for m in mixes:
                k, p = by.get((m, tier)), by.get((m, peer))
                if k and p:
                    ratio = k["step_cpu_us_mean"] / p["step_cpu_us_mean"]
                    lines.append(f"| {m}: {target} | {ratio:.2f}× | {'yes' if ratio <= limit else 'no'} |")

        step_ratio_rows("kvtier", "fs", 0.8, "scheduler CPU per step ≤ 0.8× vLLM's fs tier")
        for m in mixes:
            # What a tier costing nothing would reach: the fs step less fs's own tier calls
            # (their mean cost times their number per step, from the instrumented run).
            f = by.get((m, "fs"))
            floor = _manager_share(f, s)
            if floor is not None:
                lines.append(f"| {m}: (bound) a tier whose calls cost nothing, vs vLLM's fs tier | {floor:.2f}× | "
                             f"{'reachable' if floor <= 0.8 else 'not reachable: the manager alone is above 0.8×'} |")
        # the same S3 server under both: kvtier on s3s-fs against vLLM's obj tier over NIXL
        step_ratio_rows("kvtier-s3", "obj", 0.5, "scheduler CPU per step on s3s-fs ≤ 0.5× vLLM's obj tier (NIXL OBJ)")
        for m in mixes:
            v = ((by.get((m, "kvtier")) or {}).get("calls") or {}).get("lookup", {}).get("median_us")
            if v is not None:
                lines.append(f"| {m}: kvtier lookup ≤ 0.5 µs per key | {v:.2f} µs | {'yes' if v <= 0.5 else 'no'} |")
    return None, tidy(lines, level)


def _manager_share(fs, settings):
    """The fs tier's step less the CPU of its tier calls, as a share of its step: the
    vLLM manager's own part, which no tier can take away. None without per-call runs."""
    calls = (fs or {}).get("calls")
    if not calls:
        return None
    steps = settings["steps"] + settings["warmup"]  # an instrumented run times every step's calls
    tier_us = sum(c["mean_us"] * c["calls"] for c in calls.values() if c.get("calls")) / steps
    return (fs["step_cpu_us_mean"] - tier_us) / fs["step_cpu_us_mean"]


RENDER = {"markdown": render_markdown, "soak": render_soak, "compare": render_compare, "scheduler": render_scheduler}


# ------------------------------------------------------------------------------------------
# The three outputs


def docs():
    shown = [c for c in comparisons.COMPARISONS if c["heading"] and c["results"]]
    headings = list(dict.fromkeys(c["heading"] for c in shown))
    out = [
        "# Benchmarks",
        "",
        f"<!-- Generated by `{REGENERATE}` from bench/comparisons.py and the result files it names; do not edit. -->",
        "",
        "Every table below is copied, by bench/report.py, from the current result file of a comparison "
        "(bench/results/INDEX.md names them); none is typed by hand. Each comparison runs with "
        "`bench/run.py NAME` (bench/README.md lists them, with how long each takes); a run rewrites its result "
        f"file, and `{REGENERATE}` this page. Client and servers share the measuring machine's cores unless a "
        "result says otherwise: read ratios and CPU per GiB rather than absolute throughput.",
        "",
        *[f"- [{h}](#{anchor(h)})" for h in headings],
    ]
    for heading in headings:
        out += ["", f"## {heading}"]
        for c in [c for c in shown if c["heading"] == heading]:
            level = 2
            if c.get("title"):
                out += ["", f"### {c['title']}"]
                level = 3
            title, body = RENDER[c["render"]](c, level)
            also = [link(n) for n in c["results"][1:] if not re.match(r".*-\d+\.(md|jsonl|png)$", n)]
            runs = [n for n in c["results"][1:] if re.match(r".*-\d+\.md$", n)]
            out += ["", c["measures"], "", f"Run: {command(c)}." + (f" {c['note']}" if c.get("note") else ""), "",
                    f"Result: {link(c['results'][0])}" + (f": *{title}*" if title else "")
                    + (f" (also {', '.join(also)})" if also else "")
                    + (f"; each run's own report: {', '.join(link(n) for n in runs)}" if runs else "") + ".",
                    "", *body]
            if c.get("chart"):
                out += ["", f"![{c['name']}](../bench/results/{c['chart']})"]
    return "\n".join(out) + "\n"


def index():
    out = [
        "# bench/results: which file is current",
        "",
        f"<!-- Generated by `{REGENERATE}` from bench/comparisons.py; do not edit. -->",
        "",
        "The current result files of every comparison (bench/comparisons.py names them; docs/benchmarks.md "
        "shows their tables). A run of `bench/run.py NAME` rewrites its comparison's files here. Superseded "
        "runs are in [archive/](archive/).",
        "",
        "| comparison | docs/benchmarks.md section | current result | with it | command |",
        "|---|---|---|---|---|",
    ]
    for c in comparisons.COMPARISONS:
        section = c["heading"] + (f" / {c['title']}" if c.get("title") else "") if c["heading"] else "–"
        current = link(c["results"][0], False) if c["results"] else "none kept: it prints its summary"
        rest = ", ".join(link(n, False) for n in c["results"][1:]) or "–"
        out.append(f"| {c['name']} | {section} | {current} | {rest} | `bench/run.py {c['name']}` |")
    archived = sorted(os.listdir(os.path.join(RESULTS, "archive"))) if os.path.isdir(os.path.join(RESULTS, "archive")) else []
    if archived:
        out += ["", "## Archive", "", "Superseded runs, kept for their history:", "", "| file | why it is not current |",
                "|---|---|"]
        out += [f"| [{n}](archive/{n}) | {comparisons.ARCHIVED.get(n, 'superseded')} |" for n in archived]
    return "\n".join(out) + "\n"


def readme(current):
    """bench/README.md with its table of comparisons rewritten."""
    if TABLE_BEGIN not in current or TABLE_END not in current:
        raise SystemExit(f"bench/README.md lacks the marker lines of its table:\n{TABLE_BEGIN}\n{TABLE_END}")
    rows = ["| question | command | result | minutes |", "|---|---|---|---:|"]
    for c in comparisons.COMPARISONS:
        result = f"[results/{c['results'][0]}](results/{c['results'][0]})" if c["results"] else "prints a summary"
        rows.append(f"| {c['question']} | `bench/run.py {c['name']}` | {result} | {c['minutes']} |")
    before, rest = current.split(TABLE_BEGIN, 1)
    after = rest.split(TABLE_END, 1)[1]
    return before + TABLE_BEGIN + "\n" + "\n".join(rows) + "\n" + TABLE_END + after


def excerpt_markers(c):
    return (f"<!-- bench {c['name']}: begin (bench/report.py writes this from bench/results/{c['results'][0]}) -->",
            f"<!-- bench {c['name']}: end -->")


def tables(lines):
    """Every markdown table in ``lines``, each as its lines."""
    found, current = [], []
    for line in lines + [""]:
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            found.append(current)
            current = []
    return found


def front_readme(current):
    """README.md with the tables that comparisons put in it ("readme": indexes of tables of
    their first result file, in order) rewritten; each comparison's place is marked by its two
    marker lines, which must be there."""
    for c in comparisons.COMPARISONS:
        if "readme" not in c:
            continue
        begin, end = excerpt_markers(c)
        if begin not in current or end not in current:
            raise SystemExit(f"README.md lacks the marker lines of bench {c['name']}'s tables:\n{begin}\n{end}")
        found = tables(read(c["results"][0]).split("\n"))
        chosen = []
        for i in c["readme"]:
            chosen += ([""] if chosen else []) + found[i]
        before, rest = current.split(begin, 1)
        after = rest.split(end, 1)[1]
        current = before + begin + "\n" + "\n".join(chosen) + "\n" + end + after
    return current


def unindexed():
    named = {n for c in comparisons.COMPARISONS for n in c["results"]} | {"INDEX.md", "archive"}
    return sorted(set(os.listdir(RESULTS)) - named)


def outputs():
    with open(README, encoding="utf-8") as f:
        current_readme = f.read()
    with open(FRONT_README, encoding="utf-8") as f:
        current_front = f.read()
    return {DOCS: docs(), INDEX: index(), README: readme(current_readme), FRONT_README: front_readme(current_front)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not what it would be")
    args = ap.parse_args(argv)
    for name in unindexed():
        print(f"bench/report.py: bench/results/{name} is named by no comparison: add it to the results of one in "
              "bench/comparisons.py, or git mv it to bench/results/archive/", file=sys.stderr)
    stale = []
    for path, text in outputs().items():
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if same:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not args.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if args.check:
        if stale:
            print(f"bench/report.py --check: {', '.join(stale)} not what bench/comparisons.py and bench/results make; "
                  f"regenerate with `{REGENERATE}` and commit", file=sys.stderr)
            return 1
        return 0
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
