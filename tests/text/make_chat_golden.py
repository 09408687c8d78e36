#!/usr/bin/env python3
"""Golden corpus for the DeepSeek-V4 chat encoding (common/text/chat.c).

Builds a fixed set of conversations (the same on every run), renders each
with the official DeepSeek-V4 encoder (`encoding_dsv4.py` as shipped in the
`sglang` package, version 0.5.22, the last release that carries it), turns
each prompt into ids with the `tokenizers` package and the tokenizer shipped
in data/tokenizer/deepseek-v4/tokenizer.json, and writes one JSON object a
line to tests/text/golden/chat-encoding.jsonl:

    {"name", "messages", "tools", "options", "prompt", "ids"}

`options` holds duet's option names (duet_chat_opts_t): thinking,
keep_reasoning, no_bos, continue_final, reasoning_effort, effort_profile,
task, response_format.  test_chat_golden.c encodes every line with
duet_chat_encode and compares the prompt byte for byte and the ids one by
one.

Where duet's input is wider than the official encoder's (content as a list
of parts, null content, tool-call arguments given as "", the request's
tools), `to_official` below turns the request into what the official
encoder takes, the way docs/TEXT.md describes it.

Usage:
    make_chat_golden.py [--out PATH]    write the corpus
    make_chat_golden.py --check PATH    rebuild and compare with PATH

The official encoder is found through DUET_DSV4_ENCODER (a path to
encoding_dsv4.py) or an installed `sglang` package (installing it with
`pip install --no-deps sglang==0.5.22` is enough; it is read as a file,
never imported as a package).  Without it or `tokenizers` the script prints
SKIP and exits 77.  When they are missing from this Python but present in
/opt/chatenv (the project's usual virtual environment), it runs there.
"""

import argparse
import copy
import importlib.util
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(HERE, "golden", "chat-encoding.jsonl")
TOKENIZER = os.path.join(ROOT, "data", "tokenizer", "deepseek-v4", "tokenizer.json")
VENV_PYTHON = "/opt/chatenv/bin/python"
SKIP = 77


def find_encoder_path():
    path = os.environ.get("DUET_DSV4_ENCODER")
    if path:
        return path if os.path.isfile(path) else None
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = os.path.join(base, "srt", "entrypoints", "openai", "encoding_dsv4.py")
        if os.path.isfile(path):
            return path
    return None


def load_reference():
    """Returns (encoder module, tokenizers module) or exits 77."""
    missing = []
    enc_path = find_encoder_path()
    if enc_path is None:
        missing.append("the official encoder (pip install --no-deps sglang==0.5.22, "
                       "or DUET_DSV4_ENCODER=/path/to/encoding_dsv4.py)")
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        missing.append("tokenizers (pip install tokenizers)")
    if missing:
        if (os.path.exists(VENV_PYTHON)
                and os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(VENV_PYTHON)))
                and not os.environ.get("DUET_CHAT_GOLDEN_REEXEC")):
            os.environ["DUET_CHAT_GOLDEN_REEXEC"] = "1"
            os.execv(VENV_PYTHON, [VENV_PYTHON] + sys.argv)
        print("SKIP: make_chat_golden.py needs " + "; ".join(missing), file=sys.stderr)
        sys.exit(SKIP)
    spec = importlib.util.spec_from_file_location("duet_reference_encoding_dsv4", enc_path)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    import tokenizers
    return enc, tokenizers


# ---------------------------------------------------------------------------
# From duet's input to the official encoder's input (see docs/TEXT.md).

def _flatten_parts(parts):
    return " ".join(p["text"] for p in parts)


def _truthy(v):
    return bool(v)


def to_official(messages, tools, opts):
    msgs = copy.deepcopy(messages)
    for m in msgs:
        if m.get("content") is None:
            m["content"] = ""
        if isinstance(m["content"], list) and m["role"] != "tool":
            m["content"] = _flatten_parts(m["content"])
        if m["role"] == "assistant" and m.get("tool_calls"):
            for tc in m["tool_calls"]:
                fn = tc["function"]
                if isinstance(fn["arguments"], str) and fn["arguments"].strip(" \t\r\n") == "":
                    fn["arguments"] = "{}"
    rf = opts.get("response_format")
    if tools or _truthy(rf):
        if msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        if tools:
            msgs[0]["tools"] = copy.deepcopy(tools)
        if _truthy(rf):
            msgs[0]["response_format"] = copy.deepcopy(rf)
    return msgs


def run_official(enc, messages, tools, opts):
    msgs = to_official(messages, tools, opts)
    if opts.get("task"):
        enc.attach_task_to_last_user_message(msgs, opts["task"])
    if opts.get("continue_final"):
        msgs[-1]["wo_eos"] = True
    return enc.encode_messages(
        msgs,
        thinking_mode="thinking" if opts.get("thinking") else "chat",
        drop_thinking=not opts.get("keep_reasoning"),
        add_default_bos_token=not opts.get("no_bos"),
        reasoning_effort=opts.get("reasoning_effort"),
        reasoning_effort_profile=opts.get("effort_profile", "preview"),
    )


# ---------------------------------------------------------------------------
# Material.

TEXTS = [
    "Hello!",
    "What's the weather like in Paris today?",
    "日本語で説明してください。東京の人口は？",
    "Привет! Как дела?",
    "emoji test 🎉🚀👍🏽 and flags 🇫🇷",
    "code:\n```python\ndef f(x):\n    return x * 2\n```\n",
    "tabs\tand\nnewlines\r\nand a form feed\f",
    "quotes \"double\" and 'single' and \\backslash\\",
    "   leading and trailing spaces   ",
    "مرحبا بالعالم",
    "mixed 中文 and English 123456789 and 3.14159",
    "한국어 문장입니다.",
    "Ünïcödé ñ ß Ωμέγα",
    "a literal <think>tag</think> and </tool_result> in text",
    "numbers 1,000,000 and 0.000001 and 1e20",
    "JSON in text: {\"a\": [1, 2, {\"b\": null}]}",
    "x" * 257,
    "Summarize the following:\n\n" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 6,
    "control \u0001\u0007\u001f chars",
    "what is 2+2?",
    "",
    "ok",
    "Thanks, that helps a lot.",
    "Can you check again?",
    "zero width\u200bjoiner\u200d and nbsp\u00a0here",
    "tab-indented\n\tline\n\t\tdeeper",
]

SYSTEMS = [
    "You are a helpful assistant.",
    "You are DeepSeek, a large language model. Answer concisely.",
    "あなたは親切なアシスタントです。",
    "Follow the rules:\n1. Be brief.\n2. Cite sources.\n",
    "",
    "System prompt with \"quotes\" and \\ backslashes and emoji 😀",
]

REASONINGS = [
    "The user wants the weather. I should call the tool.",
    "Let me think step by step.\n1. Parse.\n2. Answer.",
    "思考：用户问的是东京。",
    "",
    "Hmm, 2+2 is 4.",
]

ANSWERS = [
    "It is sunny and 22 °C in Paris.",
    "Here is the answer: 4.",
    "東京の人口は約1400万人です。",
    "Sure! ```json\n{\"ok\": true}\n```",
    "",
    "I could not find that.",
    "Done. ✅",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    }},
    {"type": "function", "function": {
        "name": "search_documents",
        "description": "Search the corpus.\nReturns ranked hits with \"scores\".",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "date_range": {
                            "type": "object",
                            "properties": {"from": {"type": "string", "format": "date"},
                                           "to": {"type": "string", "format": "date"}},
                        },
                        "min_score": {"type": "number", "default": 0.1, "minimum": 0.0, "maximum": 1.0},
                    },
                    "additionalProperties": False,
                },
                "limit": {"type": "integer", "default": 10},
                "boost": {"type": "number", "default": 1e20},
                "epsilon": {"type": "number", "default": 1e-07},
                "scale": {"type": "number", "default": 100.0},
                "neg_zero": {"type": "number", "default": -0.0},
                "big": {"type": "integer", "default": 9007199254740993},
                "ratio": {"type": "number", "default": 2.5e-05},
                "huge": {"type": "number", "default": 1.5e300},
                "sixteen": {"type": "number", "default": 1e16},
                "fifteen": {"type": "number", "default": 1e15},
                "third": {"type": "number", "default": 0.3333333333333333},
            },
            "required": ["query"],
        },
        "strict": True,
    }},
    {"type": "function", "function": {
        "name": "查询天气",
        "description": "查询指定城市的天气 🌤️",
        "parameters": {"type": "object", "properties": {"城市": {"type": "string"}}, "required": ["城市"]},
    }},
    {"type": "function", "function": {
        "parameters": {"type": "object", "properties": {}},
        "name": "get_time",
        "description": "Key order as given: parameters first.",
    }},
    {"type": "function", "function": {
        "name": "run_code",
        "description": "Run code.\tTabs, \\backslashes\\, control \u0001 and DEL \u007f.",
        "parameters": {
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["python", "c", "bash"]},
                "code": {"type": "string"},
                "timeout": {"type": ["number", "null"], "default": None},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "args": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
            },
            "required": ["language", "code"],
            "$defs": {"Empty": {"type": "object", "properties": {}, "required": []}},
        },
    }},
    {"type": "function", "function": {"name": "no_params"}},
    {"type": "function", "function": {
        "name": "create_event",
        "description": "Create a calendar event",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "attendees": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"email": {"type": "string"}, "optional": {"type": "boolean", "default": False}},
                    "required": ["email"]}},
                "priority": {"type": "number", "enum": [1, 1.5, 2.0]},
                "all_day": {"type": "boolean"},
                "notes": {"type": ["string", "null"]},
            },
            "required": ["title"],
        },
    }},
]

# Argument texts as clients send them (each must be a JSON object).
ARGS = [
    '{"city": "Paris"}',
    '{"city":"Paris","days":3}',
    '{\n  "city": "東京",\n  "unit": "celsius"\n}',
    '{"city": "\\u6771\\u4eac", "note": "\\ud83d\\ude00 escaped emoji"}',
    '{"query": "climate", "filters": {"tags": ["a", "b"], "min_score": 0.5}, "limit": 5}',
    '{"int": 42, "neg": -7, "zero": 0, "negzero": -0, "big": 123456789012345678901234567890}',
    '{"f1": 1.0, "f2": 0.1, "f3": 1e20, "f4": 1E-7, "f5": 3.14159, "f6": -0.0, "f7": 2.50, "f8": 1e16, "f9": 1e15}',
    '{"t": true, "f": false, "n": null}',
    '{"arr": [1, "two", 3.0, false, null, [], {}], "obj": {"nested": {"deep": [1, {"x": "y"}]}}}',
    '{"empty_str": "", "empty_arr": [], "empty_obj": {}}',
    '{"text": "line1\\nline2\\ttab \\"quoted\\" back\\\\slash \\/ slash"}',
    '{"a": 1, "b": 2, "a": 3}',
    '{"inf": Infinity, "ninf": -Infinity, "nan": NaN, "overflow": 1e400}',
    '{}',
    '   {"padded": "whitespace around"}   ',
    '{"code": "print(\'hi\')\\n", "language": "python"}',
    '{"number_as_string": "42", "bool_as_string": "true", "null_as_string": "null"}',
    '{"unicode_key_键": "值", "emoji": "🎉"}',
    '{"ctrl": "\\u0001\\u001f", "del": "\\u007f"}',
    '{"small": 5e-324, "tiny": 1.5e-7, "exp": 12345678901234567890.0, "frac": 0.000123}',
    '{"title": "Team sync", "attendees": [{"email": "a@x.io"}, {"email": "b@x.io", "optional": true}], "priority": 1.5}',
    '{"nested_dups": {"k": 1, "k": {"z": 0}}}',
    '{"special": "<｜end▁of▁sentence｜> inside a value"}',
    '',
]

ARG_OBJECTS = [
    {"city": "Berlin", "days": 2},
    {"query": "obj args", "filters": {"tags": ["x"]}, "limit": 1},
]

TOOL_RESULTS = [
    "{\"temperature\": 22, \"condition\": \"sunny\"}",
    "Sunny, 22 °C",
    "",
    "Error: city not found",
    "東京: 晴れ、気温15度",
    "line1\nline2\n\nline4",
    [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
    [{"type": "text", "text": "see image"}, {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}],
    "<tool_result>nested markup</tool_result>",
]


def tc(cid, name, args):
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        call["id"] = cid
    return call


# ---------------------------------------------------------------------------
# Conversations written by hand: one per rule of the format.

def handwritten():
    cases = []

    def add(name, messages, tools=None, **opts):
        cases.append((name, messages, tools, opts))

    u = lambda t: {"role": "user", "content": t}
    s = lambda t: {"role": "system", "content": t}
    a = lambda t, rc=None, calls=None: dict(
        {"role": "assistant", "content": t},
        **({"reasoning_content": rc} if rc is not None else {}),
        **({"tool_calls": calls} if calls is not None else {}))
    tool = lambda cid, t: {"role": "tool", "tool_call_id": cid, "content": t}
    rem = lambda t: {"role": "latest_reminder", "content": t}
    dev = lambda t: {"role": "developer", "content": t}

    for th in (False, True):
        sfx = "think" if th else "chat"
        add("single_user_" + sfx, [u("Hello!")], thinking=th)
        add("system_user_" + sfx, [s(SYSTEMS[0]), u(TEXTS[1])], thinking=th)
        add("empty_system_" + sfx, [s(""), u("hi")], thinking=th)
        add("empty_user_" + sfx, [u("")], thinking=th)
        add("null_content_" + sfx, [s(None), u(None)], thinking=th)
        add("multi_turn_" + sfx, [s(SYSTEMS[1]), u("hi"), a("Hello! How can I help?", "greet"),
                                  u("what is 2+2?"), a("4", "2+2=4"), u("and 3+3?")], thinking=th)
        add("multi_turn_keep_" + sfx, [u("hi"), a("Hello!", "greet them"), u("again")],
            thinking=th, keep_reasoning=True)
        add("ends_with_assistant_" + sfx, [u("hi"), a("Hello!", "r")], thinking=th)
        add("ends_with_assistant_continue_" + sfx, [u("Write a poem"), a("Roses are", "poem")],
            thinking=th, continue_final=True)
        add("two_systems_" + sfx, [s("First."), s("Second."), u("hi")], thinking=th)
        add("system_in_middle_" + sfx, [u("hi"), a("hey"), s("Now be formal."), u("hello")], thinking=th)
        add("consecutive_users_" + sfx, [u("part one"), u("part two"), u("part three")], thinking=th)
        add("developer_first_" + sfx, [dev("Developer instructions."), u("hi")], thinking=th)
        add("developer_last_" + sfx, [u("hi"), a("hello", "r0"), dev("Now answer in French.")], thinking=th)
        add("developer_earlier_" + sfx, [dev("Old instructions."), u("hi"), a("hello", "r0"), u("bye")],
            thinking=th)
        add("reminder_end_" + sfx, [u("hi"), rem("Remember: be brief.")], thinking=th)
        add("reminder_after_assistant_" + sfx, [u("hi"), a("hello", "r"), rem("Reminder text")], thinking=th)
        add("reminder_before_user_" + sfx, [s("sys"), rem("Today is Monday."), u("what day is it?")],
            thinking=th)
        add("reminder_between_" + sfx, [u("q1"), a("a1", "t1"), rem("rem"), u("q2")], thinking=th)
        add("reminder_empty_" + sfx, [u("x"), rem(None)], thinking=th)
        add("reminder_only_" + sfx, [rem("just a reminder")], thinking=th)
        add("assistant_only_" + sfx, [a("I start.", "thinking first")], thinking=th)
        add("system_only_" + sfx, [s("Only a system prompt.")], thinking=th)
        add("content_parts_" + sfx, [
            {"role": "system", "content": [{"type": "text", "text": "sys a"}, {"type": "text", "text": "sys b"}]},
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "input_text", "text": "world"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ans"}]},
            {"role": "user", "content": []}], thinking=th)
        add("reasoning_last_turn_" + sfx, [u("hi"), a("answer", "the last turn's reasoning")], thinking=th)
        add("reasoning_null_" + sfx, [u("hi"), {"role": "assistant", "content": "x", "reasoning_content": None},
                                      u("again")], thinking=th)
        add("no_bos_" + sfx, [u("hi")], thinking=th, no_bos=True)
        add("special_text_in_content_" + sfx,
            [u("look: <｜end▁of▁sentence｜> and <｜User｜> and ｜DSML｜ text")], thinking=th)
        add("nul_byte_" + sfx, [u("before\u0000after")], thinking=th)

        # tools
        add("tools_single_user_" + sfx, [u("Weather in Paris?")], TOOLS[:1], thinking=th)
        add("tools_with_system_" + sfx, [s(SYSTEMS[0]), u("Weather in Paris?")], TOOLS, thinking=th)
        add("tools_empty_list_" + sfx, [u("hi")], [], thinking=th)
        add("tools_after_middle_system_" + sfx, [u("hi"), s("mid"), u("x")], TOOLS[2:4], thinking=th)
        add("tool_call_loop_" + sfx, [
            s(SYSTEMS[0]), u("Weather in Paris and Tokyo?"),
            a("", "Need two calls.", [tc("call_1", "get_weather", ARGS[0]),
                                      tc("call_2", "get_weather", ARGS[2])]),
            tool("call_1", TOOL_RESULTS[0]), tool("call_2", TOOL_RESULTS[4])], TOOLS, thinking=th)
        add("tool_call_loop_answer_" + sfx, [
            u("Weather in Paris?"),
            a("Let me check.", "call it", [tc("c1", "get_weather", ARGS[1])]),
            tool("c1", TOOL_RESULTS[1]),
            a("It is sunny.", "done"), u("Thanks! And tomorrow?")], TOOLS[:1], thinking=th)
        add("tool_results_reordered_" + sfx, [
            u("three things"),
            a("", None, [tc("a", "get_weather", ARGS[0]), tc("b", "get_time", ARGS[13]),
                         tc("c", "search_documents", ARGS[4])]),
            tool("c", "result c"), tool("a", "result a"), tool("b", "result b")], TOOLS, thinking=th)
        add("tool_results_then_user_" + sfx, [
            u("go"), a("", "r", [tc("x1", "get_time", "{}")]), tool("x1", "12:00"),
            u("and also this"), u("and this")], TOOLS, thinking=th)
        add("tool_calls_without_tools_" + sfx, [
            u("go"), a("calling", "r", [tc("x1", "get_time", "{}")]), tool("x1", "12:00")], None, thinking=th)
        add("tool_call_no_ids_" + sfx, [
            u("go"), a("", None, [tc(None, "get_weather", ARGS[0]), tc(None, "get_time", "{}")]),
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}], TOOLS, thinking=th)
        add("tool_result_parts_" + sfx, [
            u("go"), a("", None, [tc("p1", "get_time", "{}"), tc("p2", "get_time", "{}")]),
            tool("p1", TOOL_RESULTS[6]), tool("p2", TOOL_RESULTS[7])], TOOLS, thinking=th)
        add("tool_result_null_" + sfx, [
            u("go"), a("", None, [tc("n1", "get_time", "{}")]), tool("n1", None)], TOOLS, thinking=th)
        add("tool_args_object_" + sfx, [
            u("go"), a("", None, [tc("o1", "get_weather", ARG_OBJECTS[0]),
                                  tc("o2", "search_documents", ARG_OBJECTS[1])]),
            tool("o1", "ok"), tool("o2", "ok")], TOOLS, thinking=th)
        add("tool_args_empty_string_" + sfx, [
            u("go"), a("", None, [tc("e1", "no_params", "")]), tool("e1", "done")], TOOLS, thinking=th)
        add("parallel_then_user_drop_" + sfx, [
            u("q"), a("", "r1", [tc("c1", "get_time", "{}")]), tool("c1", "t"),
            a("final", "r2"), u("new question")], None, thinking=th)
        add("duplicate_call_ids_" + sfx, [
            u("go"), a("", None, [tc("d", "get_time", "{}"), tc("e", "get_time", "{}"), tc("d", "get_time", "{}")]),
            tool("e", "E"), tool("d", "D1"), tool("d", "D2")], TOOLS, thinking=th)
        add("result_without_id_" + sfx, [
            u("go"), a("", None, [tc("k1", "get_time", "{}"), tc("k2", "get_time", "{}")]),
            tool("k2", "two"), {"role": "tool", "content": "no id"}, tool("k1", "one")], TOOLS, thinking=th)
        add("two_tool_rounds_" + sfx, [
            u("go"), a("", "r1", [tc("r1a", "get_time", "{}"), tc("r1b", "get_time", "{}")]),
            tool("r1b", "B"), tool("r1a", "A"),
            a("", "r2", [tc("r2a", "get_weather", ARGS[0])]), tool("r2a", "W")], TOOLS, thinking=th)
        add("task_action_" + sfx, [u("book a flight")], TOOLS, thinking=th, task="action")
        add("task_query_" + sfx, [u("what is the capital of France?")], None, thinking=th, task="query")

    for i, args in enumerate(ARGS):
        for th in (False, True):
            add("args_%02d_%s" % (i, "think" if th else "chat"), [
                s(SYSTEMS[0]), u(TEXTS[i % len(TEXTS)]),
                a(ANSWERS[i % len(ANSWERS)], REASONINGS[i % len(REASONINGS)],
                  [tc("call_%d" % i, TOOLS[i % len(TOOLS)]["function"]["name"], args)]),
                tool("call_%d" % i, TOOL_RESULTS[i % len(TOOL_RESULTS)])], TOOLS, thinking=th)

    for prof, efforts in (("preview", [None, "high", "max"]), ("official", [None, "low", "high", "max"])):
        for eff in efforts:
            for th in (False, True):
                add("effort_%s_%s_%s" % (prof, eff, "think" if th else "chat"),
                    [s("sys"), u("hard problem")], thinking=th, reasoning_effort=eff, effort_profile=prof)
    add("effort_max_no_system", [u("hard")], thinking=True, reasoning_effort="max")
    add("effort_max_tools", [u("hard")], TOOLS[:2], thinking=True, reasoning_effort="max",
        effort_profile="official")

    for task in ("action", "query", "authority", "domain", "title", "read_url"):
        for th in (False, True):
            add("task_%s_%s" % (task, "think" if th else "chat"),
                [s("sys"), u("https://example.invalid/page"), a("prev", "pr"), u("classify this")],
                thinking=th, task=task)
    add("task_then_assistant", [u("classify"), a("label", "should not show")], thinking=True, task="title")
    add("task_on_developer", [u("x"), dev("dev classify")], thinking=True, task="domain")
    add("task_lost_in_merge", [u("q"), a("", None, [tc("t1", "get_time", "{}")]), tool("t1", "r"),
                               u("follow-up")], TOOLS, thinking=True, task="action")

    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number", "default": 0.5}}}}}
    add("response_format_system", [s("sys"), u("answer in json")], response_format=rf)
    add("response_format_no_system", [u("answer in json")], thinking=True, response_format=rf)
    add("response_format_with_tools", [u("answer in json")], TOOLS[:1], response_format={"type": "json_object"})
    add("response_format_empty", [u("x")], response_format={})

    return cases


# ---------------------------------------------------------------------------
# Conversations drawn at random (fixed seed).

def random_cases(n, seed):
    rng = random.Random(seed)
    cases = []
    call_no = [0]

    def text():
        return rng.choice(TEXTS)

    def content(t):
        r = rng.random()
        if r < 0.08:
            return None
        if r < 0.16:
            words = t.split(" ")
            cut = rng.randint(0, len(words))
            parts = [" ".join(words[:cut]), " ".join(words[cut:])]
            return [{"type": "text", "text": p} for p in parts]
        return t

    for i in range(n):
        use_tools = rng.random() < 0.55
        tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS))) if use_tools else None
        names = [t["function"]["name"] for t in (tools or TOOLS)]
        msgs = []
        if rng.random() < 0.7:
            msgs.append({"role": "system", "content": content(rng.choice(SYSTEMS))})
        if rng.random() < 0.1:
            msgs.append({"role": "developer", "content": rng.choice(["Use metric units.", "Reply in JSON."])})
        turns = rng.randint(1, 4)
        for t in range(turns):
            msgs.append({"role": "user", "content": content(text())})
            if rng.random() < 0.12:
                msgs.append({"role": "latest_reminder", "content": rng.choice(["Today is 2026-01-01.", "Be brief."])})
            last = t == turns - 1
            if last and rng.random() < 0.6:
                break
            rounds = rng.randint(1, 2) if (use_tools or rng.random() < 0.1) and rng.random() < 0.7 else 0
            if rounds == 0:
                am = {"role": "assistant", "content": content(rng.choice(ANSWERS))}
                if rng.random() < 0.7:
                    am["reasoning_content"] = rng.choice(REASONINGS)
                msgs.append(am)
                continue
            for r in range(rounds):
                calls = []
                for _ in range(rng.randint(1, 3)):
                    call_no[0] += 1
                    cid = "call_%04d" % call_no[0] if rng.random() < 0.9 else None
                    args = rng.choice(ARGS) if rng.random() < 0.9 else rng.choice(ARG_OBJECTS)
                    calls.append(tc(cid, rng.choice(names), args))
                am = {"role": "assistant", "content": rng.choice(ANSWERS) if rng.random() < 0.4 else None,
                      "tool_calls": calls}
                if rng.random() < 0.7:
                    am["reasoning_content"] = rng.choice(REASONINGS)
                msgs.append(am)
                order = list(range(len(calls)))
                if rng.random() < 0.4:
                    rng.shuffle(order)
                for k in order:
                    tm = {"role": "tool", "content": rng.choice(TOOL_RESULTS)}
                    if calls[k].get("id") is not None:
                        tm["tool_call_id"] = calls[k]["id"]
                    msgs.append(tm)
            if not last or rng.random() < 0.5:
                am = {"role": "assistant", "content": rng.choice(ANSWERS)}
                if rng.random() < 0.5:
                    am["reasoning_content"] = rng.choice(REASONINGS)
                msgs.append(am)

        opts = {"thinking": rng.random() < 0.5}
        if rng.random() < 0.2:
            opts["keep_reasoning"] = True
        if rng.random() < 0.05:
            opts["no_bos"] = True
        if rng.random() < 0.25:
            prof = rng.choice(["preview", "official"])
            opts["effort_profile"] = prof
            opts["reasoning_effort"] = rng.choice([None, "high", "max"] if prof == "preview"
                                                  else [None, "low", "high", "max"])
        if msgs[-1]["role"] == "assistant" and "tool_calls" not in msgs[-1] and rng.random() < 0.3:
            opts["continue_final"] = True
        if rng.random() < 0.05:
            opts["task"] = rng.choice(["action", "query", "title"])
        cases.append(("random_%03d" % i, msgs, tools, opts))
    return cases


def full_options(opts):
    return {
        "thinking": bool(opts.get("thinking")),
        "keep_reasoning": bool(opts.get("keep_reasoning")),
        "no_bos": bool(opts.get("no_bos")),
        "continue_final": bool(opts.get("continue_final")),
        "reasoning_effort": opts.get("reasoning_effort"),
        "effort_profile": opts.get("effort_profile", "preview"),
        "task": opts.get("task"),
        "response_format": opts.get("response_format"),
    }


def build(enc, tokenizers):
    tok = tokenizers.Tokenizer.from_file(TOKENIZER)
    lines = []
    for name, messages, tools, opts in handwritten() + random_cases(220, 20260401):
        opts = full_options(opts)
        prompt = run_official(enc, messages, tools, opts)
        ids = tok.encode(prompt, add_special_tokens=False).ids
        rec = {"name": name, "messages": messages, "tools": tools, "options": opts,
               "prompt": prompt, "ids": ids}
        lines.append(json.dumps(rec, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", metavar="PATH", help="compare with PATH instead of writing")
    args = ap.parse_args()
    enc, tokenizers = load_reference()
    if not os.path.isfile(TOKENIZER):
        print("SKIP: %s is missing" % TOKENIZER, file=sys.stderr)
        return SKIP
    text = build(enc, tokenizers)
    n = text.count("\n")
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            old = f.read()
        if old != text:
            old_lines, new_lines = old.split("\n"), text.split("\n")
            for i, (x, y) in enumerate(zip(old_lines, new_lines)):
                if x != y:
                    print("line %d differs: %s" % (i + 1, y[:200]), file=sys.stderr)
                    break
            else:
                print("line counts differ: %d vs %d" % (len(old_lines), len(new_lines)), file=sys.stderr)
            print("FAIL: %s is not what the reference encoder gives; rerun make_chat_golden.py"
                  % args.check, file=sys.stderr)
            return 1
        print("ok: %d conversations match the reference encoder" % n)
        return 0
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %d conversations to %s" % (n, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
