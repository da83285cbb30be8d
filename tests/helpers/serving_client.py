"""An HTTP client for the serving tests (stdlib): repeated headers, streams read whole."""

import http.client
import json
import urllib.parse
import urllib.request

import attrs


@attrs.frozen
class Reply:
    status: int
    headers: dict
    """Lower-cased names."""
    text: str

    @property
    def json(self):
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    @property
    def events(self):
        """The JSON payloads of a stream's ``data:`` lines."""
        return [json.loads(line[5:]) for line in self.text.splitlines()
                if line.startswith("data:") and line[5:].strip() != "[DONE]"]

    @property
    def message(self):
        """An error body's message (OpenAI or Anthropic format), or None."""
        body = self.json
        error = body.get("error") if isinstance(body, dict) else None
        return error.get("message") if isinstance(error, dict) else None


def send(url, path, body, headers=(), method="POST", timeout=300):
    """One request; ``body`` is JSON-encoded unless bytes; ``headers`` a list of pairs."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.putrequest(method, path)
    names = {name.lower() for name, _ in headers}
    for name, value in ([] if "content-type" in names else
                        [("content-type", "application/json")]) + list(headers):
        connection.putheader(name, value)
    connection.putheader("content-length", str(len(data)))
    connection.endheaders(data)
    response = connection.getresponse()
    text = response.read().decode("utf-8", "replace")
    reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
    connection.close()
    return reply


def model_name(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


def get_text(url, path):
    with urllib.request.urlopen(url + path, timeout=30) as response:
        return response.read().decode()
