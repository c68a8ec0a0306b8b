"""/v1/completions accepts the prompt forms of the OpenAI API it serves: a string, a one-string
list, a list of token ids; a batch of prompts (or an empty list) is a clear 400 naming ``prompt``."""

from __future__ import annotations

import json

import pytest

from tests.support.clients import http_post
from tests.support.procs import Server


def _complete(server: Server, prompt: object) -> tuple[int, dict]:
    status, _, body = http_post(server.http_url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    return status, json.loads(body)


def test_string_one_string_list_and_token_ids(http_server: Server) -> None:
    status, text = _complete(http_server, "hello there")
    assert status == 200, text
    status, listed = _complete(http_server, ["hello there"])
    assert status == 200, listed
    assert listed["usage"]["prompt_tokens"] == text["usage"]["prompt_tokens"]
    status, ids = _complete(http_server, [5, 6, 7])
    assert status == 200, ids
    assert ids["usage"]["prompt_tokens"] == 3
    assert ids["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("prompt", [["a", "b"], []])
def test_batch_or_empty_prompt_is_rejected(http_server: Server, prompt: list) -> None:
    status, body = _complete(http_server, prompt)
    assert status == 400, body
    err = body["error"]
    assert err["message"].startswith("prompt") or (err["param"] or "").startswith("prompt"), err
