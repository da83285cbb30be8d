"""How long one engine step takes, as a function of its batch (``COST_MODEL.md``).

The model is Llama-3-8B bf16 on one GPU, grounded in Vidur's published kernel
profiles and the roofline:

    step   = t0 + T_lin + T_head + T_dec + T_pre
    T_lin  = (Tw^1.5 + (N·τ)^1.5)^(2/3)       smooth max of weight reads and matmuls
    T_head = max(Th, S·τh)                    LM head
    T_dec  = [n_d > 0]·L·α + ctx_sum·β         decode attention: launches + KV reads
    T_pre  = pairs·π + n_p·γ'                 prefill attention

with ``N`` tokens through the matmuls (prefill chunk tokens + decode sequences),
``S`` rows needing logits (prefill chunks + decode sequences), ``L`` layers,
``ctx_sum`` the decode sequences' context tokens, ``n_p`` the prefill chunk
tokens and ``pairs = Σ c·(k + (c+1)/2)`` the query-key pairs of chunks of ``c``
new tokens after ``k`` cached ones. `StepCostModel.preset` gives the A100, H100
and H200 coefficients; `fit_cost_model` calibrates them to measured steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import attrs
import numpy as np

from policies.validators import int_at_least


def _check_seconds(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _check_contexts(_instance: object, attribute: attrs.Attribute, value: tuple) -> None:
    for index, context in enumerate(value):
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ValueError(
                f"{attribute.name}[{index}] must be a positive integer, got {context!r}"
            )


@attrs.frozen(kw_only=True)
class PrefillChunk:
    """A prefill chunk: ``tokens`` new prompt tokens after ``cached_tokens`` already in KV.

    ``cached_tokens`` counts prefix-cache hits and earlier chunks of the same prompt.
    """

    tokens: int = attrs.field(validator=int_at_least(1))
    cached_tokens: int = attrs.field(default=0, validator=int_at_least(0))


@attrs.frozen(kw_only=True)
class StepBatch:
    """What one engine step runs: prefill chunks and decode sequences (at least one)."""

    prefills: tuple[PrefillChunk, ...] = attrs.field(default=(), converter=tuple)
    decode_context_tokens: tuple[int, ...] = attrs.field(
        default=(), converter=tuple, validator=_check_contexts
    )
    """Context length (prompt + generated so far) of each decode sequence."""

    def __attrs_post_init__(self) -> None:
        if not self.prefills and not self.decode_context_tokens:
            raise ValueError("a step batch needs at least one prefill chunk or decode sequence")
        for chunk in self.prefills:
            if not isinstance(chunk, PrefillChunk):
                raise ValueError(f"prefills must be PrefillChunk objects, got {chunk!r}")

    @property
    def prefill_tokens(self) -> int:
        """New prompt tokens computed this step (``n_p``)."""
        return sum(chunk.tokens for chunk in self.prefills)

    @property
    def num_tokens(self) -> int:
        """Tokens through the matmuls (``N``): prefill tokens plus one per decode."""
        return self.prefill_tokens + len(self.decode_context_tokens)

    @property
    def num_logit_rows(self) -> int:
        """Rows the LM head computes (``S``): one per prefill chunk and decode."""
        return len(self.prefills) + len(self.decode_context_tokens)

    @property
    def prefill_pairs(self) -> float:
        """Query-key pairs of causal prefill attention: ``Σ c·(k + (c+1)/2)``."""
        return sum(
            chunk.tokens * (chunk.cached_tokens + (chunk.tokens + 1) / 2) for chunk in self.prefills
        )


@attrs.frozen(kw_only=True)
class StepCostModel:
    """Step duration in seconds, never decreasing as a batch gains tokens or sequences.

    Every coefficient is a field in seconds; override with `attrs.evolve`.
    """

    t0_s: float = attrs.field(validator=_check_seconds)
    """Fixed per-step overhead (scheduling, launches, sampling)."""
    weight_read_s: float = attrs.field(validator=_check_seconds)
    """Tw: reading all non-head weights once."""
    matmul_s_per_token: float = attrs.field(validator=_check_seconds)
    """τ: matmul time per token through the model."""
    head_read_s: float = attrs.field(validator=_check_seconds)
    """Th: reading the LM-head weights."""
    head_s_per_row: float = attrs.field(validator=_check_seconds)
    """τh: LM-head matmul time per logit row."""
    decode_launch_s_per_layer: float = attrs.field(validator=_check_seconds)
    """α: decode-attention launch cost per layer, paid once if any sequence decodes."""
    decode_s_per_context_token: float = attrs.field(validator=_check_seconds)
    """β: reading one context token's KV (all layers) in decode attention."""
    prefill_attn_s_per_pair: float = attrs.field(validator=_check_seconds)
    """π: prefill attention per query-key pair."""
    prefill_attn_s_per_token: float = attrs.field(validator=_check_seconds)
    """γ': prefill attention per new prompt token."""
    num_layers: int = attrs.field(default=32, validator=int_at_least(1))

    @classmethod
    def preset(cls, name: str) -> StepCostModel:
        """The Llama-3-8B bf16 model for GPU ``name`` ("a100", "h100" or "h200", any case)."""
        try:
            return PRESETS[name.lower()]
        except (KeyError, AttributeError):
            raise ValueError(
                f"unknown cost-model preset {name!r}; choose one of {', '.join(PRESETS)}"
            ) from None

    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds the engine takes to run ``batch`` in one step."""
        linear = (
            self.weight_read_s**1.5 + (batch.num_tokens * self.matmul_s_per_token) ** 1.5
        ) ** (2 / 3)
        head = max(self.head_read_s, batch.num_logit_rows * self.head_s_per_row)
        kv_reads = sum(batch.decode_context_tokens) * self.decode_s_per_context_token
        launches = self.num_layers * self.decode_launch_s_per_layer
        decode = kv_reads + (launches if batch.decode_context_tokens else 0.0)
        prefill = (
            batch.prefill_pairs * self.prefill_attn_s_per_pair
            + batch.prefill_tokens * self.prefill_attn_s_per_token
        )
        return self.t0_s + linear + head + decode + prefill


# Llama-3-8B bf16: bytes of non-head weights, FLOPs per token through them, LM-head
# bytes (= FLOPs per logit row), KV bytes per token (2·32 layers·8 heads·128·2 B) and
# attention FLOPs per query-key pair (4·d_model·layers).
_WEIGHT_BYTES = 13.96e9
_FLOPS_PER_TOKEN = 2 * 6.98e9
_HEAD_BYTES = 1.05e9
_KV_BYTES_PER_TOKEN = 131072
_ATTN_FLOPS_PER_PAIR = 524288


def _llama3_8b(
    *,
    peak_flops: float,
    mem_bytes_per_s: float,
    eta_mem: float,
    eta_compute: float,
    eta_kv: float,
    eta_attn: float,
    launch_s_per_layer: float,
    prefill_attn_s_per_token: float,
) -> StepCostModel:
    """The model's coefficients from a GPU's peaks and achieved efficiencies (roofline)."""
    return StepCostModel(
        t0_s=1.0e-3,
        weight_read_s=_WEIGHT_BYTES / (mem_bytes_per_s * eta_mem),
        matmul_s_per_token=_FLOPS_PER_TOKEN / (peak_flops * eta_compute),
        head_read_s=_HEAD_BYTES / (mem_bytes_per_s * eta_mem),
        head_s_per_row=_HEAD_BYTES / (peak_flops * eta_compute),
        decode_launch_s_per_layer=launch_s_per_layer,
        decode_s_per_context_token=_KV_BYTES_PER_TOKEN / (mem_bytes_per_s * eta_kv),
        prefill_attn_s_per_pair=_ATTN_FLOPS_PER_PAIR / (peak_flops * eta_attn),
        prefill_attn_s_per_token=prefill_attn_s_per_token,
    )


# Peaks and η_m / η_c from COST_MODEL.md's table. It gives β and π only as derived
# values; η_kv and η_attn are the efficiencies that reproduce them (80 / 49 / 38 ns
# per context token, 2.95 / 1.51 / 1.51 ns per pair).
PRESETS: Mapping[str, StepCostModel] = MappingProxyType(
    {
        "a100": _llama3_8b(
            peak_flops=312e12,
            mem_bytes_per_s=2.039e12,
            eta_mem=0.70,
            eta_compute=0.65,
            eta_kv=0.80,
            eta_attn=0.57,
            launch_s_per_layer=17e-6,
            prefill_attn_s_per_token=2.05e-6,
        ),
        "h100": _llama3_8b(
            peak_flops=989e12,
            mem_bytes_per_s=3.35e12,
            eta_mem=0.70,
            eta_compute=0.61,
            eta_kv=0.80,
            eta_attn=0.35,
            launch_s_per_layer=12e-6,
            prefill_attn_s_per_token=1.0e-6,
        ),
        "h200": _llama3_8b(
            peak_flops=989e12,
            mem_bytes_per_s=4.8e12,
            eta_mem=0.62,
            eta_compute=0.61,
            eta_kv=0.72,
            eta_attn=0.35,
            launch_s_per_layer=12e-6,
            prefill_attn_s_per_token=1.0e-6,
        ),
    }
)
"""Llama-3-8B bf16 step-cost models by GPU: "a100" (80G SXM), "h100" (SXM), "h200"."""


# Calibration. Given the two crossovers c_lin = Tw/τ (tokens) and c_head = Th/τh (rows),
# a step's time is linear in the remaining coefficients:
#   t0 + Tw·(1 + (N/c_lin)^1.5)^(2/3) + Th·max(1, S/c_head) + α·L·[n_d>0] + β·ctx + π·pairs + γ'·n_p
_LINEAR = (
    "t0_s",
    "weight_read_s",
    "head_read_s",
    "decode_launch_s_per_layer",
    "decode_s_per_context_token",
    "prefill_attn_s_per_pair",
    "prefill_attn_s_per_token",
)
_SEARCH_SPAN = math.log(10.0)  # crossovers are searched within 10x of base's, then refined
_SEARCH_POINTS = 11
_SEARCH_TOLERANCE = 1e-5  # in log(crossover)


def _features(batches: Sequence[StepBatch], num_layers: int) -> np.ndarray:
    """Per batch: N, S, then the columns of the terms linear in α, β, π, γ'."""
    return np.array(
        [
            (
                b.num_tokens,
                b.num_logit_rows,
                num_layers if b.decode_context_tokens else 0,
                sum(b.decode_context_tokens),
                b.prefill_pairs,
                b.prefill_tokens,
            )
            for b in batches
        ],
        dtype=float,
    )


def _design(features: np.ndarray, log_crossovers: np.ndarray) -> np.ndarray:
    """The columns that multiply each `_LINEAR` coefficient, given log(c_lin), log(c_head)."""
    c_lin, c_head = np.exp(log_crossovers)
    tokens, rows = features[:, 0], features[:, 1]
    return np.column_stack(
        [
            np.ones(len(features)),
            (1 + (tokens / c_lin) ** 1.5) ** (2 / 3),
            np.maximum(1.0, rows / c_head),
            features[:, 2:],
        ]
    )


def _solve_symmetric(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """x with ``gram·x = moment``; the minimum-norm least-squares x if gram is singular."""
    try:
        return np.linalg.solve(gram, moment)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(gram, moment, rcond=None)[0]


def _nonnegative_least_squares(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """argmin ``x·gram·x/2 - moment·x`` subject to x >= 0 (Lawson-Hanson active set).

    With ``gram = AᵀA`` and ``moment = Aᵀb`` this is non-negative least squares.
    """
    x = np.zeros(len(moment))
    passive = np.zeros(len(moment), dtype=bool)
    tolerance = 1e-12 * max(1.0, float(np.abs(moment).max()))
    for _ in range(3 * len(moment)):
        gain = moment - gram @ x
        if not np.any(~passive & (gain > tolerance)):
            break
        passive[np.argmax(np.where(passive, -np.inf, gain))] = True
        while True:
            z = np.zeros_like(x)
            block = np.ix_(passive, passive)
            z[passive] = _solve_symmetric(gram[block], moment[passive])
            if np.all(z[passive] > 0):
                x = z
                break
            blocking = np.flatnonzero(passive & (z <= 0))
            steps = x[blocking] / (x[blocking] - z[blocking])
            x = x + steps.min() * (z - x)
            passive[blocking[np.argmin(steps)]] = False  # each pass frees at least one
            passive &= x > 0
            x[~passive] = 0.0
    return x


def _minimise_1d(objective: Callable[[float], float], center: float) -> tuple[float, float]:
    """Minimise over ``center ± _SEARCH_SPAN``: best grid point, then golden-section search."""
    grid = np.linspace(center - _SEARCH_SPAN, center + _SEARCH_SPAN, _SEARCH_POINTS)
    values = [objective(x) for x in grid]
    best = int(np.argmin(values))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    shrink = (math.sqrt(5) - 1) / 2
    inner_low, inner_high = high - shrink * (high - low), low + shrink * (high - low)
    value_low, value_high = objective(inner_low), objective(inner_high)
    while high - low > _SEARCH_TOLERANCE:
        if value_low <= value_high:
            high, inner_high, value_high = inner_high, inner_low, value_low
            inner_low = high - shrink * (high - low)
            value_low = objective(inner_low)
        else:
            low, inner_low, value_low = inner_low, inner_high, value_high
            inner_high = low + shrink * (high - low)
            value_high = objective(inner_high)
    candidates = [(values[best], grid[best]), (value_low, inner_low), (value_high, inner_high)]
    value, x = min(candidates)
    return float(x), float(value)


@attrs.define(eq=False, kw_only=True)
class _Calibration:
    """The fitting problem: relative step-time errors plus a prior around base's values.

    ``ratio`` vectors are the free `_LINEAR` coefficients as multiples of base's.
    """

    features: np.ndarray
    measured_s: np.ndarray
    base_linear: np.ndarray  # the free `_LINEAR` coefficients of base
    free: np.ndarray  # which `_LINEAR` coefficients are free (non-zero in base)
    base_crossovers: np.ndarray  # log(Tw/τ), log(Th/τh) of base
    prior_weight: float

    def solve(self, log_crossovers: np.ndarray) -> tuple[np.ndarray, float]:
        """The best ``ratio`` for these crossovers, and its cost."""
        design = _design(self.features, log_crossovers)[:, self.free]
        design *= self.base_linear / self.measured_s[:, None]
        gram = design.T @ design + self.prior_weight * np.eye(len(self.base_linear))
        # Solve for the change from base, so what no sample sees keeps base's value.
        ratio = 1 + _solve_symmetric(gram, design.T @ (1 - design.sum(axis=1)))
        if np.any(ratio < 0):
            ratio = _nonnegative_least_squares(gram, design.sum(axis=0) + self.prior_weight)
        residual = design @ ratio - 1
        drift = np.concatenate([ratio - 1, log_crossovers - self.base_crossovers])
        return ratio, float(residual @ residual + self.prior_weight * (drift @ drift))

    def best_crossovers(self) -> np.ndarray:
        """log(Tw/τ), log(Th/τh) of least cost: for each head crossover, the best matmul one."""
        lin0, head0 = self.base_crossovers

        def cost(log_lin: float, log_head: float) -> float:
            return self.solve(np.array([log_lin, log_head]))[1]

        def best_cost_for_head(log_head: float) -> float:
            return _minimise_1d(lambda log_lin: cost(log_lin, log_head), lin0)[1]

        log_head = _minimise_1d(best_cost_for_head, head0)[0]
        log_lin = _minimise_1d(lambda x: cost(x, log_head), lin0)[0]
        return np.array([log_lin, log_head])


def fit_cost_model(
    samples: Sequence[tuple[StepBatch, float]],
    base: StepCostModel,
    *,
    prior_weight: float = 1e-3,
) -> StepCostModel:
    """The coefficients that best explain measured ``(batch, step seconds)`` samples.

    Minimises the squared relative errors ``(model - measured) / measured``
    plus ``prior_weight`` times the squared relative deviations of the
    coefficients from ``base``'s (a Gaussian prior, ``prior_weight = (noise /
    spread)²``: the default 1e-3 suits ~1 % timing noise and base coefficients
    trusted to ~±30 %; 0 gives plain least squares). Given the two crossovers
    ``Tw/τ`` (tokens) and ``Th/τh`` (rows) the model is linear in the other
    coefficients, which are solved exactly (non-negative least squares); the
    crossovers are searched on a grid within 10x of ``base``'s, then refined
    by golden-section search.

    Samples that straddle both crossovers (two or more batch sizes above each),
    with prefill-only and decode steps and prefix hits, identify every
    coefficient; what the samples cannot see stays at ``base`` (e.g. the decode
    terms when no sample decodes). Coefficients that are 0 in ``base``, and
    ``num_layers``, are kept as they are.

    Raises:
        ValueError: for no samples, a measured time that is not a positive
            finite number, a negative ``prior_weight``, or a ``base`` whose
            ``Tw``, ``τ``, ``Th`` or ``τh`` is 0 (its crossover is undefined).
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one sample")
    measured_s = np.array([seconds for _, seconds in samples], dtype=float)
    if not np.all(np.isfinite(measured_s) & (measured_s > 0)):
        raise ValueError("measured step times must be positive finite numbers of seconds")
    if not (math.isfinite(prior_weight) and prior_weight >= 0):
        raise ValueError(f"prior_weight must be a finite number >= 0, got {prior_weight!r}")
    for name in ("weight_read_s", "matmul_s_per_token", "head_read_s", "head_s_per_row"):
        if getattr(base, name) == 0:
            raise ValueError(f"fit_cost_model needs a base with {name} > 0")
    base_linear = np.array([getattr(base, name) for name in _LINEAR])
    free = base_linear > 0
    calibration = _Calibration(
        features=_features([batch for batch, _ in samples], base.num_layers),
        measured_s=measured_s,
        base_linear=base_linear[free],
        free=free,
        base_crossovers=np.log(
            [base.weight_read_s / base.matmul_s_per_token, base.head_read_s / base.head_s_per_row]
        ),
        prior_weight=prior_weight,
    )
    log_crossovers = calibration.best_crossovers()
    fitted = np.zeros(len(_LINEAR))
    fitted[free] = calibration.solve(log_crossovers)[0] * base_linear[free]
    linear = {name: float(value) for name, value in zip(_LINEAR, fitted, strict=True)}
    c_lin, c_head = np.exp(log_crossovers)
    return attrs.evolve(
        base,
        **linear,
        matmul_s_per_token=linear["weight_read_s"] / float(c_lin),
        head_s_per_row=linear["head_read_s"] / float(c_head),
    )
