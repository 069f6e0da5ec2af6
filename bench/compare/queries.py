"""Every query of the comparison, each system's SQL side by side.

One ``Query`` holds a name, the group it comes from (``tsbs``: the TSBS
devops set; ``002``: the six queries of seed 002 as they map to cpu data;
``000``: the no-time-predicate lookups of seed 000) and the SQL per dialect:

- ``sealion``: DataFusion SQL plus Sealion's extras (``date_bin``,
  ``DISTINCT ON``, ``asof_join('left','right','key')``); the same text as
  bench/src/query.rs where that file has the query;
- ``datafusion``: the same text as Sealion's, but for the as-of join, which
  DataFusion has no construct for: it is asked PostgreSQL's LATERAL form
  (which DataFusion 55 rejects; the error is recorded like any other);
- ``postgres``: the same SQL with ``date_bin`` given its origin argument and
  the as-of join as ``LEFT JOIN LATERAL (... ORDER BY time DESC LIMIT 1)``;
  used for both PostgreSQL tables (plain, and partitioned by day);
- ``duckdb``: ``time_bucket`` for ``date_bin``, ``ASOF LEFT JOIN``;
- ``chdb``: ClickHouse SQL: ``toStartOfInterval``, ``LIMIT 1 BY`` for
  ``DISTINCT ON``, ``ASOF LEFT JOIN``.

A dialect whose SQL is ``None`` does not run the query; ``skip[dialect]``
says why, and the report lists it. The parameters (hosts, windows) are
drawn from a seeded xorshift so every run asks the same questions.
``by_name`` marks ``SELECT *`` queries, whose answers are compared column by
column name because each system lists the columns in its own order.

Time literals are UTC; every session runs with TimeZone UTC.

``build_iot`` is the IoT set (``run.py --query-data iot``), asked of the
``readings`` table of gen_iot.py: the TSBS IoT queries in spirit, adapted
to the fields the shape has (see its docstring), plus lookups with no time
predicate. Its time bounds are literals computed from the data's start and
length, never ``now()``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from gen import DAY_S, FIELDS, START_S, Scale

HOUR_S = 3_600
DIALECTS = ["sealion", "datafusion", "postgres", "duckdb", "chdb"]


@dataclasses.dataclass
class Query:
    name: str
    group: str
    sql: dict[str, str | None]
    skip: dict[str, str] = dataclasses.field(default_factory=dict)
    by_name: bool = False


class _Rng:
    """xorshift64*, scalar: the query parameters."""

    def __init__(self, seed: int):
        self.s = seed or 1

    def below(self, n: int) -> int:
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & 0xFFFF_FFFF_FFFF_FFFF
        s ^= s >> 27
        self.s = s
        return ((s * 0x2545_F491_4F6C_DD1D) & 0xFFFF_FFFF_FFFF_FFFF) % n


def _iso(t: int, sep: str = "T", z: str = "Z") -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(f"%Y-%m-%d{sep}%H:%M:%S") + z


def ts(d: str, t: int) -> str:
    """A UTC time literal in dialect ``d``."""
    if d in ("sealion", "datafusion"):
        return f"'{_iso(t)}'"
    if d == "postgres":
        return f"'{_iso(t, ' ', '+00')}'"
    if d == "duckdb":
        return f"TIMESTAMPTZ '{_iso(t, ' ', '+00')}'"
    if d == "chdb":
        return f"toDateTime('{_iso(t, ' ', '')}', 'UTC')"
    raise ValueError(d)


def bucket(d: str, unit: str) -> str:
    """The start of the ``unit`` ('minute' or 'hour') containing ``time``."""
    return _bin(d, 1, unit, "time", plural=False)


def last_per_host(d: str, cols: str) -> str:
    """The newest row of each host (``DISTINCT ON`` where the dialect has it)."""
    if d == "chdb":
        return f"SELECT {cols} FROM cpu ORDER BY hostname, time DESC LIMIT 1 BY hostname"
    return f"SELECT DISTINCT ON (hostname) {cols} FROM cpu ORDER BY hostname, time DESC"


def _all(f) -> dict[str, str]:
    return {d: f(d) for d in DIALECTS}


def bin_of(d: str, n: int, unit: str, col: str = "time") -> str:
    """The start of the ``n`` ``unit`` ('minute', 'day') bucket holding
    ``col``; buckets aligned to the epoch (every dialect's origin is a
    midnight, so 10-minute and day buckets fall at the same instants)."""
    return _bin(d, n, unit, col, plural=True)


def _bin(d: str, n: int, unit: str, col: str, plural: bool) -> str:
    """The start of the ``n`` ``unit`` bucket holding ``col`` (the unit
    written plural in the interval text when ``plural``)."""
    width = f"{n} {unit}s" if plural else f"{n} {unit}"
    if d in ("sealion", "datafusion"):
        return f"date_bin(INTERVAL '{width}', {col})"
    if d == "postgres":
        return f"date_bin('{width}', {col}, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
    if d == "duckdb":
        return f"time_bucket(INTERVAL '{width}', {col})"
    if d == "chdb":
        return f"toStartOfInterval({col}, INTERVAL {n} {unit})"
    raise ValueError(d)


def last_per_truck(d: str, cols: str, where: str = "") -> str:
    """The newest row of each truck (``DISTINCT ON`` where the dialect has it)."""
    w = f" WHERE {where}" if where else ""
    if d == "chdb":
        return f"SELECT {cols} FROM readings{w} ORDER BY name, time DESC LIMIT 1 BY name"
    return f"SELECT DISTINCT ON (name) {cols} FROM readings{w} ORDER BY name, time DESC"


# Thresholds of the IoT set. gen_iot.py draws each reading's velocity
# uniformly from 0..120 (no truck ever stands still for ten minutes), and
# its fuel_consumption is a random walk in 1..60 (there is no fuel level):
STATIONARY_BELOW = 52.0  # TSBS: avg velocity < 1; here ~10% of the trucks
FUEL_ABOVE = 25.0  # TSBS low-fuel: fuel_state < 0.1; here latest consumption > 25
DRIVING_ABOVE = 1.0  # a 10-minute bucket is "driving" when avg velocity > 1 (as TSBS)
LONG_SESSION_BUCKETS = 22  # TSBS: more than 22 of the last 24 ten-minute buckets driving


def build_iot(scale: Scale, days: float) -> list[Query]:
    """The IoT queries over ``days`` days of gen_iot.py's readings."""
    from gen_iot import FLEETS, trucks_of

    rng = _Rng(7)
    end = START_S + int(days * DAY_S)

    def truck() -> str:
        return f"truck_{rng.below(trucks_of(scale))}"

    out: list[Query] = []
    # TSBS last-loc: where every truck is now (its newest reading).
    out.append(Query("last-loc", "iot", _all(
        lambda d: last_per_truck(d, "name, driver, time, latitude, longitude"))))
    # TSBS low-fuel, adapted: the trucks of one fleet whose newest reading
    # has fuel_consumption above the threshold (the filter is on the newest
    # row, so it must not be pushed below the DISTINCT ON).
    fleet = FLEETS[rng.below(len(FLEETS))]
    out.append(Query("low-fuel (latest fuel_consumption > 25)", "iot", _all(lambda d: (
        f"SELECT name, driver, time, fuel_consumption FROM ("
        f"{last_per_truck(d, 'name, driver, time, fuel_consumption', f'fleet = {chr(39)}{fleet}{chr(39)}')}"
        f") AS l WHERE fuel_consumption > {FUEL_ABOVE} ORDER BY name"))))
    out.append(Query("high-load", "iot", {d: None for d in DIALECTS}, skip={
        "every system": "the IoT shape has no current_load / load_capacity fields (TSBS keeps them in its "
                        "diagnostics table, which gen_iot.py does not generate)"}))
    # TSBS stationary-trucks: avg velocity over the last 10 minutes of the
    # data below a threshold (sparse rows' NULL velocity is left out of avg).
    t0 = end - 600
    out.append(Query("stationary-trucks (avg velocity < 52, last 10 min)", "iot", _all(lambda d: (
        f"SELECT name, driver, avg(velocity) AS v FROM readings WHERE time >= {ts(d, t0)} AND time < {ts(d, end)} "
        f"GROUP BY name, driver HAVING avg(velocity) < {STATIONARY_BELOW} ORDER BY name"))))
    # TSBS long-driving-sessions: over the last 4 hours, the trucks with more
    # than 22 ten-minute buckets whose avg velocity is above 1 (a bucket
    # whose rows all lack velocity has a NULL avg and does not count).
    t0 = end - 4 * HOUR_S
    out.append(Query("long-driving-sessions (last 4 h)", "iot", _all(lambda d: (
        f"SELECT name, driver, count(*) AS n FROM (SELECT name, driver, {bin_of(d, 10, 'minute')} AS ten "
        f"FROM readings WHERE time >= {ts(d, t0)} AND time < {ts(d, end)} GROUP BY name, driver, ten "
        f"HAVING avg(velocity) > {DRIVING_ABOVE}) AS s GROUP BY name, driver "
        f"HAVING count(*) > {LONG_SESSION_BUCKETS} ORDER BY name"))))
    # TSBS avg-daily-driving-duration, per truck: for each day of the data,
    # the ten-minute buckets driven (avg velocity above 1); hours = n / 6.
    out.append(Query("avg-daily-driving-duration (per truck and day)", "iot", _all(lambda d: (
        f"SELECT fleet, name, driver, {bin_of(d, 1, 'day', 'ten')} AS day, count(*) AS n FROM ("
        f"SELECT fleet, name, driver, {bin_of(d, 10, 'minute')} AS ten FROM readings "
        f"WHERE time >= {ts(d, START_S)} AND time < {ts(d, end)} GROUP BY fleet, name, driver, ten "
        f"HAVING avg(velocity) > {DRIVING_ABOVE}) AS s GROUP BY fleet, name, driver, day "
        f"ORDER BY fleet, name, day"))))
    # TSBS avg-vs-projected-fuel-consumption without the projection (no
    # nominal_fuel_consumption field): per fleet, over all history, the avg
    # fuel_consumption of the readings taken while moving. Sparse rows
    # (NULL velocity) fail the filter everywhere.
    out.append(Query("avg-fuel-consumption per fleet (moving, all history)", "iot", _all(lambda d: (
        f"SELECT fleet, avg(fuel_consumption) AS f, count(*) AS n FROM readings WHERE velocity > {DRIVING_ABOVE} "
        f"GROUP BY fleet ORDER BY fleet"))))
    out.append(Query("breakdown-frequency", "iot", {d: None for d in DIALECTS}, skip={
        "every system": "needs a status field (the IoT shape has none) and a window over each truck's "
                        "readings (lag), whose dialects differ too much for one side-by-side query"}))
    # No time predicate: one truck's newest row; one truck's every row (the
    # late rows must be in place, the sparse ones NULL, in every system).
    k = truck()
    out.append(Query("one truck's latest row", "iot", _all(
        lambda d: f"SELECT * FROM readings WHERE name = '{k}' ORDER BY time DESC LIMIT 1"), by_name=True))
    k = truck()
    out.append(Query("one truck's readings over all history", "iot", _all(
        lambda d: f"SELECT time, velocity, heading, fuel_consumption FROM readings WHERE name = '{k}' ORDER BY time")))
    return out


def build(scale: Scale) -> list[Query]:
    rng = _Rng(42)
    span = scale.seconds

    def host() -> str:
        return f"host_{rng.below(scale.hosts)}"

    def start(length: int) -> int:
        return START_S + rng.below(max((span - length) // HOUR_S, 1)) * HOUR_S

    def hosts_in(n: int) -> str:
        """``n`` distinct hosts (all of them if there are fewer)."""
        picked: set[str] = set()
        while len(picked) < min(n, scale.hosts):
            picked.add(f"'{host()}'")
        return ", ".join(sorted(picked))

    out: list[Query] = []
    for name, nm, nh, hours in [
        ("single-groupby-1-1-1", 1, 1, 1),
        ("single-groupby-1-1-12", 1, 1, 12),
        ("single-groupby-1-8-1", 1, 8, 1),
        ("single-groupby-5-1-1", 5, 1, 1),
        ("single-groupby-5-8-1", 5, 8, 1),
    ]:
        t0 = start(hours * HOUR_S)
        hs = hosts_in(nh)
        sel = ", ".join(f"max({m})" for m in FIELDS[:nm])
        out.append(Query(name, "tsbs", _all(lambda d, t0=t0, hs=hs, sel=sel, hours=hours: (
            f"SELECT {bucket(d, 'minute')} AS minute, {sel} FROM cpu WHERE hostname IN ({hs}) "
            f"AND time >= {ts(d, t0)} AND time < {ts(d, t0 + hours * HOUR_S)} GROUP BY minute ORDER BY minute"))))
    for name, nh in [("cpu-max-all-1", 1), ("cpu-max-all-8", 8)]:
        t0 = start(8 * HOUR_S)
        hs = hosts_in(nh)
        sel = ", ".join(f"max({m})" for m in FIELDS)
        out.append(Query(name, "tsbs", _all(lambda d, t0=t0, hs=hs, sel=sel: (
            f"SELECT {bucket(d, 'hour')} AS hour, {sel} FROM cpu WHERE hostname IN ({hs}) "
            f"AND time >= {ts(d, t0)} AND time < {ts(d, t0 + 8 * HOUR_S)} GROUP BY hour ORDER BY hour"))))
    for name, nm in [("double-groupby-1", 1), ("double-groupby-5", 5), ("double-groupby-all", 10)]:
        t0 = start(12 * HOUR_S)
        sel = ", ".join(f"avg({m})" for m in FIELDS[:nm])
        out.append(Query(name, "tsbs", _all(lambda d, t0=t0, sel=sel: (
            f"SELECT hostname, {bucket(d, 'hour')} AS hour, {sel} FROM cpu "
            f"WHERE time >= {ts(d, t0)} AND time < {ts(d, t0 + 12 * HOUR_S)} "
            f"GROUP BY hostname, hour ORDER BY hostname, hour"))))
    t0 = start(12 * HOUR_S)
    h = host()
    out.append(Query("high-cpu-1", "tsbs", _all(lambda d, t0=t0, h=h: (
        f"SELECT * FROM cpu WHERE usage_user > 90.0 AND hostname = '{h}' "
        f"AND time >= {ts(d, t0)} AND time < {ts(d, t0 + 12 * HOUR_S)} ORDER BY time")), by_name=True))
    t0 = start(12 * HOUR_S)
    out.append(Query("high-cpu-all", "tsbs", _all(lambda d, t0=t0: (
        f"SELECT * FROM cpu WHERE usage_user > 90.0 "
        f"AND time >= {ts(d, t0)} AND time < {ts(d, t0 + 12 * HOUR_S)} ORDER BY time, hostname")), by_name=True))
    out.append(Query("lastpoint", "tsbs", _all(lambda d: last_per_host(d, "*")), by_name=True))
    t0 = start(6 * HOUR_S)
    out.append(Query("groupby-orderby-limit", "tsbs", _all(lambda d, t0=t0: (
        f"SELECT {bucket(d, 'minute')} AS minute, max(usage_user) FROM cpu WHERE time < {ts(d, t0 + 6 * HOUR_S)} "
        f"GROUP BY minute ORDER BY minute DESC LIMIT 5"))))

    # Seed 002: last reading of every host; per-host and fleet aggregates
    # over a day and a week; a selective filter; an as-of join; a top ten.
    days = int(scale.days)
    day = START_S + (days // 2) * DAY_S
    week = START_S + max(days - 7, 0) * DAY_S
    out.append(Query("002 last reading of every host", "002", _all(
        lambda d: last_per_host(d, "hostname, time, usage_user, usage_system"))))
    for label, t0, length in [("a day", day, DAY_S), ("a week", week, 7 * DAY_S)]:
        out.append(Query(f"002 per-host aggregates over {label}", "002", _all(lambda d, t0=t0, length=length: (
            f"SELECT hostname, count(*), avg(usage_user), max(usage_system), min(usage_idle) FROM cpu "
            f"WHERE time >= {ts(d, t0)} AND time < {ts(d, t0 + length)} GROUP BY hostname ORDER BY hostname"))))
        out.append(Query(f"002 fleet aggregates over {label}", "002", _all(lambda d, t0=t0, length=length: (
            f"SELECT {bucket(d, 'hour')} AS hour, avg(usage_user), max(usage_user), count(*) FROM cpu "
            f"WHERE time >= {ts(d, t0)} AND time < {ts(d, t0 + length)} GROUP BY hour ORDER BY hour"))))
    h = host()
    out.append(Query("002 selective filter", "002", _all(lambda d, h=h: (
        f"SELECT time, usage_user, usage_system FROM cpu WHERE hostname = '{h}' AND usage_user > 95.0 "
        f"AND time >= {ts(d, day)} AND time < {ts(d, day + DAY_S)} ORDER BY time"))))
    asof_other = ("SELECT count(*), avg(c.usage_user), sum(c.usage_system) FROM events e ASOF LEFT JOIN cpu c "
                  "ON e.hostname = c.hostname AND e.time >= c.time")
    lateral = ("SELECT count(*), avg(c.usage_user), sum(c.usage_system) FROM events e LEFT JOIN LATERAL "
               "(SELECT usage_user, usage_system FROM cpu WHERE cpu.hostname = e.hostname AND cpu.time <= e.time "
               "ORDER BY cpu.time DESC LIMIT 1) c ON true")
    out.append(Query("002 as-of join (events to readings)", "002", {
        "sealion": "SELECT count(*), avg(cpu_usage_user), sum(cpu_usage_system) FROM asof_join('events', 'cpu', 'hostname')",
        # DataFusion has no ASOF JOIN; it is asked the LATERAL form, and its
        # answer (an error, with DataFusion 55) is recorded like any other.
        "datafusion": lateral,
        "postgres": lateral,
        "duckdb": asof_other,
        "chdb": asof_other.replace("count(*)", "count()"),
    }))
    out.append(Query("002 top ten", "002", _all(lambda d: (
        f"SELECT hostname, max(usage_user) AS m FROM cpu WHERE time >= {ts(d, day)} AND time < {ts(d, day + DAY_S)} "
        f"GROUP BY hostname ORDER BY m DESC, hostname LIMIT 10"))))

    # Seed 000: no time predicate.
    h = host()
    out.append(Query("000 one host's latest row", "000", _all(
        lambda d: f"SELECT * FROM cpu WHERE hostname = '{h}' ORDER BY time DESC LIMIT 1"), by_name=True))
    out.append(Query("000 one host's rows over all history", "000", _all(
        lambda d: f"SELECT time, usage_user FROM cpu WHERE hostname = '{h}' ORDER BY time")))
    out.append(Query("000 per-host count over all history", "000", _all(
        lambda d: "SELECT hostname, count(*) FROM cpu GROUP BY hostname ORDER BY hostname")))
    # Beside the lastpoint query: the newest three readings of every host,
    # with no time range, as a row number each system knows.
    out.append(Query("000 newest three readings of every host", "000", _all(lambda d: (
        "SELECT hostname, time, usage_user FROM (SELECT hostname, time, usage_user, row_number() OVER "
        "(PARTITION BY hostname ORDER BY time DESC) AS rn FROM cpu) AS t WHERE rn <= 3"))))
    return out


if __name__ == "__main__":
    import sys

    from gen import SCALES

    # queries.py [quick|full] [cpu|iot]
    sc = SCALES[sys.argv[1] if len(sys.argv) > 1 else "quick"]
    if len(sys.argv) > 2 and sys.argv[2] == "iot":
        from gen_iot import QUERY_DAYS
        qs = build_iot(sc, QUERY_DAYS.get(sc.name, QUERY_DAYS["full"]))
    else:
        qs = build(sc)
    for q in qs:
        print(f"## {q.name} ({q.group})")
        for d in DIALECTS:
            print(f"  {d:10} {q.sql.get(d) or 'not run: ' + q.skip.get(d, q.skip.get('every system', ''))}")
