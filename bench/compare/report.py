"""The report of one comparison run: Markdown, and PNG charts beside it.

``write(result, stem)`` takes the run's JSON (as run.py builds it) and writes
``<stem>.md``, ``<stem>-queries.png`` (query latency per system per query,
log scale) and ``<stem>-ingest.png`` (ingest rows/s per client count).
It can also be run on a saved JSON file:

    python3 bench/compare/report.py bench/results/compare-DATE-quick.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# Single-row ingest results are named after the system plus this (run.py).
SINGLE_ROWS = " single rows"
ORDER = ["sealion", "sealion-pg", "sealion-cluster", "postgres-plain", "postgres-part", "duckdb", "chdb", "datafusion"]
INGEST_ORDER = ["sealion", "sealion-pg", "sealion-cluster-rf1", "sealion-cluster-rf3", "postgres", "victoriametrics",
                "influxdb"]


def client_name(recorded: str | None) -> str:
    """How a run's JSON names the client Sealion's queries went over, in
    words (runs before the setting was recorded used Python's http.client)."""
    names = {
        "httpconn": "a keep-alive socket reading each answer into one buffer (`bench/compare/httpconn.py`)",
        "http.client": "Python's http.client",
    }
    if recorded is None:
        return names["http.client"]
    return names.get(recorded, recorded)


def _ms(t: dict | None) -> str:
    if not t:
        return "-"
    return f"{t['median'] * 1e3:.1f} ({t['min'] * 1e3:.1f}–{t['max'] * 1e3:.1f})"


def _iot(r: dict) -> bool:
    return r.get("query_data") == "iot"


def _table(r: dict) -> tuple[str, str, int]:
    """The queried table, its key tag and its number of fields."""
    return ("readings", "name", 7) if _iot(r) else ("cpu", "hostname", 10)


def _systems(r: dict) -> list[str]:
    have = list(r.get("load", {}))
    return [s for s in ORDER if s in have] + [s for s in have if s not in ORDER]


def _cell_state(r: dict, q: str, s: str) -> str:
    p = r["parity"][q]
    if s in p["errors"]:
        return "error"
    if s in p["differ"]:
        return "differs"
    return "not run"


def ratios(r: dict) -> dict[str, dict]:
    """Sealion's median over each peer's, per query, and their geometric mean."""
    out = {}
    for peer in _systems(r):
        if peer.startswith("sealion"):
            continue
        per_q = {}
        for q, t in r.get("timings", {}).items():
            if "sealion" in t and peer in t:
                per_q[q] = t["sealion"]["median"] / t[peer]["median"]
        gm = math.exp(sum(math.log(v) for v in per_q.values()) / len(per_q)) if per_q else None
        out[peer] = {"per_query": per_q, "geomean": gm,
                     "sealion_faster": sum(1 for v in per_q.values() if v < 1),
                     "sealion_slower": sum(1 for v in per_q.values() if v >= 1)}
    return out


# Issue 7's goals, as the report checks them.
GOAL_LOOKUP_VS_BTREE = 3.0
GOAL_LOOKUP_VS_SCAN = 100.0
GOAL_INGEST_ROWS_S = 300_000
GOAL_BYTES_PER_VALUE = 0.6


def goals(r: dict) -> list[str]:
    """One line per goal of issue 7 that this run measures: met, or missed
    by how much."""
    out: list[str] = []
    tm = r.get("timings", {})
    peers = [p for p in _systems(r) if not p.startswith("sealion")]

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    # Every query at least as fast as the fastest peer.
    misses = []
    timed = 0
    for q in r.get("queries", []):
        t = tm.get(q["name"], {})
        best = min(((t[p]["median"], p) for p in peers if p in t), default=None)
        if "sealion" not in t or best is None:
            continue
        timed += 1
        ratio = t["sealion"]["median"] / best[0]
        if ratio > 1.0:
            misses.append(f"{q['name']} {ratio:.2f}x {best[1]}")
    if timed:
        out.append(f"- Every query at least as fast as the fastest peer: {verdict(not misses)}, "
                   f"{timed - len(misses)} of {timed}"
                   + (f"; slower on {', '.join(misses)}." if misses else "."))
    rat = ratios(r)
    gms = {p: rat[p]["geomean"] for p in peers if rat.get(p, {}).get("geomean")}
    if gms:
        behind = {p: g for p, g in gms.items() if g >= 1.0}
        out.append(f"- Geometric mean ahead of every peer: {verdict(not behind)} ("
                   + ", ".join(f"{p} {g:.2f}" for p, g in gms.items()) + ").")
    # The lookups with no time predicate, against the B-tree and a scan of
    # every row by Sealion itself.
    scan = r.get("full_scan", {}).get("timings", {}).get("sealion", {}).get("median")
    for q in (q for q in r.get("queries", []) if q.get("group") == "000"):
        t = tm.get(q["name"], {})
        if "sealion" not in t:
            continue
        me = t["sealion"]["median"]
        parts = []
        if "postgres-plain" in t:
            x = me / t["postgres-plain"]["median"]
            parts.append(f"{x:.2f}x PostgreSQL's B-tree (goal within {GOAL_LOOKUP_VS_BTREE:g}x: "
                         f"{'met' if x <= GOAL_LOOKUP_VS_BTREE else 'missed'})")
        if scan:
            x = scan / me
            parts.append(f"{x:.0f}x faster than Sealion's full scan (goal {GOAL_LOOKUP_VS_SCAN:g}x: "
                         f"{'met' if x >= GOAL_LOOKUP_VS_SCAN else 'missed'})")
        if "datafusion" in t:
            x = t["datafusion"]["median"] / me
            parts.append(f"{x:.0f}x faster than DataFusion over the Parquet files")
        if parts:
            out.append(f"- {q['name']}: " + "; ".join(parts) + ".")
    # Ingest: batched, synced, against COPY and InfluxDB.
    st = r.get("ingest", {}).get("stats", {})
    mine = st.get("sealion", {})
    if mine:
        per = []
        all_ok = True
        for c, m in mine.items():
            med = m["median"]
            ok = med >= GOAL_INGEST_ROWS_S
            vs = []
            for peer in ("postgres", "influxdb"):
                p = st.get(peer, {}).get(c)
                if p:
                    ok = ok and med > p["median"]
                    vs.append(f"{med / p['median']:.2f}x {'COPY' if peer == 'postgres' else peer}")
            all_ok = all_ok and ok
            per.append(f"{c}: {med / 1e3:,.0f}k rows/s" + (f" ({', '.join(vs)})" if vs else ""))
        out.append(f"- Ingest at least {GOAL_INGEST_ROWS_S / 1e3:,.0f}k rows/s with batches and synced writes, "
                   f"ahead of PostgreSQL COPY and InfluxDB, at every client count: {verdict(all_ok)} ("
                   + "; ".join(per) + ").")
    # Bytes per value on disk.
    dk = r.get("disk", {})
    rows = r.get("data", {}).get("rows", 0)
    vals = rows * _table(r)[2]
    b = dk.get("sealion", {}).get("system_partitions_table_bytes")
    if b and vals:
        mine_b = b / vals
        others = {}
        if "parts_bytes" in dk.get("chdb", {}):
            others["chDB"] = dk["chdb"]["parts_bytes"] / vals
        if "file_bytes" in dk.get("duckdb", {}):
            others["DuckDB"] = dk["duckdb"]["file_bytes"] / vals
        ok = mine_b <= GOAL_BYTES_PER_VALUE and all(mine_b < o for o in others.values())
        out.append(f"- At most {GOAL_BYTES_PER_VALUE} bytes per value, below ClickHouse's and DuckDB's: "
                   f"{verdict(ok)} ({mine_b:.3f}"
                   + "".join(f"; {n} {o:.3f}" for n, o in others.items()) + ").")
    return out


def charts(r: dict, stem: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    systems = _systems(r)
    qs = [q["name"] for q in r.get("queries", [])]
    if qs and r.get("timings"):
        fig, ax = plt.subplots(figsize=(11, max(6, 0.55 * len(qs) * max(1, len(systems)) / 3)))
        h = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            ys, xs = [], []
            for j, q in enumerate(qs):
                t = r["timings"].get(q, {}).get(s)
                if t:
                    ys.append(j + i * h)
                    xs.append(t["median"] * 1e3)
            ax.barh(ys, xs, height=h, label=s)
        ax.set_yticks([j + 0.4 - h / 2 for j in range(len(qs))])
        ax.set_yticklabels(qs, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("median latency, ms (log scale); missing bar: withheld or not run")
        title = (f"Query latency, {'IoT queries, ' if _iot(r) else ''}{r['scale']} scale "
                 f"({r['data']['rows']:,} rows)")
        if r.get("sealion_build") and r["sealion_build"] != "release":
            title += f" — Sealion {r['sealion_build'].upper()} build"
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{stem}-queries.png", dpi=110)
        plt.close(fig)
        made.append(f"{stem.name}-queries.png")
    ing = r.get("ingest", {}).get("stats")
    if ing:
        # Batched runs only: single-row rates are orders of magnitude lower
        # and are in the report's table.
        ing = {n: v for n, v in ing.items() if not n.endswith(SINGLE_ROWS)}
    if ing:
        names = [n for n in INGEST_ORDER if n in ing] + [n for n in ing if n not in INGEST_ORDER]
        cl = sorted({int(c) for v in ing.values() for c in v})
        fig, ax = plt.subplots(figsize=(8, 4.5))
        w = 0.8 / len(names)
        for i, n in enumerate(names):
            xs = [k + i * w for k, c in enumerate(cl) if str(c) in ing[n]]
            med = [ing[n][str(c)]["median"] for c in cl if str(c) in ing[n]]
            lo = [ing[n][str(c)]["median"] - ing[n][str(c)]["min"] for c in cl if str(c) in ing[n]]
            hi = [ing[n][str(c)]["max"] - ing[n][str(c)]["median"] for c in cl if str(c) in ing[n]]
            ax.bar(xs, med, width=w, label=n, yerr=[lo, hi], capsize=3)
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(cl))])
        ax.set_xticklabels([f"{c} client{'s' if c > 1 else ''}" for c in cl])
        ax.set_ylabel("rows/s (median, bars: min–max)")
        title = f"Ingest, batches of {r['settings']['batch_rows']} rows"
        if r.get("sealion_build") and r["sealion_build"] != "release":
            title += f" — Sealion {r['sealion_build'].upper()} build"
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{stem}-ingest.png", dpi=110)
        plt.close(fig)
        made.append(f"{stem.name}-ingest.png")
    return made


def markdown(r: dict, pngs: list[str]) -> str:
    L: list[str] = []
    d = r.get("data", {})
    systems = _systems(r)
    build = r.get("sealion_build")
    table, key, n_fields = _table(r)
    L.append(f"# Sealion against peers: {r['scale']} scale{', IoT queries' if _iot(r) else ''}, "
             f"{r['started'][:10]}\n")
    # The label is free text (a profile, or a commit for an A/B); only a
    # debug build's timings are not Sealion's.
    if build and "debug" in build.lower():
        L.append(f"> **This is a {build.upper()}-build run of Sealion** (`{r.get('sealion_binary')}`). "
                 "Its Sealion timings and ingest rates are not representative of Sealion; the parity results, "
                 "the peers' figures and the bytes on disk are. Re-run with a release binary for figures.\n")
    if r.get("error"):
        L.append(f"> **The run stopped with an error**: `{r['error']}`. Only what ran before it is below.\n")
    oc = r.get("other_cpu_during_queries")
    L.append("## What ran\n")
    L.append(f"- Command: `{r['command']}`")
    m = r["machine"]
    L.append(f"- Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}, "
             f"Python {m['python']}. Load average at start {' '.join(r['loadavg_start'])}, "
             f"at end {' '.join(r.get('loadavg_end', []))}.")
    if oc:
        top = ", ".join(f"{t['comm']} {t['cpu_s']} s" for t in oc["top"])
        L.append(f"- Other processes on the machine used {oc['other_cpu_s']:.0f} CPU-seconds during the "
                 f"{oc['wall_s']:.0f} s of query timing ({oc['other_cores_busy']:.2f} of the "
                 f"{m['cores']} cores busy on average: the machine's busy time from /proc/stat less this run's "
                 f"processes; the longest-lived of them: {top or 'none'}). The figures were taken beside that load.")
    if _iot(r):
        L.append(f"- Data: the IoT shape (`--query-data iot`, bench/compare/gen_iot.py), table `readings`: "
                 f"{d.get('rows', 0):,} rows from {d.get('trucks')} trucks over {d.get('days'):g} days from "
                 f"{d.get('start')} to {d.get('end')}, a reading every {d.get('interval_s')} s moved by -2..+2 s "
                 "of jitter (the first ones 2 s before the start), gaps (a truck offline for 1-30 minutes), "
                 f"{d.get('sparse_rows', 0):,} sparse rows (no velocity, heading: NULL), {d.get('late_rows', 0):,} "
                 f"late rows ({d.get('out_of_order_rows', 0):,} out of time order in the line protocol and CSV "
                 "files, which hold the rows in arrival order); 5 tags (name, fleet, driver, model, "
                 f"device_version), 7 DOUBLE fields; seed {d.get('seed')}. Line protocol {d.get('lp_bytes', 0):,} B, "
                 f"CSV {d.get('csv_bytes', 0):,} B, zstd Parquet {d.get('parquet_bytes', 0):,} B in one file "
                 "(sorted by name, time) ("
                 + ("reused from an earlier run with the same scale, seed and days)." if d.get("reused")
                    else f"generated in {d.get('generate_s', 0):.1f} s)."))
    else:
        L.append(f"- Data: TSBS cpu-only, {d.get('rows', 0):,} rows ({d.get('hosts')} hosts x "
                 f"{d.get('readings_per_host', 0):,} readings, every {d.get('interval_s')} s, "
                 f"{d.get('start')} to {d.get('end')}), 10 tags, 10 integer fields 0-100 stored as DOUBLE, seed "
                 f"{d.get('seed')}; {d.get('events', 0):,} events for the as-of join. Line protocol "
                 f"{d.get('lp_bytes', 0):,} B, CSV {d.get('csv_bytes', 0):,} B"
                 + (" (both zstd-compressed files, streamed as they load)"
                    if str(d.get("lp_file", "")).endswith(".zst") else "")
                 + f", zstd Parquet {d.get('parquet_bytes', 0):,} B "
                 f"in {d.get('parquet_files')} files ("
                 + ("reused from an earlier run with the same scale and seed)." if d.get("reused")
                    else f"generated in {d.get('generate_s', 0):.1f} s)."))
    st = r["settings"]
    more = (f", more up to {st['max_runs']} while they add up to less than {st['min_time_s']} s "
            "(the same rule for every system; the median is over all of them)"
            if st.get("min_time_s") and st.get("max_runs", 0) > st["runs"] else "")
    L.append(f"- Timing: {st['warmup']} warm-up, then {st['runs']} timed runs per query per system{more}; "
             "median (min–max) in ms, wall time on the client, the full answer fetched. Embedded systems "
             "(DuckDB, chDB, DataFusion) run in the benchmark's process; Sealion is asked over HTTP "
             f"with {client_name(st.get('sealion_http_client'))} (`format=arrow`, decoded by pyarrow; `sealion-pg`, when present, is the same process over pgwire with psycopg; "
             "`sealion-cluster` is `sealion cluster` with one meta, three storage and one query process, "
             "replication factor 1, loaded and sealed the same way), "
             "PostgreSQL over TCP with psycopg: the noise floor below is each one's round trip. Ratios use "
             "the HTTP column.")
    L.append("- Parity first: every system's answer to every query is compared (rows sorted, floats to a "
             "relative 1e-9) before any timing; a pair that errors or disagrees with the majority is withheld "
             "and listed below with the reason.")
    if "sealion" in r.get("load", {}):
        commit = f" of {r['sealion_commit']}" if r.get("sealion_commit") else ""
        L.append(f"- Sealion: `{r.get('sealion_binary')}` ({build} build{commit}, built {r.get('sealion_binary_mtime')}), "
                 f"started as `{r['load']['sealion'].get('command', 'sealion standalone ...')}` "
                 "in a temp dir (background sealing off); every partition sealed with "
                 "`/api/v1/admin/seal` after loading, so **the timings are of sealed data**.")
    if r.get("postgres_settings"):
        ps = ", ".join(f"{k}={v}" for k, v in r["postgres_settings"].items())
        L.append(f"- PostgreSQL settings (both layouts, one cluster): {ps}. `postgres-plain`: one table, "
                 f"B-tree on ({key}, time). `postgres-part`: partitioned by day on time, the same index. "
                 "VACUUM ANALYZE after loading.")
    L.append(f"- chDB: MergeTree, ORDER BY ({key}, time), PARTITION BY day, tags as String, "
             + ("fields as Nullable(Float64), " if _iot(r) else "")
             + "OPTIMIZE TABLE FINAL after loading. DuckDB: a file database, rows inserted sorted by "
             f"({key}, time). DataFusion: over the zstd Parquet "
             + ("file (sorted by name, time)" if _iot(r) else "files (one per day, sorted by hostname, time)")
             + ", 2 target partitions.")
    L.append("")
    L.append("Versions:\n")
    for s in systems:
        L.append(f"- {s}: {r['load'][s].get('version', '?')}")
    for n, v in r.get("ingest", {}).get("versions", {}).items():
        L.append(f"- {n} (ingest): {v}")
    L.append("")

    for s, why in r.get("load_errors", {}).items():
        L.append(f"> **{s} could not be started or loaded and is left out**: `{why}`\n")
    if r.get("load"):
        L.append("## Load\n")
        L.append("| system | rows | how | seconds | rows/s | notes |")
        L.append("|---|---|---|---|---|---|")
        for s in systems:
            x = r["load"][s]
            if s in ("sealion", "sealion-cluster"):
                how = f"line protocol over HTTP, {x['batch_rows']} rows a request, {x['clients']} clients"
                note = f"then sealed in {x['seal_s']:.1f} s"
                secs = x["load_s"]
            elif s == "sealion-pg":
                L.append(f"| {s} | - | the `sealion` process, asked over pgwire | - | - | |")
                continue
            elif s.startswith("postgres"):
                how = "one COPY (CSV) from the client"
                note = f"then index {x['index_s']:.1f} s, VACUUM ANALYZE {x['vacuum_analyze_s']:.1f} s"
                secs = x["copy_s"]
            else:
                how = x.get("from", "")
                note = x.get("note", "")
                secs = x["load_s"]
            rps = f"{x['rows_per_s']:,.0f}" if x.get("rows_per_s") else "-"
            L.append(f"| {s} | {x.get('rows', '-'):,} | {how} | {secs:.2f} | {rps} | {note} |"
                     if isinstance(x.get("rows"), int) else f"| {s} | - | {how} | {secs:.2f} | {rps} | {note} |")
        L.append("")

    parts = r.get("load", {}).get("sealion", {}).get("partitions")
    if parts and parts.get("rows"):
        cols = [c["name"] if isinstance(c, dict) else c for c in parts["columns"]]
        tcol = "table_name" if "table_name" in cols else "table"
        if tcol in cols and "state" in cols:
            ti, si = cols.index(tcol), cols.index("state")
            count: dict[tuple, int] = {}
            for row in parts["rows"]:
                count[(row[ti], row[si])] = count.get((row[ti], row[si]), 0) + 1
            L.append("Sealion's partitions after the seal call (`system.partitions`): " + ", ".join(
                f"{t}: {n} {st}" for (t, st), n in sorted(count.items())) + ".\n")
    if r.get("noise_floor"):
        L.append("## Noise floor\n")
        L.append("`SELECT 1`, the same warm-up, then "
                 f"{st['noise_runs']} runs: what a query costs each system before it reads a row (ms).\n")
        L.append("| system | median (min–max) ms |")
        L.append("|---|---|")
        for s in systems:
            L.append(f"| {s} | {_ms(r['noise_floor'].get(s))} |")
        L.append("")

    if r.get("timings"):
        fs = r.get("full_scan")
        if fs:
            L.append("## Full scan\n")
            L.append(f"`{fs['sql']}`, the same warm-up and runs: what reading two columns of every row costs "
                     "each system (no statistics can rule rows out for it), the reference for the lookups with "
                     "no time predicate (ms).\n")
            L.append("| system | median (min–max) ms |")
            L.append("|---|---|")
            for s_, t in fs["timings"].items():
                L.append(f"| {s_} | {_ms(t) if 'median' in t else 'error: ' + t.get('error', '')} |")
            L.append("")
        L.append("## Query latency\n")
        L.append("Median (min–max) ms. *withheld*: the answer differed or the query failed (see below); "
                 "*not run*: the system has no such construct.\n")
        L.append("| query | " + " | ".join(systems) + " |")
        L.append("|---|" + "---|" * len(systems))
        for q in r["queries"]:
            cells = []
            for s in systems:
                t = r["timings"].get(q["name"], {}).get(s)
                if t:
                    cells.append(_ms(t))
                else:
                    state = _cell_state(r, q["name"], s)
                    cells.append("not run" if state == "not run" else f"*withheld ({state})*")
            L.append(f"| {q['name']} | " + " | ".join(cells) + " |")
        L.append("")
        if pngs:
            L.append(f"![query latency]({pngs[0]})\n")

        rat = ratios(r)
        if rat and "sealion" in systems:
            L.append("## Ratios\n")
            L.append("Sealion's median over the peer's: **below 1 Sealion is faster, above 1 it is slower.** "
                     "Only the queries timed on both. Geometric mean over those queries.\n")
            peers = [p for p in systems if not p.startswith("sealion")]
            L.append("| query | " + " | ".join(peers) + " |")
            L.append("|---|" + "---|" * len(peers))
            for q in r["queries"]:
                L.append(f"| {q['name']} | " + " | ".join(
                    f"{rat[p]['per_query'][q['name']]:.2f}" if q["name"] in rat[p]["per_query"] else "-"
                    for p in peers) + " |")
            L.append("| **geometric mean** | " + " | ".join(
                f"**{rat[p]['geomean']:.2f}**" if rat[p]["geomean"] else "-" for p in peers) + " |")
            L.append("| Sealion faster / slower (queries) | " + " | ".join(
                f"{rat[p]['sealion_faster']} / {rat[p]['sealion_slower']}" for p in peers) + " |")
            L.append("")

    g = goals(r)
    if g:
        L.append("## Goals\n")
        L.append("Issue 7's goals, checked against this run's medians.\n")
        L.extend(g)
        L.append("")

    if r.get("parity"):
        L.append("## Withheld and not run\n")
        n = 0
        for q in r["queries"]:
            p = r["parity"][q["name"]]
            for s, why in p["errors"].items():
                L.append(f"- **{q['name']}** on {s}: error: `{why}`")
                n += 1
            for s, why in p["differ"].items():
                L.append(f"- **{q['name']}** on {s}: {why}")
                n += 1
            for dialect, why in q.get("skip", {}).items():
                L.append(f"- **{q['name']}** on {dialect}: not run: {why}")
                n += 1
        if not n:
            L.append("None: every system agreed on every query it ran.")
        L.append("")
        total = sum(len(r["timings"].get(q["name"], {})) for q in r["queries"]) if r.get("timings") else 0
        L.append(f"{len(r['queries'])} queries; {total} system/query pairs timed.\n")

    if r.get("disk"):
        L.append("## Bytes on disk\n")
        rows = d.get("rows", 0)
        vals = rows * n_fields
        L.append(f"Per field value: bytes over {vals:,} values ({rows:,} rows x {n_fields} fields; time and tags "
                 f"included in the bytes). The `{table}` table only unless said. Measured once, after the query "
                 "timings (Sealion: after the seal, before the ingest runs); whether a system reclaims more "
                 "later (compaction, log recycling) is not measured.\n")
        L.append("| system | bytes | per value | what was counted |")
        L.append("|---|---|---|---|")
        for s in systems:
            x = r["disk"].get(s, {})
            if "error" in x:
                L.append(f"| {s} | - | - | error: {x['error']} |")
                continue
            if s == "sealion":
                b = x.get("system_partitions_table_bytes", x.get("system_partitions_cpu_bytes"))
                L.append(f"| {s} | {b:,} | {b / vals:.3f} | `bytes` of the {table} partitions in system.partitions |"
                         if b else f"| {s} | - | - | system.partitions gave no bytes |")
                L.append(f"| sealion (data dir) | {x['data_dir_bytes']:,} | {x['data_dir_bytes'] / vals:.3f} | "
                         "every file under --data-dir (" + ("" if _iot(r) else "both tables, ")
                         + "sealed files, RocksDB, meta) |")
                if "sealed_dir_bytes" in x:
                    L.append(f"| sealion (of which sealed files) | {x['sealed_dir_bytes']:,} | "
                             f"{x['sealed_dir_bytes'] / vals:.3f} | `storage/sealed`"
                             + ("" if _iot(r) else " (cpu and events)") + " |")
                    L.append(f"| sealion (of which RocksDB) | {x['rocksdb_dir_bytes']:,} | "
                             f"{x['rocksdb_dir_bytes'] / vals:.3f} | `storage/rows`: write-ahead logs "
                             f"{x['rocksdb_log_bytes']:,}, table files {x['rocksdb_sst_bytes']:,} |")
                    L.append(f"| sealion (of which meta) | {x.get('meta_dir_bytes', 0):,} | "
                             f"{x.get('meta_dir_bytes', 0) / vals:.3f} | `meta` (Raft log and state) |")
            elif s.startswith("postgres"):
                L.append(f"| {s} | {x['total_bytes']:,} | {x['total_bytes'] / vals:.3f} | heap "
                         f"{x['table_bytes']:,} + indexes {x['index_bytes']:,} |")
            elif s == "duckdb":
                L.append(f"| {s} | {x['file_bytes']:,} | {x['file_bytes'] / vals:.3f} | the database file "
                         + ("|" if _iot(r) else "(both tables) |"))
            elif s == "chdb":
                L.append(f"| {s} | {x['parts_bytes']:,} | {x['parts_bytes'] / vals:.3f} | active parts of {table} "
                         "(system.parts) |")
            elif s == "sealion-cluster":
                L.append(f"| {s} | {x['data_dir_bytes']:,} | {x['data_dir_bytes'] / vals:.3f} | every file under "
                         "the cluster's data dir (meta, three storage nodes; both tables) |")
            elif s == "datafusion":
                L.append(f"| {s} | {x['parquet_bytes']:,} | {x['parquet_bytes'] / vals:.3f} | the zstd Parquet "
                         + ("file |" if _iot(r) else "files |"))
        for n, x in r.get("ingest", {}).get("disk", {}).items():
            b = x.get("data_dir_bytes", 0) + x.get("wal_dir_bytes", 0)
            L.append(f"| {n} | {b:,} | {b / vals:.3f} | data dir" + (" + WAL dir" if "wal_dir_bytes" in x else "")
                     + " after loading the data set |")
        L.append("")

    ing = r.get("ingest")
    if ing:
        L.append("## Ingest\n")
        L.append(f"{ing['rows_per_run']:,} rows per run in batches of {st['batch_rows']} rows (one request or "
                 "one COPY each), batch i sent by client i mod N, each client one keep-alive connection; each run "
                 f"into a new table; one warm-up run, then {st['ingest_runs']} runs, the client counts interleaved (every count's "
                 "warm-up, then every count's first run, and so on; systems interleaved within each), so background work "
                 "left by one run falls on every count alike. Rows/s over the run's wall "
                 "time: median (min–max). Sealion, VictoriaMetrics and InfluxDB get line protocol over HTTP "
                 "(`precision=s`); `sealion-pg` is the same `sealion standalone` process given one multi-row "
                 "`INSERT ... VALUES` per batch over its PostgreSQL port; `sealion-cluster-rfN` is `sealion cluster` "
                 "(1 meta, 3 storage, 1 query process on these same cores) at replication factor N, every write "
                 "synced on each replica before it is acknowledged; PostgreSQL gets `COPY ... FROM STDIN (FORMAT csv)` of the same rows into a table "
                 "with the B-tree on (hostname, time), synchronous_commit on. The client (this Python process, one "
                 "thread per client) runs on the same cores as the server it writes to.\n")
        sh = ing.get("shape", {})
        if sh.get("data") == "iot":
            L.append(f"The rows are the **IoT shape** (`--ingest-data iot`, bench/compare/gen_iot.py): {sh['trucks']} "
                     f"trucks, a reading every 10 s with -2..+2 s of jitter, gaps, {sh['sparse_rows']:,} sparse rows "
                     f"and {sh['late_rows']:,} late rows of {sh['rows']:,} ({sh['out_of_order_rows']:,} out of time "
                     "order in the file), 5 tags and 7 DOUBLE fields; each run sends the file's first rows in "
                     f"arrival order. Bytes on disk above are of the query systems' `{table}` table.\n")
        if ing.get("single_row_rows"):
            L.append(f"Rows named *{SINGLE_ROWS.strip()}* are the same systems given **one row per request** "
                     f"(one HTTP write, one `INSERT`, one `COPY`), {ing['single_row_rows']:,} rows per run, each "
                     "acknowledged (for Sealion: synced on every replica) before the client sends its next.\n")
        batched = [n for n in ing.get("stats", {}) if not n.endswith(SINGLE_ROWS)]
        names = [n for n in INGEST_ORDER if n in batched] + [n for n in batched if n not in INGEST_ORDER]
        names += [n + SINGLE_ROWS for n in names if n + SINGLE_ROWS in ing.get("stats", {})]
        cl = st["ingest_clients"]
        L.append("| system | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in cl) + " |")
        L.append("|---|" + "---|" * len(cl))
        for n in names:
            L.append(f"| {n} | " + " | ".join(
                (lambda t: f"{t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f})" if t else "-")(
                    ing["stats"][n].get(str(c))) for c in cl) + " |")
        L.append("")
        for n, why in ing.get("notes", {}).items():
            L.append(f"- {n}: {why}")
        for n, x in ing.get("load", {}).items():
            L.append(f"- {n}: the whole data set ({x['rows']:,} rows, {r['settings']['load_clients']} clients) "
                     f"loaded at {x['rows_per_s']:,.0f} rows/s before the runs, for bytes on disk.")
        o = ing.get("other_cpu")
        if o:
            L.append(f"- Other processes used {o['other_cpu_s']:.0f} CPU-seconds during the {o['wall_s']:.0f} s "
                     f"of ingest runs ({o['other_cpu_s'] / o['wall_s']:.2f} cores on average).")
        L.append("")
        if len(pngs) > 1:
            L.append(f"![ingest]({pngs[1]})\n")

    if r.get("queries"):
        L.append("## SQL\n")
        L.append("Sealion's SQL for each query (every dialect's text is in the JSON beside this file and in "
                 "bench/compare/queries.py).\n")
        for q in r["queries"]:
            sql = q["sql"].get("sealion")
            L.append(f"- {q['name']}: `{sql}`" if sql else f"- {q['name']}: not run (see above)")
        L.append("")
    L.append(f"Run took {r.get('wall_s', 0):.0f} s in all. Raw figures: the JSON beside this file.\n")
    return "\n".join(L)


def write(result: dict, stem: Path | str) -> None:
    stem = Path(stem)
    try:
        pngs = charts(result, stem)
    except Exception as e:  # a chart is not worth losing the report for
        pngs = []
        result.setdefault("report_notes", []).append(f"charts failed: {e}")
    Path(f"{stem}.md").write_text(markdown(result, pngs))


if __name__ == "__main__":
    p = Path(sys.argv[1])
    write(json.loads(p.read_text()), p.with_suffix(""))
