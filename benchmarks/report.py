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
            ["httpx / httpcore", f"{m['httpx']} / {m['httpcore']}"], ["Mooncake", m["mooncake"] or "-"],
            ["vLLM", m["vllm"] or "not measured"], ["date", m["date"]],
            ["load average (1 min) at start", f"{m['loadavg_start']:.2f}"],
            ["mode", m.get("mode", "full")], ["wall time of the run", secs(m.get("elapsed_s"))]]
    return table(["", ""], rows)


def cold_table(cold: dict[str, Any]) -> str:
    rows = cold["rows"]
    base = next((r for r in rows if "import vllm" in r["label"]), None)
    out = []
    for r in rows:
        speed = med(base["wall_s"]) / med(r["wall_s"]) if base and r is not base else None
        note = "" if r["exit_codes"] == [0] else f" (exit {', '.join(map(str, r['exit_codes']))})"
        out.append([f"`{r['label']}`{note}", cell(r["wall_s"]), f"{secs(r['wall_s']['stats']['min'])}-"
                    f"{secs(r['wall_s']['stats']['max'])}", f"{med(r['peak_rss_mib']):.0f} MiB",
                    times(speed) if speed else "-"])
    return table(["command (whole process)", "median (IQR, n)", "min-max", "peak RSS",
                  "faster than `import vllm`"], out)


def fanout_table(f: dict[str, Any]) -> str:
    conc = f["concurrencies"]
    single = med(f["single_reset_s"])
    header = ["N"] + [f"kvctl, --concurrency {c}: total" for c in conc] + \
        ["kvctl process (default)", "peak RSS (default)", "sequential curl loop", "rig floor (aiohttp)",
         "best kvctl / one reset"]
    out = []
    for n in f["sizes"]:
        rows = {r["concurrency"]: r for r in f["kvctl"] if r["n"] == n}
        seq = next((r for r in f["sequential"] if r["n"] == n), None)
        fl = next((r for r in f.get("floor", []) if r["n"] == n), None)
        default = rows.get(conc[0])
        best = min((med(r["total_s"]) for r in rows.values()), default=None)
        out.append([str(n)] + [cell(rows[c]["total_s"]) if c in rows else "-" for c in conc]
                   + [cell(default["process_s"]) if default else "-",
                      f"{med(default['peak_rss_mib']):.0f} MiB" if default else "-",
                      cell(seq["process_s"]) if seq else "not run", cell(fl["total_s"]) if fl else "-",
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


def ttft_table(rs: dict[str, Any]) -> str:
    t = rs["ttft"]
    labels = {"cached": "cached (local prefix cache)",
              "after_local_reset": "after a local-only reset (`kvctl reset`: KV loaded back from Mooncake)",
              "after_hard_reset": "after `kvctl reset --connector` (recomputed)"}
    base = med(t["cached"]["ttft_s"])
    rows = []
    for key, label in labels.items():
        x = t[key]
        rows.append([label, cell(x["ttft_s"]), times(med(x["ttft_s"]) / base) if base else "-",
                     ", ".join(f"{c:g}" for c in x["cached_tokens"]), str(x["prompt_tokens"])])
    return table(["probe prompt", "time to first token", "vs cached", "cached tokens", "prompt tokens"], rows)


# -- targets --------------------------------------------------------------------------------------
def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cold = res.get("cold_start")
    if cold:
        kv = [r for r in cold["rows"] if r["label"].startswith("kvctl")]
        worst = max(kv, key=lambda r: med(r["wall_s"]))
        out.append({"target": "cold start: every kvctl command's median under 0.3 s",
                    "measured": f"slowest: `{worst['label']}` {secs(med(worst['wall_s']))}",
                    "met": med(worst["wall_s"]) < 0.3})
        base = next((r for r in cold["rows"] if "import vllm" in r["label"]), None)
        if base:
            slowest = med(base["wall_s"]) / med(worst["wall_s"])
            out.append({"target": "cold start: at least 15x faster than `import vllm`",
                        "measured": f"{times(slowest)} for the slowest kvctl command "
                                    f"(`import vllm`: {secs(med(base['wall_s']))})",
                        "met": slowest >= 15})
    f = res.get("fanout")
    if f and max(f["sizes"]) >= 1024:
        single = med(f["single_reset_s"])
        rows = [r for r in f["kvctl"] if r["n"] == max(f["sizes"])]
        best = min(rows, key=lambda r: med(r["total_s"]))
        default = next(r for r in rows if r["concurrency"] == f["concurrencies"][0])
        out.append({"target": "fan-out: kvctl's total at N = 1024 within 2x of one reset",
                    "measured": f"{secs(med(best['total_s']))} at --concurrency {best['concurrency']} "
                                f"({times(med(best['total_s']) / single)} one reset of {secs(single)}); default "
                                f"--concurrency {default['concurrency']}: {secs(med(default['total_s']))}",
                    "met": med(best["total_s"]) <= 2 * single})
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
def plot(res: dict[str, Any], path: Path = PLOT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = res["fanout"]
    sizes = f["sizes"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [2, 1]})
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
    ax2.set_xscale("log")
    ax2.set_xticks(sizes)
    ax2.set_xticklabels([str(n) for n in sizes])
    ax2.set_xlabel("replicas (N)")
    ax2.set_ylabel("MiB")
    ax2.set_title("kvctl peak RSS")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- notes: what the numbers say, and why a target is missed ------------------------------------
def notes(res: dict[str, Any]) -> dict[str, str]:
    return {k: "" for k in ("why", "cold_notes", "fanout_notes", "master_notes", "real_notes", "ttft_notes")}


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
