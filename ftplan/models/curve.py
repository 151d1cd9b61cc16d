"""A fitted curve of one measured quantity against micro-batch (and sequence length).

Why a max of lines: peak memory is the largest of several phase peaks (activations, optimizer
step, loss), each linear in batch with its own slope, so the curve is convex and piecewise linear
and a single line through the smallest batches underestimates large ones. Step time is convex
too: small batches are launch-bound (nearly flat), larger ones compute-bound (linear). On the
shipped H200 data a max of lines predicted held-out step times with a median error of 10% where a
robust single line (Huber) was off by 30%. The curve keeps the line that governs large batches.
With several sequence lengths the features are tokens per GPU (batch·seq) and batch·seq²,
scaled by the longest calibrated length to stay well conditioned.
Slopes are never negative, so predictions never fall as batch or sequence length grow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ftplan.models.prediction import Estimate

Z_95 = 1.96


@dataclass(frozen=True)
class Line:
    intercept: float
    slopes: tuple[float, ...]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return self.intercept + features @ np.asarray(self.slopes)


@dataclass(frozen=True)
class Curve:
    """max over lines of intercept + slopes·features, with a residual-based upper bound.

    seq_ref None means the only feature is batch (one calibrated sequence length).
    floor_fraction keeps the bound honest where few points leave the residuals near zero.
    """

    lines: tuple[Line, ...]
    seq_ref: int | None
    sigma: float
    floor_fraction: float
    feature_max: float  # largest calibrated first feature (batch or scaled tokens): bounds widen beyond it
    n_points: int
    r2: float | None
    bound_lines: tuple[Line, ...] = ()  # phases the points never saw, at their steepest plausible slope

    def features(self, batch: np.ndarray, seq_len: np.ndarray) -> np.ndarray:
        return features(np.asarray(batch, float), np.asarray(seq_len, float), self.seq_ref)

    def mean(self, batch: np.ndarray, seq_len: np.ndarray) -> np.ndarray:
        x = self.features(batch, seq_len)
        return np.max([line(x) for line in self.lines], axis=0)

    def predict(self, batch: int, seq_len: int) -> Estimate:
        """Mean and upper bound; the bound widens with the distance beyond the largest calibrated point:
        the residuals' share grows linearly with it, and any phase the points never reached enters at its
        steepest slope (the held-out errors that size these: `python benchmarks/accuracy.py`)."""
        x = self.features(np.array([batch]), np.array([seq_len]))
        mean = float(np.max([line(x) for line in self.lines]))
        widen = max(1.0, float(x[0, 0]) / self.feature_max)
        # Two points fix a line exactly and say nothing of the spread: their floor widens with the distance too (a
        # two-point ladder at 9.5x its top batch kept a 2% bound). Three points are left to the floor the held-out
        # ladders sized (`python benchmarks/accuracy.py`: widening theirs too cost 3% of the planned batch, no OOM).
        floor = self.floor_fraction * (widen if self.n_points <= 2 else 1.0)
        upper = mean + max(Z_95 * self.sigma * widen, floor * abs(mean))
        upper = max([upper, *(float(line(x)[0]) for line in self.bound_lines)])
        return Estimate(mean=mean, upper=upper)

    def extrapolation(self, batch: int, seq_len: int) -> float:
        """How far beyond the calibrated points: 1 inside, k for k times the largest calibrated batch (tokens)."""
        x = self.features(np.array([batch]), np.array([seq_len]))
        return max(1.0, float(x[0, 0]) / self.feature_max)

    def to_json(self) -> dict:
        return {"lines": _lines_json(self.lines), "bound_lines": _lines_json(self.bound_lines),
                "seq_ref": self.seq_ref, "sigma": self.sigma, "floor_fraction": self.floor_fraction,
                "feature_max": self.feature_max, "n_points": self.n_points, "r2": self.r2}

    @classmethod
    def from_json(cls, data: dict) -> Curve:
        return cls(lines=_lines_from_json(data["lines"]), bound_lines=_lines_from_json(data["bound_lines"]),
                   seq_ref=data["seq_ref"], sigma=float(data["sigma"]),
                   floor_fraction=float(data["floor_fraction"]), feature_max=float(data["feature_max"]),
                   n_points=int(data["n_points"]), r2=data["r2"])


def _lines_json(lines: tuple[Line, ...]) -> list[dict]:
    return [{"intercept": line.intercept, "slopes": list(line.slopes)} for line in lines]


def _lines_from_json(data: list[dict]) -> tuple[Line, ...]:
    return tuple(Line(float(line["intercept"]), tuple(float(s) for s in line["slopes"])) for line in data)


def features(batch: np.ndarray, seq_len: np.ndarray, seq_ref: int | None) -> np.ndarray:
    if seq_ref is None:
        return batch.reshape(-1, 1)
    ratio = seq_len / seq_ref
    return np.column_stack([batch * ratio, batch * ratio**2])


def fit_convex_curve(batch, seq_len, y, floor_fraction: float) -> Curve:
    """Max of two non-negative-slope lines: one for the small-batch regime, one for large batches."""
    batch, seq_len, y = (np.asarray(v, float) for v in (batch, seq_len, y))
    seq_ref = _seq_ref(seq_len)
    lower = np.zeros(len(y), bool)
    upper = np.zeros(len(y), bool)
    for seq in np.unique(seq_len):
        index = np.flatnonzero(seq_len == seq)
        knot = best_knot(batch[index], y[index])
        lower[index] = True if knot is None else batch[index] <= knot
        upper[index] = True if knot is None else batch[index] >= knot
    x = features(batch, seq_len, seq_ref)
    lines = tuple(dict.fromkeys(_positive_line(x[m], y[m]) for m in (upper, lower)))
    return _finish(lines, seq_ref, x, y, floor_fraction)


def line_below_points(curve: Curve, slopes: tuple[float, ...], batch, seq_len, y) -> Line:
    """The line of these slopes raised until it touches the points from below."""
    batch, seq_len, y = (np.asarray(v, float) for v in (batch, seq_len, y))
    x = curve.features(batch, seq_len)
    slopes = tuple(max(0.0, float(s)) for s in slopes)
    return Line(float(np.min(y - x @ np.asarray(slopes))), slopes)


def top_slope(curve: Curve) -> float:
    """The steepest per-token slope of the curve's lines (its first feature): what governs large batches."""
    return max(line.slopes[0] for line in curve.lines)


def with_line_below_points(curve: Curve, slopes: tuple[float, ...], batch, seq_len, y) -> Curve:
    """The curve plus a line of given slopes, raised until it touches the points from below.

    Why: the slope that large batches will follow can be known from elsewhere (the compute rate
    learnt from other settings) while this setting's own points sit on a launch-bound floor. A line
    that stays at or below every point cannot worsen the fit where it was measured; beyond it, the
    maximum keeps whichever slope is steeper, since the curve is convex.
    """
    return with_line(curve, line_below_points(curve, slopes, batch, seq_len, y), batch, seq_len, y)


def with_line(curve: Curve, line: Line, batch, seq_len, y) -> Curve:
    """The curve plus a line that lies at or below every point (so the fit where it was measured holds)."""
    x = curve.features(np.asarray(batch, float), np.asarray(seq_len, float))
    finished = _finish(tuple(dict.fromkeys((*curve.lines, line))), curve.seq_ref, x, np.asarray(y, float),
                       curve.floor_fraction)
    return replace(finished, bound_lines=curve.bound_lines)


def best_knot(batch: np.ndarray, y: np.ndarray) -> float | None:
    """The batch where the large-batch line takes over, or None when one line explains the points.

    Few points: any convex evidence wins (physics says the curve is convex). Many points: BIC,
    so noise alone does not buy a second line.
    """
    order = np.argsort(batch)
    batch, y = batch[order], y[order]
    x = batch.reshape(-1, 1)
    if len(np.unique(batch)) < 3:
        return None
    sse_one = _sse(y, _positive_line(x, y)(x))
    best, best_sse = None, np.inf
    for knot in np.unique(batch)[1:-1]:
        low, high = batch <= knot, batch >= knot
        lines = (_positive_line(x[low], y[low]), _positive_line(x[high], y[high]))
        sse = _sse(y, np.max([line(x) for line in lines], axis=0))
        if sse < best_sse:
            best, best_sse = float(knot), sse
    n = len(y)
    if n < 5:
        return best if best_sse < sse_one else None
    floor = max((1e-6 * np.abs(y).mean()) ** 2 * n, np.finfo(float).tiny)  # y of 1e-200 s underflowed: log(0)
    bic_one = n * np.log(max(sse_one, floor) / n) + 2 * np.log(n)
    bic_two = n * np.log(max(best_sse, floor) / n) + 4 * np.log(n)
    return best if bic_two < bic_one else None


def _positive_line(x: np.ndarray, y: np.ndarray) -> Line:
    if len(y) == 1:
        return Line(float(y[0]), tuple(0.0 for _ in range(x.shape[1])))
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    intercept, coef = _nonnegative_least_squares(x / scale, y)
    return Line(float(intercept), tuple(float(c) for c in coef / scale))


def _nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Intercept and non-negative slopes of the least-squares line: what sklearn's
    LinearRegression(positive=True).fit computes (center both, scipy's NNLS on the centered data, intercept
    from the means), step for step so the numbers are the same, without its input validation, which cost
    a hundred times the fit itself on these few points (fitting every held-out group spent most of its time
    there)."""
    from scipy.optimize import nnls  # lazy: a cached plan never fits

    x = np.array(x, dtype=float)
    y = np.array(y, dtype=float)
    x_offset = np.average(x, axis=0)
    x -= x_offset
    y_offset = np.average(y, axis=0)
    y -= y_offset
    coef = nnls(x, y)[0]
    return y_offset - x_offset @ coef, coef


def _finish(lines: tuple[Line, ...], seq_ref: int | None, x: np.ndarray, y: np.ndarray,
            floor_fraction: float) -> Curve:
    fitted = np.max([line(x) for line in lines], axis=0)
    params = sum(1 + len(line.slopes) for line in lines)
    dof = len(y) - params
    sigma = float(np.sqrt(_sse(y, fitted) / dof)) if dof > 0 else 0.0
    r2 = _r2_score(y, fitted) if len(y) > 2 and np.ptp(y) > 0 else None
    return Curve(lines=lines, seq_ref=seq_ref, sigma=sigma, floor_fraction=floor_fraction,
                 feature_max=float(x[:, 0].max()), n_points=len(y), r2=r2)


def _r2_score(y: np.ndarray, fitted: np.ndarray) -> float:
    """sklearn.metrics.r2_score(y, fitted), step for step (the same column sums, so the same number), without
    its input validation, which cost more than the rest of the fit."""
    y = np.asarray(y, float).reshape(-1, 1)
    fitted = np.asarray(fitted, float).reshape(-1, 1)
    numerator = np.sum(1.0 * (y - fitted) ** 2, axis=0)[0]
    denominator = np.sum(1.0 * (y - np.average(y, axis=0)) ** 2, axis=0)[0]
    if numerator == 0:
        return 1.0
    if denominator == 0:
        return 0.0
    return float(1 - numerator / denominator)


def _seq_ref(seq_len: np.ndarray) -> int | None:
    return int(seq_len.max()) if len(np.unique(seq_len)) > 1 else None


def _sse(y: np.ndarray, fitted: np.ndarray) -> float:
    return float(((y - fitted) ** 2).sum())
