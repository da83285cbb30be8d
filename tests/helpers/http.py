"""Small HTTP helpers for the server tests (stdlib only)."""

import json
import socket
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(server, path, body, headers=None, with_headers=False):
    """(status, parsed JSON or raw text[, response headers]) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method="POST",
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, text, reply_headers = response.status, response.read().decode(), \
                response.headers
    except urllib.error.HTTPError as error:
        status, text, reply_headers = error.code, error.read().decode(), error.headers
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return (status, parsed, reply_headers) if with_headers else (status, parsed)


def server_model(server):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


def get_text(server, path):
    with urllib.request.urlopen(server.url + path, timeout=30) as response:
        return response.read().decode()


def metric(text, name, **labels):
    """The sum of ``name``'s samples in a Prometheus exposition whose labels include
    ``labels`` (0 when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name
               and all(sample.labels.get(k) == v for k, v in labels.items()))
