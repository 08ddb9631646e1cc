"""Chat messages as /v1/chat/completions (and /v1/tokenize's ``messages``) checks them and hands them to the chat
template, following SGLang 0.5.23's Jinja path (serving_chat.py, parser/jinja_template_utils.py):

- ``content`` is a string or a list of content parts. Text parts are what a text-only model reads; an image, video or
  audio part is a 400 naming the part (SGLang: "Model only supports text input"), never dropped unread. SGLang's
  thinking parts (``{"type": "thinking"}``) are a 400 too: its generic Jinja path drops them without a word; the
  reasoning of an earlier turn goes in the message's ``reasoning_content``, which the template reads.
- The text parts reach the template as the template wants them (``Tokenizer.apply_chat_template``: a template that
  loops over a message's content gets the parts, any other their texts joined by a space), a tool message's always
  joined, as SGLang.
- An assistant message's ``tool_calls[].function.arguments``, OpenAI's JSON text, reach the template as the JSON
  object it holds (as SGLang, and Hugging Face's templates expect: Llama 3.1's writes ``arguments | tojson``, which
  wrote a string's JSON escaped a second time); arguments that are not a JSON object are a 400 naming them.
"""

from __future__ import annotations

import json

from sglang_eagle3.runtime.sampling import short_repr
from sglang_eagle3.server.protocol import APIError

# Content part types of SGLang's (and OpenAI's) requests that carry media: a text-only model refuses them.
MEDIA_PART_TYPES = ("image_url", "input_image", "video_url", "audio_url", "input_audio", "file")
# SGLang's assistant thinking parts.
THINKING_PART_TYPES = ("thinking", "reasoning")


def check_content_parts(i: int, content: list) -> None:
    """400 naming ``messages.i.content.j`` for a part that is not a text part."""
    if not content:
        param = f"messages.{i}.content"
        raise APIError(400, f"{param} is an empty list: give a string or at least one text part", param=param)
    for j, part in enumerate(content):
        where = f"messages.{i}.content.{j}"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise APIError(400, f"{where}={short_repr(part)} must be a content part object with a \"type\" "
                           "(a text part: {\"type\": \"text\", \"text\": \"...\"})", param=f"{where}.type")
        if kind in MEDIA_PART_TYPES:
            raise APIError(400, f"{where}.type={kind!r}: this model takes text input only (content parts of type "
                           "'text'); images, video and audio are not supported", param=f"{where}.type")
        if kind in THINKING_PART_TYPES:
            raise APIError(400, f"{where}.type={kind!r}: thinking content parts are not supported (SGLang drops them "
                           "from a Jinja-rendered prompt unread); give an earlier turn's reasoning as the message's "
                           "reasoning_content", param=f"{where}.type")
        if kind != "text":
            raise APIError(400, f"{where}.type={short_repr(kind)} is not a content part type this server reads: "
                           "give {\"type\": \"text\", \"text\": \"...\"}", param=f"{where}.type")
        if not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}.text={short_repr(part.get('text'))} must be a string", param=f"{where}.text")


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # (Python's json reads NaN and Infinity; JSON, and SGLang's orjson, do not)


def parse_tool_call_arguments(i: int, message: dict) -> None:
    """An assistant message's ``tool_calls[].function.arguments`` given as JSON text, in place (``message``: a dict the
    caller owns): the object it holds (a 400 naming it where it is not one). Calls of another shape (not objects,
    arguments already an object) are left as given, for the template to read or refuse."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
            continue
        param = f"messages.{i}.tool_calls.{j}.function.arguments"
        try:
            args = json.loads(fn["arguments"], parse_constant=_no_constant)
        except ValueError:
            raise APIError(400, f"{param}={short_repr(fn['arguments'])} is not valid JSON: give the call's "
                           "arguments as a JSON object's text, as the model wrote them", param=param) from None
        if not isinstance(args, dict):
            raise APIError(400, f"{param}={short_repr(fn['arguments'])} must be a JSON object's text",
                           param=param)
        fn["arguments"] = args  # (``message`` is a model_dump: its own copy of the request's values)


def message_dict(i: int, m) -> dict:
    """Message ``i`` (a protocol.ChatMessage) as the template's dict: None fields left out, content "" where there is
    none (an assistant's with tool_calls), text parts as ``{"type": "text", "text"}``, tool call arguments parsed."""
    d = m.model_dump(exclude_none=True)
    content = m.content
    if isinstance(content, list):
        content = [{"type": "text", "text": part["text"]} for part in content]
    d["content"] = content if content is not None else ""
    parse_tool_call_arguments(i, d)
    return d


def text_of(content) -> str:
    """A message's content as one text: a list of text parts joined by a space (SGLang's string form)."""
    if isinstance(content, list):
        return " ".join(part["text"] for part in content)
    return content
