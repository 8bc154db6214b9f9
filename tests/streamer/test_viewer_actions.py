"""The viewer page's action command: its JSON body is checked before it goes anywhere, and the session
view the page polls carries the model's action schema, the current action and the recent blocks.

The scheduler side (validation against the schema, block boundaries) is tested on a real mesh in
tests/mesh/test_viewer_play.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from inferix.api.v1 import common_pb2
from inferix.viewer_token import ViewerTokens
from inferix_cli.mesh.launch import ServiceProcess
from streamer.control import SessionView
from streamer.web import HttpError, parse_action
from tests.streamer.live import SECRET, start_live_streamer
from tests.streamer.test_viewers import request

TOKENS = ViewerTokens(SECRET.encode())


@pytest.mark.parametrize(
    ("body", "keys", "mouse"),
    [
        ({"keys": ["W", "A"], "mouse": [0, 0.05]}, ("W", "A"), (0.0, 0.05)),
        ({"keys": []}, (), ()),
        ({}, (), ()),  # the neutral action
        ({"keys": ["ArrowUp"], "mouse": [-1, 2]}, ("ArrowUp",), (-1.0, 2.0)),  # ranges are the scheduler's to check
    ],
)
def test_an_action_body_gives_keys_and_mouse(body: object, keys: tuple[str, ...], mouse: tuple[float, ...]) -> None:
    assert parse_action(body) == (keys, mouse)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (["W"], "action: the body must be a JSON object"),
        ("W", "action: the body must be a JSON object"),
        ({"keys": "W"}, 'action: keys must be a list of strings (e.g. ["W", "A"]), got "W"'),
        ({"keys": ["W", 1]}, 'action: keys must be a list of strings (e.g. ["W", "A"]), got ["W", 1]'),
        ({"keys": [None]}, "action: keys must be a list of strings"),
        ({"keys": [""]}, "action: keys: at most 16 keys of 1 to 32 characters"),
        ({"keys": ["W"] * 17}, "action: keys: at most 16 keys"),
        ({"keys": ["x" * 33]}, "action: keys: at most 16 keys of 1 to 32 characters"),
        ({"mouse": 0.1}, "action: mouse must be a list of finite numbers (e.g. [0, 0.05]), got 0.1"),
        ({"mouse": ["0.1"]}, "action: mouse must be a list of finite numbers"),
        ({"mouse": [True]}, "action: mouse must be a list of finite numbers"),
        ({"mouse": [float("nan")]}, "action: mouse must be a list of finite numbers"),
        ({"mouse": [10**400]}, "action: mouse must be a list of finite numbers"),
        ({"mouse": [0.0] * 9}, "action: mouse: at most 8 values, got 9"),
        ({"keys": ["W"], "payload": "x"}, "action: unknown field(s) 'payload'; send keys and mouse"),
    ],
)
def test_a_bad_action_body_is_refused_naming_the_field(body: object, reason: str) -> None:
    with pytest.raises(HttpError) as refused:
        parse_action(body)
    assert refused.value.status == 400
    assert reason in refused.value.reason, refused.value.reason


@pytest.fixture(scope="module")
def streamer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, str]]:
    process, http_port = start_live_streamer(tmp_path_factory.mktemp("actions"))
    yield process, f"http://127.0.0.1:{http_port}"
    assert process.stop() == 0, process.log_tail()


def test_the_action_endpoint_checks_the_body_before_forwarding(streamer: tuple[ServiceProcess, str]) -> None:
    _, http = streamer
    url = f"{http}/api/sessions/s1/action"
    token = TOKENS.mint("s1")
    cases = {
        "not JSON": (b"W", 400, 'the body must be JSON {"keys": ["W"], "mouse": [0, 0.05]}: Expecting value'),
        "keys not a list": (b'{"keys": "W"}', 400, "action: keys must be a list of strings"),
        "mouse not numbers": (b'{"mouse": ["a"]}', 400, "action: mouse must be a list of finite numbers"),
        # a well-formed action goes on to the scheduler, which this streamer does not know
        "well-formed": (b'{"keys": ["W"], "mouse": [0, 0.05]}', 503, "no scheduler is known"),
    }
    for name, (body, status, reason) in cases.items():
        got_status, got_body = request("POST", url, token, body, "application/json")
        assert got_status == status, (name, got_status, got_body)
        assert reason in json.loads(got_body)["error"], (name, got_body)
    assert request("POST", url, TOKENS.mint("s2"), b"{}", "application/json")[0] == 403  # another session's token


def test_the_session_view_has_the_schema_the_action_and_recent_blocks() -> None:
    view = SessionView()
    assert view.to_json()["action_schema"] is None and view.to_json()["recent_blocks"] == []  # a text model
    view.action_schema = {"keys": [{"name": "forward", "key": "W"}], "mouse": [], "one_hot": False}
    for index in range(20):
        block = common_pb2.BlockEvent(block_index=index, first_frame=max(0, 12 * index - 3), num_frames=12)
        block.action.keys.extend(["W"] if index % 2 else [])
        block.action.mouse.extend([0.0, 0.05])
        view.add_block(block)
    shown = view.to_json()
    blocks = shown["recent_blocks"]
    assert isinstance(blocks, list) and [b["block"] for b in blocks] == list(range(4, 20))  # the last 16
    assert blocks[-1] == {
        "block": 19,
        "first_frame": 225,
        "num_frames": 12,
        "action": {"keys": ["W"], "mouse": [0.0, 0.05]},
    }
    assert shown["current_action"] == {"keys": ["W"], "mouse": [0.0, 0.05]} and shown["blocks_done"] == 20
    text_block = common_pb2.BlockEvent(block_index=20, first_frame=237, num_frames=12)
    view.add_block(text_block)  # a block without an action (text models) keeps the last known one
    assert view.to_json()["current_action"] == {"keys": ["W"], "mouse": [0.0, 0.05]}
    assert "action" not in view.recent_blocks[-1]
