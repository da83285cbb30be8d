"""How long one engine step takes, as a function of its batch (``COST_MODEL.md``).

The model is Llama-3-8B bf16 on one GPU, grounded in Vidur's published kernel
profiles and the roofline::

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
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs
import numpy as np


def _check_count(minimum: int):
    def check(_instance: object, attribute: attrs.Attribute, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


def _check_seconds(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value >= 0
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

    tokens: int = attrs.field(validator=_check_count(1))
    cached_tokens: int = attrs.field(default=0, validator=_check_count(0))


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
            chunk.tokens * (chunk.cached_tokens + (chunk.tokens + 1) / 2)
            for chunk in self.prefills
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
    num_layers: int = attrs.field(default=32, validator=_check_count(1))

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
        num_decodes = len(batch.decode_context_tokens)
        linear = (
            self.weight_read_s**1.5 + (batch.num_tokens * self.matmul_s_per_token) ** 1.5
        ) ** (2 / 3)
        head = max(self.head_read_s, batch.num_logit_rows * self.head_s_per_row)
        decode = (
            (self.num_layers * self.decode_launch_s_per_layer if num_decodes else 0.0)
            + sum(batch.decode_context_tokens) * self.decode_s_per_context_token
        )
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


_FITTED = (
    "t0_s",
    "weight_read_s",
    "matmul_s_per_token",
    "head_read_s",
    "head_s_per_row",
    "decode_launch_s_per_layer",
    "decode_s_per_context_token",
    "prefill_attn_s_per_pair",
    "prefill_attn_s_per_token",
)


def _features(batches: Sequence[StepBatch]) -> dict[str, np.ndarray]:
    return {
        "tokens": np.array([b.num_tokens for b in batches], dtype=float),
        "rows": np.array([b.num_logit_rows for b in batches], dtype=float),
        "decoding": np.array([bool(b.decode_context_tokens) for b in batches], dtype=float),
        "context": np.array([sum(b.decode_context_tokens) for b in batches], dtype=float),
        "pairs": np.array([b.prefill_pairs for b in batches], dtype=float),
        "prefill": np.array([b.prefill_tokens for b in batches], dtype=float),
    }


def _predict(
    coef: np.ndarray, x: dict[str, np.ndarray], num_layers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Step times for coefficients ``coef`` (in `_FITTED` order) and d(time)/d(log coef)."""
    t0, tw, tau, th, tau_h, alpha, beta, pi, gamma = coef
    matmul = x["tokens"] * tau
    linear = (tw**1.5 + matmul**1.5) ** (2 / 3)
    head_rows = x["rows"] * tau_h
    head_bound = th >= head_rows
    terms = np.stack(
        [
            np.full_like(linear, t0),
            tw * np.sqrt(tw / linear),
            matmul * np.sqrt(matmul / linear),
            np.where(head_bound, th, 0.0),
            np.where(head_bound, 0.0, head_rows),
            x["decoding"] * num_layers * alpha,
            x["context"] * beta,
            x["pairs"] * pi,
            x["prefill"] * gamma,
        ],
        axis=1,
    )
    time = t0 + linear + np.maximum(th, head_rows) + terms[:, 5:].sum(axis=1)
    return time, terms


def fit_cost_model(
    samples: Sequence[tuple[StepBatch, float]],
    base: StepCostModel,
    *,
    prior_weight: float = 1e-4,
    max_iterations: int = 200,
) -> StepCostModel:
    """Coefficients that best explain measured ``(batch, step seconds)`` samples.

    Minimises the sum of squared relative errors ``(model - measured) / measured``
    plus ``prior_weight`` times the squared log-ratios of the coefficients to
    ``base``'s, by Levenberg-Marquardt over the logs of the coefficients (so
    they stay positive). The weak prior keeps coefficients that the samples
    cannot separate (e.g. ``t0_s`` against ``head_read_s`` when every batch is
    small) at their base values; with samples that cover both sides of the
    matmul and LM-head crossovers, prefill-only and decode steps, and prefix
    hits, every coefficient is identifiable. Coefficients that are 0 in
    ``base``, and ``num_layers``, are kept as they are.

    Raises:
        ValueError: if there are no samples, a measured time is not a positive
            finite number, or ``prior_weight`` is negative.
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one sample")
    measured = np.array([seconds for _, seconds in samples], dtype=float)
    if not np.all(np.isfinite(measured) & (measured > 0)):
        raise ValueError("measured step times must be positive finite numbers of seconds")
    if not (math.isfinite(prior_weight) and prior_weight >= 0):
        raise ValueError(f"prior_weight must be a finite number >= 0, got {prior_weight!r}")
    x = _features([batch for batch, _ in samples])
    base_coef = np.array([getattr(base, name) for name in _FITTED], dtype=float)
    free = base_coef > 0
    log_base = np.log(np.where(free, base_coef, 1.0))

    def cost_and_parts(log_coef: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        coef = np.where(free, np.exp(log_coef), 0.0)
        time, jacobian = _predict(coef, x, base.num_layers)
        residual = (time - measured) / measured
        prior = log_coef[free] - log_base[free]
        cost = float(residual @ residual + prior_weight * (prior @ prior))
        return cost, residual, jacobian[:, free] / measured[:, None]

    log_coef = log_base.copy()
    cost, residual, jacobian = cost_and_parts(log_coef)
    damping = 1e-3
    for _ in range(max_iterations):
        gradient = jacobian.T @ residual + prior_weight * (log_coef[free] - log_base[free])
        hessian = jacobian.T @ jacobian + prior_weight * np.eye(int(free.sum()))
        scaled = hessian + damping * np.diag(np.diag(hessian) + 1e-12)
        step = np.linalg.solve(scaled, -gradient)
        trial = log_coef.copy()
        trial[free] += step
        trial_cost, trial_residual, trial_jacobian = cost_and_parts(trial)
        if trial_cost < cost:
            converged = cost - trial_cost <= 1e-15 * max(cost, 1e-300)
            log_coef, cost, residual, jacobian = trial, trial_cost, trial_residual, trial_jacobian
            damping = max(damping / 3, 1e-12)
            if converged or np.max(np.abs(step)) < 1e-10:
                break
        else:
            damping *= 4
            if damping > 1e12:
                break
    fitted = np.where(free, np.exp(log_coef), 0.0)
    return attrs.evolve(base, **{name: float(v) for name, v in zip(_FITTED, fitted, strict=True)})
