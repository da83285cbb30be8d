"""The systems a replay compares, stock vLLM's frontend admission (``stock+queue-caps``) included.

vLLM 0.32 can bound its own queues in the API server: ``max_num_queued_reqs`` and
``max_num_queued_tokens`` (`AsyncLLM.check_admission`, called from ``add_request`` before the
request reaches the engine core). The replay drives the scheduler directly, with no frontend,
so `QueueCappedHarness` applies the same check at the replay's arrival point, counting what
vLLM's output processor counts:

- ``max_num_queued_reqs``: requests added and not yet finished (waiting or running; the output
  processor drops a request when its finished output arrives or it is aborted). A request is
  rejected when ``unfinished + 1 > max_num_queued_reqs``;
- ``max_num_queued_tokens``: the prompt tokens (whole ``prompt_len``, prefix-cache hits and
  finished chunks not subtracted) of requests that have not produced an output yet
  (``RequestState.is_prefilling``, cleared by the request's first engine output). A request is
  rejected when that sum is already ``>= max_num_queued_tokens`` (its own prompt not added).

Both rejections are HTTP 503 without a Retry-After header (``QueueOverflowError``,
``MaxQueuedTokensError``); the replay records them as ``rejected:max_num_queued_reqs`` and
``rejected:max_num_queued_tokens``, with no ``retry_after_s``.

The stock sweep also covers vLLM's chunked-prefill knobs, which tuned agentic deployments
run: ``long_prefill_token_threshold`` (a long prompt takes at most that many tokens a step
beside other requests) and ``long_prefill_token_threshold_adaptive`` (that cap floored at the
token budget's fair share among the queued and running requests), alone and with queue caps.

System names: ``fcfs``, ``priority``, ``pipeline:SPEC`` (`benchmarks.replay.driver`),
``stock+queue-caps:BASE[:reqs=N][:tokens=N][:chunk=N[:adaptive]]`` (one stock setting on
``fcfs`` or ``priority``) and ``stock+queue-caps`` alone, which names the best setting of
`QUEUE_CAPS_SWEEP` (a run replays every setting and reports the sweep; see
`best_queue_caps`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from benchmarks.replay.driver import build_harness
from integrations.vllm_v1.instruments.harness import (
    EngineShape,
    SchedulerHarness,
    StepResult,
    build_scheduler,
)

QUEUE_CAPS = "stock+queue-caps"
"""The name of stock vLLM with its frontend admission at the best setting of a sweep."""
StockPolicy = Literal["fcfs", "priority"]

def _optional_positive(_instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{attribute.name} must be an integer >= 0 or None, got {value!r}")

@attrs.frozen(kw_only=True)
class QueueCaps:
    """One stock vLLM setting: a queue policy, its frontend admission caps and its
    chunked-prefill knobs."""

    base: StockPolicy = attrs.field(
        default="fcfs", validator=attrs.validators.in_(("fcfs", "priority")))
    """vLLM's ``--scheduling-policy``."""
    max_num_queued_reqs: int | None = attrs.field(default=None, validator=_optional_positive)
    max_num_queued_tokens: int | None = attrs.field(default=None, validator=_optional_positive)
    long_prefill_token_threshold: int | None = attrs.field(default=None,
                                                           validator=_optional_positive)
    """vLLM's ``--long-prefill-token-threshold`` (None: the engine's own)."""
    adaptive: bool = False
    """vLLM's ``--long-prefill-token-threshold-adaptive`` (needs the threshold)."""

    def __attrs_post_init__(self) -> None:
        if self.adaptive and not self.long_prefill_token_threshold:
            raise ValueError("adaptive needs a long_prefill_token_threshold (vLLM ignores it "
                             "without one)")

    @property
    def name(self) -> str:
        """``stock+queue-caps:BASE[:reqs=N][:tokens=N][:chunk=N[:adaptive]]`` (parsed back
        by `parse`)."""
        parts = [QUEUE_CAPS, self.base]
        if self.max_num_queued_reqs is not None:
            parts.append(f"reqs={self.max_num_queued_reqs}")
        if self.max_num_queued_tokens is not None:
            parts.append(f"tokens={self.max_num_queued_tokens}")
        if self.long_prefill_token_threshold is not None:
            parts.append(f"chunk={self.long_prefill_token_threshold}")
        if self.adaptive:
            parts.append("adaptive")
        return ":".join(parts)

    @classmethod
    def parse(cls, name: str) -> QueueCaps:
        """The setting a `name` describes.

        Raises:
            ValueError: naming the part that is not ``fcfs``/``priority``, ``reqs=N``,
                ``tokens=N``, ``chunk=N`` or ``adaptive``.
        """
        head, *parts = name.split(":")
        if head != QUEUE_CAPS or not parts:
            raise ValueError(f"{name!r}: expected "
                             f"{QUEUE_CAPS}:BASE[:reqs=N][:tokens=N][:chunk=N[:adaptive]]")
        keys = {"reqs": "max_num_queued_reqs", "tokens": "max_num_queued_tokens",
                "chunk": "long_prefill_token_threshold"}
        values: dict[str, int | bool] = {}
        for part in parts[1:]:
            if part == "adaptive":
                values["adaptive"] = True
                continue
            key, sep, value = part.partition("=")
            if not sep or key not in keys or not value.isdigit():
                raise ValueError(f"{name!r}: {part!r} is not reqs=N, tokens=N, chunk=N or "
                                 "adaptive")
            values[keys[key]] = int(value)
        if parts[0] not in ("fcfs", "priority"):
            raise ValueError(f"{name!r}: base {parts[0]!r} is not fcfs or priority")
        return cls(base=parts[0], **values)

    def engine_shape(self, shape: EngineShape) -> EngineShape:
        """``shape`` with this setting's chunked-prefill knobs."""
        if self.long_prefill_token_threshold is None:
            return shape
        return attrs.evolve(shape, long_prefill_token_threshold=self.long_prefill_token_threshold,
                            long_prefill_token_threshold_adaptive=self.adaptive)

    def rejection(self, unfinished_requests: int, queued_prompt_tokens: int) -> str | None:
        """The reason vLLM's ``check_admission`` would reject a request with, or None.

        ``unfinished_requests`` and ``queued_prompt_tokens`` are what vLLM's output processor
        counts (module docstring); the request asks for one sequence (``n == 1``).
        """
        if (self.max_num_queued_reqs is not None
                and unfinished_requests + 1 > self.max_num_queued_reqs):
            return "max_num_queued_reqs"
        if (self.max_num_queued_tokens is not None
                and queued_prompt_tokens >= self.max_num_queued_tokens):
            return "max_num_queued_tokens"
        return None

@attrs.frozen
class FrontendRejection:
    """What the replay reads of a request the frontend turned away (an engine output's fields)."""

    request_id: str
    stop_reason: str
    new_token_ids: tuple[int, ...] = ()
    finish_reason: str = "abort"

@attrs.define(eq=False)
class QueueCappedHarness(SchedulerHarness):
    """A stock vLLM scheduler behind vLLM's frontend admission (`QueueCaps`).

    Every request the caps admit goes to the scheduler as usual; one they reject never reaches
    it, and is reported finished with ``stop_reason="rejected:<reason>"`` by the next
    `complete`. The counts follow the outputs that pass through `complete` and the aborts,
    as vLLM's output processor follows engine outputs.
    """

    caps: QueueCaps = attrs.field(kw_only=True, factory=QueueCaps)
    _unfinished: set[str] = attrs.field(init=False, factory=set, repr=False)
    _prefilling: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _queued_tokens: int = attrs.field(init=False, default=0, repr=False)
    _pending: list[FrontendRejection] = attrs.field(init=False, factory=list, repr=False)
    rejections: Counter[str] = attrs.field(init=False, factory=Counter)
    """Rejections so far, by reason."""

    @classmethod
    def with_caps(cls, caps: QueueCaps, shape: EngineShape) -> QueueCappedHarness:
        """A harness over stock vLLM ``caps.base`` on an engine of ``shape``."""
        return cls(build_scheduler(caps.engine_shape(shape), None, caps.base), caps=caps)

    @property
    def unfinished_requests(self) -> int:
        """Requests admitted and not finished (``get_num_unfinished_requests``)."""
        return len(self._unfinished)

    @property
    def queued_prompt_tokens(self) -> int:
        """Prompt tokens of admitted requests with no output yet (``get_num_queued_tokens``)."""
        return self._queued_tokens

    def add_request(self, request_id, prompt_token_ids, max_tokens, **kwargs):  # noqa: ANN001, ANN201
        reason = self.caps.rejection(len(self._unfinished), self._queued_tokens)
        if reason is not None:
            self.rejections[reason] += 1
            self._pending.append(FrontendRejection(request_id, f"rejected:{reason}"))
            return None
        request = super().add_request(request_id, prompt_token_ids, max_tokens, **kwargs)
        self._unfinished.add(request_id)
        self._prefilling[request_id] = len(request.prompt_token_ids)
        self._queued_tokens += len(request.prompt_token_ids)
        return request

    def _forget(self, request_id: str, *, finished: bool) -> None:
        tokens = self._prefilling.pop(request_id, None)
        if tokens is not None:
            self._queued_tokens -= tokens
        if finished:
            self._unfinished.discard(request_id)

    def complete(self, scheduler_output) -> StepResult:  # noqa: ANN001
        result = super().complete(scheduler_output)
        for out in result.outputs:
            self._forget(out.request_id, finished=out.finish_reason is not None)
        if not self._pending:
            return result
        pending, self._pending = tuple(self._pending), []
        return attrs.evolve(result, outputs=result.outputs + pending,
                            finished_request_ids=result.finished_request_ids
                            + tuple(r.request_id for r in pending))

    def has_requests(self) -> bool:
        return bool(self._pending) or super().has_requests()

    def abort(self, request_id: str) -> None:
        super().abort(request_id)
        self._forget(request_id, finished=True)

    def check_invariants(self) -> None:
        """The token count is the sum over the requests with no output yet, all unfinished."""
        assert self._queued_tokens == sum(self._prefilling.values()) >= 0
        assert set(self._prefilling) <= self._unfinished

_CHUNKING = ({"long_prefill_token_threshold": 512}, {"long_prefill_token_threshold": 2048},
             {"long_prefill_token_threshold": 512, "adaptive": True})
QUEUE_CAPS_SWEEP: tuple[QueueCaps, ...] = tuple(
    QueueCaps(base=base, **setting)
    for base in ("fcfs", "priority")
    for setting in ({"max_num_queued_reqs": 128}, {"max_num_queued_reqs": 256},
                    {"max_num_queued_reqs": 512}, {"max_num_queued_tokens": 16384},
                    {"max_num_queued_tokens": 32768}, {"max_num_queued_tokens": 65536},
                    *_CHUNKING,
                    *({"long_prefill_token_threshold": 512, "adaptive": True, **caps}
                      for caps in ({"max_num_queued_reqs": 256},
                                   {"max_num_queued_tokens": 32768}))))
"""The settings a ``stock+queue-caps`` run sweeps, on each stock policy: each queue knob
alone, the chunked-prefill knobs alone, and the adaptive chunk with each knob's middle
setting. Requests: half, one and two times ``max_num_seqs`` (256) in flight; tokens: about
0.5, 1 and 2 s of prefill at the H100 cost model's ~33k prefill tokens/s (vLLM's rule of
thumb is ``target_TTFT · prefill_throughput``); chunks: 512 tokens (the threshold agentic
deployments report best, fixed and adaptive) and 2048."""

def build_system(name: str, shape: EngineShape) -> SchedulerHarness:
    """A fresh harness for ``fcfs``, ``priority``, ``pipeline:SPEC`` or one
    ``stock+queue-caps:...`` setting (plain ``stock+queue-caps`` is a sweep: `best_queue_caps`).

    Raises:
        ValueError: for an unknown name or a bad ``stock+queue-caps`` setting.
    """
    if name == QUEUE_CAPS:
        raise ValueError(f"{QUEUE_CAPS} is a sweep: run each of QUEUE_CAPS_SWEEP "
                         "(best_queue_caps), or name one setting, e.g. "
                         f"{QUEUE_CAPS_SWEEP[0].name}")
    if name.startswith(QUEUE_CAPS + ":"):
        return QueueCappedHarness.with_caps(QueueCaps.parse(name), shape)
    return build_harness(name, shape)

def best_queue_caps(scores: Mapping[str, Sequence[float | None]]) -> str:
    """The sweep's winner: the setting name whose score tuple is largest (ties: first listed).

    ``scores`` maps each setting's name to its score, compared as a tuple (e.g. goodput, then
    the share of admitted requests meeting their SLO); a missing value counts as lowest.

    Raises:
        ValueError: when ``scores`` is empty.
    """
    if not scores:
        raise ValueError("no queue-caps setting was run")

    def key(item: tuple[str, Sequence[float | None]]) -> tuple[float, ...]:
        return tuple(float("-inf") if v is None else v for v in item[1])

    return max(scores.items(), key=key)[0]

def expand_systems(systems: Sequence[str]) -> list[str]:
    """``systems`` with plain ``stock+queue-caps`` replaced by every setting of the sweep."""
    out: list[str] = []
    for system in systems:
        out.extend(c.name for c in QUEUE_CAPS_SWEEP) if system == QUEUE_CAPS else out.append(
            system)
    return out
