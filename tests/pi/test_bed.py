"""The offline test bed itself works against the real `pi`: text, tool calls, errors, holds."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.pi.model_server import (
    Hold,
    HttpError,
    MalformedStream,
    ScriptedModelServer,
    Text,
    ToolCall,
    ToolCalls,
)


def _assistant_messages(event: dict) -> list[dict]:
    return [m for m in event["messages"] if m.get("role") == "assistant"]


def _text(message: dict) -> str:
    return "".join(part.get("text", "") for part in message["content"] if part["type"] == "text")


def test_a_prompt_gets_the_scripted_streamed_answer(model_server, pi_rpc):
    model_server.script(Text("Hello from the scripted model, in several chunks.", chunk_chars=5))
    pi = pi_rpc()
    pi.prompt("Say hello")
    end = pi.wait_for_type("agent_end")
    (assistant,) = _assistant_messages(end)
    assert _text(assistant) == "Hello from the scripted model, in several chunks."
    assert assistant["provider"] == "scripted"
    (request,) = model_server.requests
    assert request.body["stream"] is True
    assert request.last_user_text() == "Say hello"


def test_a_scripted_tool_call_is_executed_by_pi_and_its_result_sent_back(
    model_server, pi_home, pi_rpc
):
    (pi_home.project / "note.txt").write_text("the note says 42\n")
    model_server.script(
        ToolCalls(ToolCall("read", {"path": "note.txt"}, id="call_read"), text="Reading."),
        Text("The note says 42."),
    )
    pi = pi_rpc()
    pi.prompt("What does note.txt say?")
    pi.wait_for_type("agent_end")
    started = pi.wait_for_type("tool_execution_start")
    assert started["toolName"] == "read" and started["toolCallId"] == "call_read"
    first, second = model_server.requests
    assert first.tool("read") is not None
    (result,) = second.tool_results()
    assert result["tool_call_id"] == "call_read"
    assert "the note says 42" in result["content"]


def test_an_http_error_fails_the_turn_once_without_retries(model_server, pi_rpc):
    model_server.script(HttpError(503, "scripted overload"))
    pi = pi_rpc()
    pi.prompt("hi")
    end = pi.wait_for_type("agent_end")
    (assistant,) = _assistant_messages(end)
    assert assistant["stopReason"] == "error"
    assert "503" in assistant["errorMessage"]
    assert len(model_server.requests) == 1


def test_a_malformed_stream_fails_the_turn(model_server, pi_rpc):
    model_server.script(MalformedStream())
    pi = pi_rpc()
    pi.prompt("hi")
    end = pi.wait_for_type("agent_end")
    (assistant,) = _assistant_messages(end)
    assert assistant["stopReason"] == "error"


def test_a_held_reply_keeps_the_turn_open_until_pi_aborts_it(model_server, pi_rpc):
    model_server.script(Hold())
    pi = pi_rpc()
    pi.prompt("hi")
    model_server.wait_for_requests(1)
    assert not any(event.get("type") == "agent_end" for event in pi.events)
    assert pi.send({"type": "abort"})["success"]
    end = pi.wait_for_type("agent_end")
    (assistant,) = _assistant_messages(end)
    assert assistant["stopReason"] == "aborted"


def test_non_streaming_requests_get_one_completion_body_and_the_script_runs_out_loudly():
    with ScriptedModelServer() as server:
        server.script(ToolCalls(ToolCall("workflow", {"action": "submit"}), text="ok"))

        def post(body: dict) -> tuple[int, dict]:
            request = urllib.request.Request(
                f"{server.base_url}/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        status, body = post({"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert status == 200
        (choice,) = body["choices"]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "workflow"
        assert json.loads(call["arguments"]) == {"action": "submit"}
        status, body = post({"model": "m", "messages": []})
        assert status == 500 and "script exhausted" in body["error"]["message"]
        assert [r.index for r in server.requests] == [0, 1]
        with urllib.request.urlopen(f"{server.base_url}/models", timeout=10) as response:
            assert json.loads(response.read())["data"][0]["id"] == server.model_id
