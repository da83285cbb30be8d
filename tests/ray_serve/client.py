"""HTTP helpers for the Ray Serve tests (stdlib only): JSON posts, SSE streams, scrapes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import attrs


@attrs.define
class Reply:
    """One request's outcome as the client saw it."""

    status: int
    headers: dict[str, str]
    body: object = None
    """The parsed JSON answer (non-streamed), or None."""
    events: list = attrs.field(factory=list)
    """A stream's parsed ``data:`` events (``[DONE]`` excluded)."""
    done: bool = False
    """A stream ended with ``data: [DONE]``."""
    error: str | None = None
    """Transport error (the connection broke: never expected)."""

    @property
    def stream_error(self) -> dict | None:
        """The stream's ``error`` event, if one came."""
        return next((e["error"] for e in self.events if "error" in e), None)

    def token_ids(self) -> list[int]:
        """The generated token ids (``return_token_ids``), streamed or not."""
        if self.events:
            return [t for e in self.events for c in e.get("choices", ())
                    for t in (c.get("token_ids") or ())]
        return list(self.body["choices"][0]["token_ids"])

    def finish_reason(self) -> str | None:
        """The (last) choice's finish reason."""
        if self.events:
            reasons = [c.get("finish_reason") for e in self.events for c in e.get("choices", ())]
            return next((r for r in reversed(reasons) if r), None)
        return self.body["choices"][0]["finish_reason"]


def post(url: str, body: dict | bytes, *, on_first_event=None, timeout_s: float = 300) -> Reply:
    """POST ``body`` (JSON) and read the whole answer; ``on_first_event()`` runs when a stream's
    first event arrives."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        answer = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as failed:
        text = failed.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return Reply(failed.code, dict(failed.headers.items()), parsed)
    except OSError as broken:
        return Reply(0, {}, error=repr(broken))
    with answer:
        headers = {k.lower(): v for k, v in answer.headers.items()}
        try:
            if not headers.get("content-type", "").startswith("text/event-stream"):
                return Reply(answer.status, headers, json.loads(answer.read()))
            reply = Reply(answer.status, headers)
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    reply.done = True
                    continue
                reply.events.append(json.loads(line[len("data: "):]))
                if len(reply.events) == 1 and on_first_event is not None:
                    on_first_event()
            return reply
        except OSError as broken:
            return Reply(answer.status, headers, error=repr(broken))


def get(url: str, timeout_s: float = 30) -> str:
    """GET ``url``'s body as text."""
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return answer.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
