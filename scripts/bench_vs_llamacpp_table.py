#!/usr/bin/env python3
"""Renders the results of scripts/bench-vs-llamacpp.sh as markdown.

    bench_vs_llamacpp_table.py DIR     DIR holds {pagoda,llama}-c{C}-r{R}.json (pagoda-bench
                                       --save-result, plus the script's "machine" entry), and
                                       the files "machine" and "commands".
    bench_vs_llamacpp_table.py --self-test

Per stream count: the median over rounds of each server's output tok/s, TTFT p50 and TPOT p50,
with min and max, the ratio of the medians and the range of the per-round ratios; then every
run, the machine and the commands. Standard library only.
"""

import json
import os
import re
import statistics
import sys
import tempfile

NAMES = {"pagoda": "Pagoda", "llama": "llama.cpp"}


def load_runs(directory):
    runs = []
    for entry in sorted(os.listdir(directory)):
        m = re.fullmatch(r"(pagoda|llama)-c(\d+)-r(\d+)\.json", entry)
        if not m:
            continue
        with open(os.path.join(directory, entry)) as f:
            d = json.load(f)
        s = d["summary"]
        machine = d.get("machine", {})
        runs.append(
            {
                "server": m.group(1),
                "streams": int(m.group(2)),
                "round": int(m.group(3)),
                "tok_s": s["output_throughput"],
                "ttft": s["ttft_ms"]["median"],
                "tpot": s["tpot_ms"]["median"],
                "completed": s["completed"],
                "failed": s["failed"],
                "load": machine.get("load1_at_start"),
                "steal": machine.get("steal_fraction"),
            }
        )
    return runs


def spread(values, digits):
    fmt = f"{{:.{digits}f}}"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def read_kv(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, _, value = line.rstrip("\n").partition("=")
                out[key] = value
    return out


def render(directory):
    runs = load_runs(directory)
    if not runs:
        raise SystemExit(f"{directory}: no results")
    machine = read_kv(os.path.join(directory, "machine"))
    lines = ["# Pagoda next to llama.cpp", ""]
    lines.append(
        f"- CPU: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores; flags: "
        f"{machine.get('flags', '?').strip() or 'none of avx2/avx512/amx'}"
    )
    loads = [r["load"] for r in runs if r["load"] is not None]
    steals = [r["steal"] for r in runs if r["steal"] is not None]
    lines.append(
        f"- Load average (1 min): {machine.get('load_start', '?')} at the start, "
        f"{max(loads) if loads else '?'} at most before a run (our own previous run included), "
        f"{machine.get('load_end', '?')} at the end; CPU time stolen by the hypervisor during the runs: "
        f"{100 * max(steals) if steals else 0:.1f} % at most"
    )
    lines.append(f"- Pagoda {machine.get('pagoda', '?')}; llama.cpp {machine.get('llama', '?')}")
    if machine.get("isa", "native") != "native":
        lines.append(
            f"- Instructions capped at {machine['isa']} for both servers (PAGODA_CPU_ISA, llama.cpp built for it)"
        )
    if machine.get("pagoda_large_steps"):
        lines.append(f"- Pagoda's kernel plan, as its start-up logged it: {machine['pagoda_large_steps']}")
    if machine.get("llama_extra"):
        lines.append(f"- llama-server crashed at start without `{machine['llama_extra']}` and ran with it")
    rounds = max(r["round"] for r in runs)
    lines += [
        f"- {rounds} round(s); each cell is the median over rounds (min–max).",
        "",
        "| streams | Pagoda tok/s | llama.cpp tok/s | tok/s ratio (per round) | Pagoda TTFT p50 ms "
        "| llama.cpp TTFT p50 ms | TTFT ratio | Pagoda TPOT p50 ms | llama.cpp TPOT p50 ms | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted({r["streams"] for r in runs}):
        by = {name: [r for r in runs if r["server"] == name and r["streams"] == c] for name in NAMES}
        p, l = by["pagoda"], by["llama"]
        if not p or not l:
            continue
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        per_round = [
            a["tok_s"] / b["tok_s"]
            for a in p
            for b in l
            if a["round"] == b["round"] and b["tok_s"] > 0
        ]
        ratio = med(p, "tok_s") / med(l, "tok_s") if med(l, "tok_s") > 0 else float("inf")
        ratio_cell = f"**{ratio:.2f}×**"
        if len(per_round) > 1:
            ratio_cell += f" ({min(per_round):.2f}–{max(per_round):.2f})"
        ttft_ratio = med(p, "ttft") / med(l, "ttft") if med(l, "ttft") > 0 else float("inf")
        lines.append(
            f"| {c} | {spread([r['tok_s'] for r in p], 1)} | {spread([r['tok_s'] for r in l], 1)} | {ratio_cell} "
            f"| {spread([r['ttft'] for r in p], 0)} | {spread([r['ttft'] for r in l], 0)} | {ttft_ratio:.2f} "
            f"| {spread([r['tpot'] for r in p], 2)} | {spread([r['tpot'] for r in l], 2)} "
            f"| {sum(r['failed'] for r in p)} / {sum(r['failed'] for r in l)} |"
        )
    lines += [
        "",
        "Every run:",
        "",
        "| round | server | streams | output tok/s | TTFT p50 ms | TPOT p50 ms | completed | failed | load at start | stolen |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["round"], r["streams"], r["server"])):
        steal = f"{100 * r['steal']:.1f} %" if r["steal"] is not None else "?"
        lines.append(
            f"| {r['round']} | {NAMES[r['server']]} | {r['streams']} | {r['tok_s']:.1f} | {r['ttft']:.0f} "
            f"| {r['tpot']:.2f} | {r['completed']} | {r['failed']} | {r['load']} | {steal} |"
        )
    commands = []
    path = os.path.join(directory, "commands")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = re.sub(r"\S*/(pagoda|llama-server) ", r"\1 ", line.strip())
                if line and line not in commands:
                    commands.append(line)
    lines += ["", "Commands (servers as run; the client once per run):", "", "```"]
    lines += commands
    lines += [machine.get("bench", "pagoda-bench serve ..."), "```", ""]
    return "\n".join(lines)


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def put(server, c, rnd, tok_s, ttft, failed=0):
            summary = {
                "output_throughput": tok_s,
                "ttft_ms": {"median": ttft},
                "tpot_ms": {"median": 1000.0 / tok_s * c},
                "completed": 4 * c,
                "failed": failed,
            }
            with open(os.path.join(d, f"{server}-c{c}-r{rnd}.json"), "w") as f:
                json.dump({"summary": summary, "machine": {"load1_at_start": 0.1, "steal_fraction": 0.02}}, f)

        for rnd, (p, l) in enumerate([(300.0, 100.0), (330.0, 110.0), (240.0, 120.0)], 1):
            put("pagoda", 32, rnd, p, 400.0 + rnd)
            put("llama", 32, rnd, l, 800.0, failed=1 if rnd == 2 else 0)
        put("pagoda", 1, 1, 90.0, 30.0)
        put("llama", 1, 1, 60.0, 20.0)
        with open(os.path.join(d, "machine"), "w") as f:
            f.write("cpu_model=Test CPU\ncores=2\nflags=avx512f avx512_bf16 \nload_start=0.1\nllama_extra=--no-repack\n"
                    "isa=avx2\npagoda_large_steps=cpu, float32 compute; int16 panels (avx2 instructions)\n")
        with open(os.path.join(d, "commands"), "w") as f:
            f.write("pagoda: /x/pagoda serve --model m\npagoda: /x/pagoda serve --model m\n")
        text = render(d)
    row32 = next(line for line in text.splitlines() if line.startswith("| 32 |"))
    # Medians 300 and 110: 2.73×; per-round ratios 3.00, 3.00, 2.00.
    assert "300.0 (240.0–330.0)" in row32, row32
    assert "110.0 (100.0–120.0)" in row32, row32
    assert "**2.73×** (2.00–3.00)" in row32, row32
    assert "| 0 / 1 |" in row32, row32
    row1 = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert "**1.50×**" in row1 and "| 1.50 |" in row1, row1
    assert text.count("pagoda serve --model m") == 1, "commands are listed once"
    assert "without `--no-repack`" in text and "Test CPU" in text and "2.0 %" in text
    assert "as its start-up logged it: cpu, float32 compute; int16 panels (avx2 instructions)" in text
    assert "capped at avx2 for both servers" in text
    print("bench_vs_llamacpp_table: self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    elif len(sys.argv) == 2:
        print(render(sys.argv[1]))
    else:
        raise SystemExit(__doc__)
