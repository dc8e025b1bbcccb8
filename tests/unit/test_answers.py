"""drover's own answer types (``drover.workers.providers.answers``): a Messages-shaped
message's JSON read into an ``Answer`` keeps every block as it came (a thinking block's
signature, a block type drover does not read), and the room's neutral parts import no
provider SDK."""

from __future__ import annotations

import subprocess
import sys

from drover.workers.providers import Answer, AnswerUsage, Block

MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sim-1",
    "content": [
        {"type": "thinking", "thinking": "weigh it", "signature": "sig=="},
        {"type": "text", "text": "Two calls: "},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
    ],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 3,
              "cache_creation_input_tokens": None},
}


def test_a_message_reads_into_an_answer_that_keeps_its_blocks_as_they_came():
    answer = Answer.from_json(MESSAGE)
    assert answer.content_json() == MESSAGE["content"]
    assert [b.type for b in answer.content] == [
        "thinking", "text", "tool_use", "server_tool_use"]
    assert answer.text() == "Two calls: "
    call = answer.content[2]
    assert (call.id, call.name, call.input) == ("toolu_1", "lookup", {"q": "x"})
    assert answer.content[0].text == "" and answer.content[3].name == ""  # not a tool_use
    assert (answer.stop_reason, answer.model, answer.id) == ("tool_use", "claude-sim-1", "msg_1")
    assert answer.usage == AnswerUsage(12, 7, 0, 3)


def test_a_blocks_json_is_a_copy():
    block = Block({"type": "text", "text": "a"})
    block.to_json()["text"] = "b"
    assert block.text == "a"


def test_the_answer_types_import_no_provider_sdk():
    # The providers room itself too: Anthropic's names are imported when first asked for.
    code = ("import sys; import drover.workers.providers.answers, drover.workers.providers; "
            "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
