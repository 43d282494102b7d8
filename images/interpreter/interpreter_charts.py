"""What a Matplotlib figure draws, as data: the kernel's charts.

A figure displayed in a cell comes back as a PNG and, with it, as a chart
under MIME type CHART_MIME: its type (line, scatter, bar, pie,
box_and_whisker; a figure of several axes is a superchart of one chart each;
what is not understood is "unknown"), title, labels, ticks and elements, the
shape E2B's SDKs call result.chart. Nothing here may fail a cell: a figure
whose chart cannot be read gets none. Sizes are bounded (MAX_ELEMENTS,
MAX_POINTS); the host checks everything again.
"""

import json
import math
import sys

CHART_MIME = "application/vnd.harebox.chart+json"
MAX_ELEMENTS = 256  # elements of one chart
MAX_POINTS = 10000  # points of one line or scatter
MAX_BYTES = 4 << 20  # a chart's JSON; a bigger one is not given (the host takes 16 MiB)


def install(shell):
    """Adds the chart formatter to shell's display formatter, for Matplotlib's
    figures (Matplotlib is not imported here), and records box plots'
    statistics as Matplotlib draws them (once it is imported)."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):
        # Figures are told by their class, not registered as the formatters'
        # types: the inline backend takes Figure out of every formatter's
        # registry when it is set up.
        format_type = Unicode(CHART_MIME)
        _return_type = dict
        print_method = ObjectName("_repr_harebox_chart_")

        def __call__(self, obj):
            figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
            if not self.enabled or figure is None or not isinstance(obj, figure):
                return None
            return chart_of(obj)

    df = shell.display_formatter
    df.formatters[CHART_MIME] = ChartFormatter(parent=df)
    if df.active_types and CHART_MIME not in df.active_types:
        df.active_types = list(df.active_types) + [CHART_MIME]
    if "matplotlib.axes._axes" in sys.modules:
        _wrap_bxp(sys.modules["matplotlib.axes._axes"].Axes)
    else:
        sys.meta_path.insert(0, _BoxPlotHook())


def chart_of(fig):
    try:
        charts = [axes_chart(ax) for ax in fig.get_axes() if ax.get_visible()]
        charts = [c for c in charts if c is not None]
        if not charts:
            return None
        if len(charts) == 1:
            chart = charts[0]
        else:
            title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
            chart = {"type": "superchart", "title": title, "elements": charts[:MAX_ELEMENTS]}
        return chart if len(json.dumps(chart)) <= MAX_BYTES else None
    except Exception:
        return None


def axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    title = ax.get_title()
    boxes = getattr(ax, "_harebox_boxes", None)
    if boxes:
        return dict(labels(ax), type="box_and_whisker", title=title, elements=boxes[:MAX_ELEMENTS])
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        elements = [{"label": label(w), "angle": number(abs(w.theta2 - w.theta1)), "radius": number(w.r)}
                    for w in wedges[:MAX_ELEMENTS]]
        return {"type": "pie", "title": title,
                "elements": [e for e in elements if e["angle"] is not None and e["radius"] is not None]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        elements = []
        for c in bars:
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            for r in c.patches:
                if horizontal:
                    at, value = r.get_y() + r.get_height() / 2, r.get_width()
                else:
                    at, value = r.get_x() + r.get_width() / 2, r.get_height()
                if number(value) is not None:
                    elements.append({"label": category(axis, at), "value": str(number(value)), "group": label(c)})
        return dict(labels(ax), type="bar", title=title, elements=elements[:MAX_ELEMENTS])
    lines = [line for line in ax.get_lines() if line.get_visible()]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    if lines and not scatters:
        kind, elements = "line", [(label(line), line.get_xydata()) for line in lines]
    elif scatters and not lines:
        kind, elements = "scatter", [(label(c), c.get_offsets()) for c in scatters]
    else:
        return {"type": "unknown", "title": title, "elements": []}
    return dict(labels(ax), **ticks(ax), type=kind, title=title, elements=[
        {"label": name, "points": points(ax, xy)} for name, xy in elements[:MAX_ELEMENTS]])


def points(ax, xy):
    out = [[value(ax.xaxis, x), value(ax.yaxis, y)] for x, y in xy[:MAX_POINTS]]
    return [p for p in out if p[0] is not None and p[1] is not None]


def labels(ax):
    return {"x_label": ax.get_xlabel(), "y_label": ax.get_ylabel()}


def ticks(ax):
    out = {}
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        locs = [t for t in axis.get_majorticklocs()][:MAX_ELEMENTS]
        lo, hi = sorted(axis.get_view_interval())
        locs = [t for t in locs if lo <= t <= hi]
        out[f"{name}_ticks"] = [v for v in (value(axis, t) for t in locs) if v is not None]
        out[f"{name}_tick_labels"] = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
        out[f"{name}_scale"] = scale(axis)
    return out


def scale(axis):
    if categories(axis) is not None:
        return "categorical"
    if is_date(axis):
        return "datetime"
    return axis.get_scale()


def categories(axis):
    """{position: name} of a categorical axis (Matplotlib's string units), else None."""
    mapping = getattr(getattr(axis, "units", None), "_mapping", None)
    return {v: k for k, v in mapping.items()} if mapping is not None else None


def is_date(axis):
    from matplotlib import dates
    return isinstance(axis.get_major_formatter(), (dates.DateFormatter, dates.AutoDateFormatter, dates.ConciseDateFormatter))


def value(axis, v):
    """v, a position on axis, as the chart says it: a category's name, a
    date's ISO form, else a number."""
    cats = categories(axis)
    if cats is not None:
        return cats.get(round(float(v)), number(v))
    if is_date(axis):
        from matplotlib import dates
        try:
            return dates.num2date(float(v)).isoformat()
        except (ValueError, OverflowError):
            return number(v)
    return number(v)


def category(axis, at):
    cats = categories(axis)
    if cats is not None:
        return cats.get(round(at), str(number(at)))
    return str(number(at))


def number(v):
    v = float(v)
    if not math.isfinite(v):
        return None
    return int(v) if v.is_integer() and abs(v) < 1 << 53 else v


def label(artist):
    name = artist.get_label()
    return "" if name is None or str(name).startswith("_") else str(name)


class _BoxPlotHook:
    """Wraps Axes.bxp once matplotlib.axes._axes is loaded, so that each box
    plot leaves its statistics on its axes (its lines alone do not say they
    are boxes)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.axes._axes":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _wrap_bxp(module.Axes)
        spec.loader.exec_module = patched
        return spec


def _wrap_bxp(axes_class):
    bxp = axes_class.bxp

    def recorded(self, bxpstats, positions=None, *args, **kwargs):
        out = bxp(self, bxpstats, positions, *args, **kwargs)
        try:
            boxes = getattr(self, "_harebox_boxes", None) or []
            for i, s in enumerate(bxpstats):
                box = {"label": str(s.get("label", i + 1)), "min": number(s["whislo"]),
                       "first_quartile": number(s["q1"]), "median": number(s["med"]),
                       "third_quartile": number(s["q3"]), "max": number(s["whishi"]),
                       "outliers": [x for x in (number(x) for x in list(s.get("fliers", []))[:MAX_POINTS]) if x is not None]}
                if None not in box.values():
                    boxes.append(box)
            self._harebox_boxes = boxes
        except Exception:
            pass
        return out
    axes_class.bxp = recorded
