"""Engine step time: a linear model of what a step runs, and a learner that fits it online.

A step runs prefill chunks (``c`` new tokens after ``k`` already in KV: cached prefix hits and
earlier chunks are not recomputed) and decodes (one token each over a context). Its time is
close to linear in five features (``COST_MODEL.md`` derives them from the roofline):

    step_s = base + per_decode · decodes + per_context_token · decode context tokens
             + per_prefill_token · prefill tokens + per_pair · prefill attention pairs

with ``pairs = Σ c · (k + (c + 1) / 2)``, the query-key pairs of the prefill chunks' attention.
The pairs term is what makes a chunk at the end of a 30k-token agent context cost several
times one at the start of a prompt.

`StepTimeModel` is the frozen model; `OnlineStepTimeModel` learns its coefficients from the
engine's own steps (`observe`), starting from a conservative prior, and keeps its recent
out-of-sample prediction error. Policies that predict (`SLOAdmission`) take either.
"""

from __future__ import annotations

import math
from collections import deque

import attrs

from policies.percentile import percentile
from policies.validators import finite_non_negative, finite_positive
from policies.views import StepFeatures


def chunk_pairs(tokens: float, context_tokens: float) -> float:
    """Attention pairs of a prefill chunk of ``tokens`` after ``context_tokens`` in KV."""
    return tokens * (context_tokens + (tokens + 1) / 2)


@attrs.frozen(kw_only=True)
class StepTimeModel:
    """An engine step's duration, linear in `StepFeatures` (fit it over the batches that
    matter; `OnlineStepTimeModel` fits it from the engine's steps)."""

    base_s: float = attrs.field(validator=finite_non_negative)
    decode_s_per_seq: float = attrs.field(validator=finite_non_negative)
    prefill_s_per_token: float = attrs.field(validator=finite_positive)
    decode_s_per_context_token: float = attrs.field(default=0.0, validator=finite_non_negative)
    prefill_s_per_pair: float = attrs.field(default=0.0, validator=finite_non_negative)

    def coefficients(self) -> tuple[float, ...]:
        """The coefficients in `StepFeatures.vector` order."""
        return (self.base_s, self.decode_s_per_seq, self.decode_s_per_context_token,
                self.prefill_s_per_token, self.prefill_s_per_pair)

    @classmethod
    def from_coefficients(cls, values: tuple[float, ...]) -> StepTimeModel:
        """The model of `coefficients` ``values`` (the prefill token cost kept above 0)."""
        base, per_seq, per_context, per_token, per_pair = values
        return cls(base_s=base, decode_s_per_seq=per_seq, decode_s_per_context_token=per_context,
                   prefill_s_per_token=max(per_token, 1e-9), prefill_s_per_pair=per_pair)

    def features_s(self, features: StepFeatures) -> float:
        """Seconds a step of ``features`` takes."""
        return sum(c * x for c, x in zip(self.coefficients(), features.vector(), strict=True))

    def step_s(self, decodes: int, prefill_tokens: int, context_tokens: int = 0,
               prefill_context_tokens: int = 0) -> float:
        """Seconds one step with ``decodes`` decoding sequences holding ``context_tokens`` in
        all and one prefill chunk of ``prefill_tokens`` after ``prefill_context_tokens``."""
        return (self.base_s + self.decode_s_per_seq * decodes
                + self.decode_s_per_context_token * context_tokens
                + self.prefill_s_per_token * prefill_tokens
                + self.prefill_s_per_pair * chunk_pairs(prefill_tokens, prefill_context_tokens))

    def decode_s(self, context_tokens: int, decodes: int = 1) -> float:
        """What ``decodes`` more sequences decoding over ``context_tokens`` in all add to a
        step."""
        return self.decode_s_per_seq * decodes + self.decode_s_per_context_token * context_tokens

    def prefill_token_equivalents(self, tokens: float, context_tokens: float) -> float:
        """``tokens`` of prefill after ``context_tokens`` in KV, in context-free prefill tokens
        (the same time at `prefill_s_per_token` alone): the work the EDF test sums."""
        return tokens + self.prefill_s_per_pair * chunk_pairs(tokens, context_tokens) / (
            self.prefill_s_per_token)

    def prefill_tokens_per_s(self, decodes: int, prefill_tokens_per_step: int,
                             context_tokens: int = 0) -> float:
        """Context-free prefill throughput when every step carries ``prefill_tokens_per_step``
        beside ``decodes`` decoding sequences of ``context_tokens`` in all."""
        return prefill_tokens_per_step / self.step_s(decodes, prefill_tokens_per_step,
                                                     context_tokens)


CONSERVATIVE_PRIOR = StepTimeModel(base_s=0.01, decode_s_per_seq=2e-4,
                                   decode_s_per_context_token=1e-7, prefill_s_per_token=1e-4,
                                   prefill_s_per_pair=5e-9)
"""A slow engine's coefficients (about 4x an H100 running Llama-3-8B on every term): the
starting point of `OnlineStepTimeModel`, so that admission errs towards rejecting until the
engine's own steps have been seen."""
_SCALES = (1.0, 1e-2, 1e-6, 1e-3, 1e-7)
"""Feature scales that make the normal equations well conditioned (a decode, a million
context tokens, a thousand prefill tokens, ten million pairs are each about one)."""


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting on a small dense system."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


@attrs.frozen(kw_only=True)
class StepModelStats:
    """A snapshot of an `OnlineStepTimeModel`."""

    observations: int
    """Steps seen."""
    model: StepTimeModel
    """The current fit."""
    relative_error_p50: float | None
    """Median of ``|predicted - measured| / measured`` over the last ``error_window`` steps,
    each predicted before the model learned from it (None before any step; percentiles are
    `policies.percentile`'s)."""
    relative_error_p99: float | None


@attrs.define(eq=False, kw_only=True)
class OnlineStepTimeModel:
    """A `StepTimeModel` learned from the engine's own steps: ridge regression towards the
    prior with exponential forgetting, coefficients kept non-negative.

    Each `observe` adds one step to decayed normal equations (weight ``1 - 1/window_steps``
    per later step); the fit minimises the decayed squared error plus ``prior_weight`` steps'
    worth of distance to ``prior``, so a direction the engine has not exercised (no prefill
    yet, no long contexts) stays at the prior. A measured step more than twice its
    prediction counts with less weight (Huber), so a pause does not swing the fit.

    Guarantees: every coefficient is >= 0 (the prefill token cost > 0); the fit is refreshed
    every ``refit_every`` steps, so predictions between refits are stable; the error
    statistics are out of sample. O(1) per step (a 5x5 solve every ``refit_every`` steps).
    """

    prior: StepTimeModel = attrs.field(default=CONSERVATIVE_PRIOR,
                                       validator=attrs.validators.instance_of(StepTimeModel))
    """Where the fit starts (a profile measured on the target GPU may be given instead)."""
    prior_weight: float = attrs.field(default=1.0, validator=finite_positive)
    """How much the prior counts, in steps whose every (scaled) feature is one: it holds
    the terms the engine has not exercised and yields to a few dozen steps that have."""
    window_steps: float = attrs.field(default=4000.0, validator=finite_positive)
    """The forgetting horizon, in steps."""
    refit_every: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    error_window: int = attrs.field(default=1000, validator=attrs.validators.ge(1))

    _xtx: list[list[float]] = attrs.field(init=False, repr=False)
    _xty: list[float] = attrs.field(init=False, repr=False)
    _model: StepTimeModel = attrs.field(init=False, repr=False)
    _observations: int = attrs.field(init=False, default=0, repr=False)
    _errors: deque[float] = attrs.field(init=False, repr=False)
    _recent_s: float | None = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.window_steps <= 1:
            raise ValueError(f"window_steps must be > 1, got {self.window_steps!r}")
        self._xtx = [[0.0] * 5 for _ in range(5)]
        self._xty = [0.0] * 5
        self._model = self.prior
        self._errors = deque(maxlen=self.error_window)

    @property
    def model(self) -> StepTimeModel:
        """The current fit."""
        return self._model

    @property
    def observations(self) -> int:
        """Steps learned from."""
        return self._observations

    @property
    def recent_step_s(self) -> float | None:
        """The measured step time, averaged over about the last 100 steps (None before any):
        what a decoding request waits per token now."""
        return self._recent_s

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        """Learn from one step of ``features`` that took ``duration_s`` (ignored unless finite
        and > 0)."""
        if not (math.isfinite(duration_s) and duration_s > 0):
            return
        predicted = self._model.features_s(features)
        self._errors.append(abs(predicted - duration_s) / duration_s)
        weight = 1.0 if duration_s <= 2 * predicted else 2 * predicted / duration_s
        x = [v * s for v, s in zip(features.vector(), _SCALES, strict=True)]
        decay = 1.0 - 1.0 / self.window_steps
        for i in range(5):
            row = self._xtx[i]
            for j in range(5):
                row[j] = row[j] * decay + weight * x[i] * x[j]
            self._xty[i] = self._xty[i] * decay + weight * x[i] * duration_s
        self._observations += 1
        recent = self._recent_s
        self._recent_s = duration_s if recent is None else recent + (duration_s - recent) / 100
        if self._observations % self.refit_every == 0:
            self._model = self._fit()

    def _fit(self) -> StepTimeModel:
        """Non-negative ridge fit: solve, drop negative coefficients to the bound, repeat."""
        prior = [c / s for c, s in zip(self.prior.coefficients(), _SCALES, strict=True)]
        free = list(range(5))
        theta = [0.0] * 5
        for _ in range(5):
            matrix = [[self._xtx[i][j] + (self.prior_weight if i == j else 0.0) for j in free]
                      for i in free]
            rhs = [self._xty[i] + self.prior_weight * prior[i] for i in free]
            solution = _solve(matrix, rhs)
            theta = [0.0] * 5
            for index, value in zip(free, solution, strict=True):
                theta[index] = value
            negative = [i for i in free if theta[i] < 0]
            if not negative:
                break
            free = [i for i in free if i not in negative]
        return StepTimeModel.from_coefficients(
            tuple(max(t, 0.0) * s for t, s in zip(theta, _SCALES, strict=True)))

    # The StepTimeModel interface, on the current fit.

    def step_s(self, decodes: int, prefill_tokens: int, context_tokens: int = 0,
               prefill_context_tokens: int = 0) -> float:
        return self._model.step_s(decodes, prefill_tokens, context_tokens,
                                  prefill_context_tokens)

    def prefill_token_equivalents(self, tokens: float, context_tokens: float) -> float:
        return self._model.prefill_token_equivalents(tokens, context_tokens)

    def decode_s(self, context_tokens: int, decodes: int = 1) -> float:
        return self._model.decode_s(context_tokens, decodes)

    def prefill_tokens_per_s(self, decodes: int, prefill_tokens_per_step: int,
                             context_tokens: int = 0) -> float:
        return self._model.prefill_tokens_per_s(decodes, prefill_tokens_per_step,
                                                context_tokens)

    def stats(self) -> StepModelStats:
        """A frozen snapshot (see `StepModelStats`)."""
        errors = self._errors
        return StepModelStats(
            observations=self._observations, model=self._model,
            relative_error_p50=percentile(errors, 50) if errors else None,
            relative_error_p99=percentile(errors, 99) if errors else None)

    def check_invariants(self) -> None:
        """Coefficients non-negative; the normal matrix symmetric with a non-negative diagonal."""
        assert all(c >= 0 for c in self._model.coefficients())
        assert all(self._xtx[i][i] >= 0 for i in range(5))
        assert all(abs(self._xtx[i][j] - self._xtx[j][i]) <= 1e-9 * (1 + abs(self._xtx[i][j]))
                   for i in range(5) for j in range(5))
