"""Pictures of a session's or a project's work: tokens, cost and turn
latency over time, and how many agents were working at once, from the job rows.

Everything is aggregated in the database into ``BUCKETS`` equal time buckets spanning the
first job's creation to the last one's end (now, while one is still open): three queries
whatever the number of jobs — the span, the per-bucket sums by finishing time, and the
(start bucket, end bucket) pairs of the turns that ran (at most BUCKETS² / 2 rows) from
which the agents working per bucket are counted. The plots are drawn by the template
(``collab/_stats.html``) as inline SVG: no script, no library.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import (
    Avg,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    Max,
    Min,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Floor, Least
from django.utils import timezone

from collab.access import visible_sessions
from collab.models import Job

BUCKETS = 24
WIDTH, HEIGHT, PAD = 240, 64, 4  # the SVG's user units: the plot area is inside PAD


class Epoch(Func):
    """Seconds since 1970 of a datetime expression, as a float, on both databases."""

    output_field = FloatField()

    def as_sql(self, compiler, connection, **extra):  # PostgreSQL
        return super().as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::double precision", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)", **extra)


@dataclass
class Plot:
    key: str  # tokens | cost | latency | agents
    label: str
    values: list[float]
    unit: str = ""
    points: str = ""  # the polyline's "x,y x,y …", one pair per bucket
    area: str = ""  # the same, closed along the baseline
    dots: list[dict] = field(default_factory=list)  # x, y, title per bucket
    peak: float = 0.0
    total: str = ""


@dataclass
class Stats:
    title: str
    turns: int
    plots: list[Plot]
    start: datetime | None = None
    end: datetime | None = None
    width: int = WIDTH
    height: int = HEIGHT


def session_stats(session) -> Stats:
    """The session's jobs and those of its OpenWork sub-agents' sessions (their visibility is
    the session's own)."""
    jobs = Job.objects.filter(Q(session=session) | Q(session__parent_session=session))
    return job_stats(jobs, title=session.title or session.pk)


def project_stats(project, viewer) -> Stats:
    """The jobs of the project's sessions ``viewer`` may see."""
    jobs = Job.objects.filter(session__in=visible_sessions(viewer).filter(project=project))
    return job_stats(jobs, title=project.name)


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def job_stats(jobs, *, title: str, buckets: int = BUCKETS, now: datetime | None = None) -> Stats:
    """Per-bucket totals of ``jobs`` (a queryset); see the module docstring for the queries."""
    now = now or timezone.now()
    jobs = jobs.order_by()  # the model's default ordering would split every GROUP BY
    now_value = Value(now, output_field=DateTimeField())
    span = jobs.aggregate(
        t0=Min(Epoch("created_at")), t1=Max(Epoch(Coalesce("finished_at", now_value))), turns=Count("id"),
    )
    if not span["turns"]:
        return Stats(title=title, turns=0, plots=[])
    t0, t1 = float(span["t0"]), max(float(span["t1"]), float(span["t0"]))
    width = max((t1 - t0) / buckets, 1.0)

    def bucket(expression):
        return Least(Floor((Epoch(expression) - Value(t0)) / Value(width)), Value(float(buckets - 1)))

    sums = (
        jobs.annotate(b=bucket(Coalesce("finished_at", "started_at", "created_at"))).values("b")
        .annotate(
            tokens=Sum(F("tokens_in") + F("tokens_out")),
            cost=Sum("cost"),
            latency=Avg(Epoch("finished_at") - Epoch("started_at"),
                        filter=Q(finished_at__isnull=False, started_at__isnull=False)),
        )
    )
    tokens, cost, latency = [0.0] * buckets, [0.0] * buckets, [0.0] * buckets
    for row in sums:
        i = _index(row["b"], buckets)
        tokens[i] += float(row["tokens"] or 0)
        cost[i] += float(row["cost"] or 0)
        latency[i] = float(row["latency"] or 0)

    ran = (
        jobs.filter(started_at__isnull=False)
        .annotate(s=bucket("started_at"), e=bucket(Coalesce("finished_at", now_value)))
        .values("s", "e").annotate(n=Count("id"))
    )
    agents = [0.0] * buckets
    for row in ran:
        for i in range(_index(row["s"], buckets), _index(row["e"], buckets) + 1):
            agents[i] += row["n"]

    start = _at(t0)
    edges = [start + timedelta(seconds=width * i) for i in range(buckets)]
    plots = [
        _plot("tokens", "Tokens", tokens, edges, total=f"{int(sum(tokens)):,}"),
        _plot("cost", "Cost", cost, edges, unit="$", total=f"${sum(cost):.4f}"),
        _plot("latency", "Turn latency", latency, edges, unit="s",
              total=f"peak {max(latency):.1f} s"),
        _plot("agents", "Agents working", agents, edges, total=f"peak {int(max(agents))}"),
    ]
    return Stats(title=title, turns=span["turns"], plots=plots, start=start, end=_at(t1))


def _index(value, buckets: int) -> int:
    return min(max(int(value or 0), 0), buckets - 1)


def _fmt(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:.4f}"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{int(value):,}"


def _plot(key: str, label: str, values: list[float], edges: list[datetime], *, unit: str = "", total: str = "") -> Plot:
    """Scale ``values`` into the SVG box: x spreads the buckets over the width, y runs up
    from the baseline to the peak (a flat zero line when all are zero)."""
    n = len(values)
    peak = max(values) if values else 0.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    xy = []
    for i, v in enumerate(values):
        x = PAD + (inner_w * i / (n - 1) if n > 1 else inner_w / 2)
        y = HEIGHT - PAD - (inner_h * v / peak if peak else 0)
        xy.append((round(x, 1), round(y, 1)))
    points = " ".join(f"{x},{y}" for x, y in xy)
    base = HEIGHT - PAD
    area = f"{xy[0][0]},{base} {points} {xy[-1][0]},{base}" if xy else ""
    dots = [{"x": x, "y": y, "title": f"{edges[i]:%Y-%m-%d %H:%M:%S} UTC: {_fmt(values[i], unit)}"}
            for i, (x, y) in enumerate(xy)]
    return Plot(key=key, label=label, values=values, unit=unit, points=points, area=area, dots=dots,
                peak=peak, total=total)
