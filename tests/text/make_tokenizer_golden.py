#!/usr/bin/env python3
"""Write tests/text/golden/tokenizer-corpus.jsonl.gz: strings and the ids the
reference tokenizer (the `tokenizers` package from PyPI) gives them with the
DeepSeek-V4 tokenizer shipped in data/tokenizer/deepseek-v4/.

The strings are generated deterministically (seeded PRNG over the fragments
below): English prose, code in several languages, Chinese, Japanese kana,
Korean, emoji (ZWJ sequences, flags, skin tones, keycaps), numbers of every
length and several scripts, whitespace runs (tabs, CR, LF, CRLF, NBSP,
ideographic space, NEL, LS), mixed scripts with combining marks, punctuation
soups, random code points of every plane (including ones assigned in recent
Unicode versions), texts of tens of KB, strings holding special-token text,
and byte strings that are not valid UTF-8.

Each line is a JSON object:
  "cat"   category name
  "t"     the text (for byte strings: the bytes decoded with errors="replace",
          which is what a caller hands the reference)
  "b"     hex of the raw bytes, only for byte strings
  "ids"   encode(t) with added tokens recognised (the reference's default)
  "plain" encode(t) with no added tokens (added_tokens removed), only where
          it differs from "ids"

Usage: tests/text/make_tokenizer_golden.py [N]       write the corpus (N strings)
       tests/text/make_tokenizer_golden.py --check   re-encode the committed corpus
                                                     with the reference and compare
Runs under /opt/textenv/bin/python when this Python lacks `tokenizers`; exits
77 (meson's "skipped") when neither has it.
"""
import gzip
import json
import os
import random
import sys

VENV_PYTHON = "/opt/textenv/bin/python"
try:
    from tokenizers import Tokenizer
    import tokenizers
except ImportError:
    if os.path.exists(VENV_PYTHON) and os.path.realpath(sys.prefix) != os.path.realpath("/opt/textenv"):
        os.execv(VENV_PYTHON, [VENV_PYTHON] + sys.argv)
    print("SKIP: the Python package `tokenizers` is missing "
          "(python3 -m venv /opt/textenv && /opt/textenv/bin/pip install tokenizers)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKJSON = os.path.join(ROOT, "data", "tokenizer", "deepseek-v4", "tokenizer.json")
OUT = os.path.join(ROOT, "tests", "text", "golden", "tokenizer-corpus.jsonl.gz")

PROSE = """The quick brown fox jumps over the lazy dog. It's a truth universally acknowledged
that a single man in possession of a good fortune must be in want of a wife. I'll never forget
the day we moved; we'd packed everything, and they'd promised to help, but nobody came. You're
right: the results weren't what we'd hoped for. Dr. Smith (who has worked at the U.N. since
1998) said, "We can't keep doing this." The model's accuracy rose from 71.3% to 84.9% after
fine-tuning -- a remarkable jump! Meanwhile, prices rose by $3.50/gal in Q3 2024. Isn't it
strange? Yes... no... maybe. E-mail me at someone@example.com or visit https://example.org/a/b?c=d&e=f#g.
Serving large language models efficiently requires careful batching, caching and scheduling.
Disaggregating prefill from decode lets each phase run on hardware sized for it. When a request
is aborted, every page it owned must be reclaimed exactly once; otherwise memory leaks, or worse,
a page is reused while a transfer into it is still in flight.""".split()

SENTENCES = [
    "Hello, world!", "How are you doing today?", "This is a test.", "I don't know.",
    "She said: 'Never again.'", "Wait—what?", "The end.", "O'Reilly's book costs £40 or €45.",
    "naïve café coöperation résumé jalapeño façade", "Straße, Ökonomie, Übermensch, Ärger",
    "ALL CAPS SENTENCE HERE", "camelCaseIdentifier and snake_case_identifier and SCREAMING_CASE",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal.",
]

CODE = [
    'int main(int argc, char **argv)\n{\n    printf("hello %s\\n", argv[0]);\n    return 0;\n}\n',
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }\n",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n",
    "import numpy as np\nx = np.arange(10)[::2] ** 2  # squares\nprint(f\"{x!r:>20}\")\n",
    "const add = (a, b) => a + b;\nexport default function App() {\n  return <div className=\"app\">{items.map(i => <Item key={i.id} {...i} />)}</div>;\n}\n",
    "fn main() {\n    let v: Vec<u8> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "impl<'a, T: Clone + Send> Iterator for Foo<'a, T> where T: 'static {\n    type Item = &'a T;\n}\n",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tif err := s.do(r); err != nil {\n\t\thttp.Error(w, err.Error(), 500)\n\t}\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 3;\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; more</title></head>\n<body><p>Hi&nbsp;there</p></body>\n</html>\n",
    '{"name": "duet", "version": "0.1.0", "deps": ["pcre2", "jansson"], "nested": {"a": [1, 2.5, -3e10, true, null]}}\n',
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"${f%.txt}\" | tr 'a-z' 'A-Z' >> out.log 2>&1\ndone\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\sum_{i=1}^{n} x_i^2 \\leq \\int_0^\\infty e^{-x}\\,dx\n\\end{equation}\n",
    "    if (x != y && (z || !w)) { a[i++] = b[--j]; c <<= 2; d >>= 3; e ^= ~f; }\n",
    "// TODO(someone): fix this\n/* multi\n * line\n */\n",
    "diff --git a/x.c b/x.c\n@@ -1,3 +1,4 @@\n-old line\n+new line\n+another\n context\n",
]

CHINESE = [
    "我们今天去公园散步，天气非常好。", "大型语言模型的推理服务需要高效的调度与缓存。",
    "这是一个测试句子，包含标点符号：逗号、句号。还有问号？", "毕老师！", "深度求索发布了新的模型。",
    "中华人民共和国成立于一九四九年。", "请把文件发到我的邮箱，谢谢！", "繁體中文也應該正確處理：臺灣、香港。",
    "《红楼梦》是中国古典小说的巅峰之作。", "人工智能（AI）正在改变世界。", "龘靐齉爩鱻麤龖",
]
JAPANESE = [
    "こんにちは、世界！", "今日はいい天気ですね。", "カタカナとひらがなを混ぜて書きます。",
    "東京タワーへ行きましょう。", "ｶﾀｶﾅの半角もあります。", "ゟ゠ヿ・ーヽヾゝゞ", "私はコーヒーが好きです。",
    "ラーメン、寿司、天ぷら", "ありがとうございました！",
]
KOREAN = [
    "안녕하세요, 세계!", "오늘 날씨가 정말 좋네요.", "한국어 텍스트도 올바르게 처리해야 합니다.",
    "대한민국의 수도는 서울입니다.", "ㄱㄴㄷㄹ ㅏㅑㅓㅕ",
]
OTHER_SCRIPTS = [
    "Привет, мир! Как дела?", "Ελληνικά: Καλημέρα κόσμε.", "مرحبا بالعالم! كيف حالك؟", "שלום עולם",
    "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก", "ሰላም ልዑል", "Բարեւ աշխարհ", "გამარჯობა",
    "Tiếng Việt có dấu: Người ta nói rằng", "Zażółć gęślą jaźń", "Çok güzel bir gün!",
    "e\u0301 a\u0308 n\u0303 o\u0327\u0301 Z\u0351\u0352\u0353\u0354", "\u0915\u094d\u0937", "ﬁﬂ ﬀ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥 𝐁𝐨𝐥𝐝", "ᚠᚢᚦᚨᚱᚲ", "Ⅻ Ⅳ ⅷ", "ꙮ",
]
EMOJI = [
    "😀", "😂🤣", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🏴‍☠️", "🇫🇷🇯🇵🇺🇸🇨🇳", "1️⃣#️⃣*️⃣", "❤️", "☺︎",
    "🧑‍🤝‍🧑", "🫠🫡🫶", "🐈‍⬛", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✈️🚀🛸", "🤷‍♀️", "👁️‍🗨️", "🎉🎊🎈", "🙏🏻🙏🏿",
]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("、。，．：；！？「」『』（）【】〔〕《》〈〉…‥—–‐·•※§¶†‡°′″‰‱€£¥₩₹¢¤©®™℃℉←→↑↓⇒⇔∀∃∈∉∑∏√∞≈≠≤≥⊂⊃∩∪") + ["\u00bf", "\u00a1", "\u2018", "\u2019", "\u201c", "\u201d", "\u00ab", "\u00bb"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", "\u00a0",
          "\u3000", "\u2028", "\u2029", "\x0b", "\x0c", "\x85", "\u2009", "\u200b", "\ufeff", " \t \n"]
DIGIT_SETS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹¼½¾",
              "①②③④⑤", "〇一二三"]


def load(tokjson, added):
    j = json.load(open(tokjson, encoding="utf-8"))
    if not added:
        j["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(j))


def check():
    """The committed ids are the reference's, both ways."""
    tok, plain = load(TOKJSON, True), load(TOKJSON, False)
    ok = bad = 0
    with gzip.open(OUT, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            rec = json.loads(line)
            ids = tok.encode(rec["t"], add_special_tokens=False).ids
            p = plain.encode(rec["t"], add_special_tokens=False).ids
            good = ids == rec["ids"] and p == rec.get("plain", rec["ids"])
            if "b" in rec:
                good = good and bytes.fromhex(rec["b"]).decode("utf-8", "replace") == rec["t"]
            if not good and bad < 10:
                print(f"record {i} ({rec['cat']}): the reference now gives other ids")
            ok += good
            bad += not good
    print(f"tokenizer golden vs tokenizers {tokenizers.__version__}: {ok} passed, {bad} failed")
    return 1 if bad or ok < 10000 else 0


def main():
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    n_target = int(sys.argv[1]) if len(sys.argv) > 1 else 10500
    tok, plain = load(TOKJSON, True), load(TOKJSON, False)
    added = [a["content"] for a in json.load(open(TOKJSON, encoding="utf-8"))["added_tokens"]]
    r = random.Random(20240601)

    def words(k):
        return " ".join(r.choice(PROSE) for _ in range(k))

    def rand_cp(planes=True):
        while True:
            c = r.randrange(0x110000 if planes else 0x3000)
            if not 0xD800 <= c < 0xE000 and c:
                return chr(c)

    def number():
        k = r.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 33, 40])
        ds = DIGIT_SETS[0] if r.random() < 0.75 else r.choice(DIGIT_SETS)
        s = "".join(r.choice(ds) for _ in range(k))
        form = r.randrange(6)
        if form == 1:
            s = "-" + s + "." + "".join(r.choice(ds) for _ in range(r.randrange(1, 6)))
        elif form == 2:
            s = f"{int(s) if s.isascii() else 7:,}"
        elif form == 3:
            s = s + "e" + str(r.randrange(-30, 30))
        elif form == 4:
            s = "v" + ".".join(str(r.randrange(100)) for _ in range(3))
        return s

    def prose():
        s = words(r.randrange(3, 40))
        if r.random() < 0.3:
            s += " " + r.choice(SENTENCES)
        if r.random() < 0.2:
            s = s.capitalize()
        if r.random() < 0.1:
            s = s.upper()
        return s

    def code():
        s = "".join(r.choice(CODE) for _ in range(r.randrange(1, 4)))
        if r.random() < 0.3:
            s = s.replace("    ", "\t")
        if r.random() < 0.2:
            s = s.replace("\n", "\r\n")
        return s

    def cjk():
        pool = r.choice([CHINESE, JAPANESE, KOREAN, CHINESE + JAPANESE])
        s = "".join(r.choice(pool) for _ in range(r.randrange(1, 6)))
        if r.random() < 0.3:
            s += " " + prose() + " " + r.choice(pool)
        return s

    def emoji():
        return "".join(r.choice(EMOJI) + (r.choice(["", " ", "", words(1)])) for _ in range(r.randrange(1, 8)))

    def numbers():
        return " ".join(number() for _ in range(r.randrange(1, 8))) + r.choice(["", ".", " items", "%", "px"])

    def whitespace():
        parts = []
        for _ in range(r.randrange(1, 10)):
            parts.append("".join(r.choice(SPACES) for _ in range(r.randrange(1, 5))))
            if r.random() < 0.7:
                parts.append(r.choice([words(1), number(), r.choice(PUNCT), r.choice(CHINESE)[:2], r.choice(EMOJI)]))
        return "".join(parts)

    def mixed():
        gens = [prose, cjk, emoji, numbers, lambda: r.choice(OTHER_SCRIPTS), lambda: r.choice(SENTENCES)]
        return r.choice(["", " ", "\n"]).join(r.choice(gens)() for _ in range(r.randrange(2, 6)))

    def punct():
        return "".join(r.choice(PUNCT) + (r.choice(SPACES) if r.random() < 0.1 else "") +
                       (words(1) if r.random() < 0.1 else "") for _ in range(r.randrange(1, 30)))

    def random_unicode():
        out = []
        for _ in range(r.randrange(1, 30)):
            x = r.random()
            if x < 0.4:
                out.append(rand_cp(True))
            elif x < 0.7:
                out.append(rand_cp(False))
            elif x < 0.8:
                out.append(r.choice(SPACES))
            else:
                out.append(r.choice(PUNCT + EMOJI + [words(1)]))
        return "".join(out)

    def special():
        toks = added if r.random() < 0.5 else [a for a in added if "place▁holder" not in a]
        parts = []
        for _ in range(r.randrange(1, 8)):
            t = r.choice(toks)
            x = r.random()
            if x < 0.15:
                t = t[:r.randrange(1, len(t))]            # a prefix of a token
            elif x < 0.25:
                t = t[r.randrange(1, len(t)):]            # a suffix
            elif x < 0.3:
                t = t + t                                 # doubled
            parts.append(t)
            parts.append(r.choice(["", "", " ", "\n", words(1), " " + words(2) + " ", r.choice(CHINESE)]))
        return "".join(parts)

    def dsml():
        name = r.choice(["get_weather", "search", "run_code"])
        return ("<｜User｜>" + prose() + "<｜Assistant｜>" + r.choice(["<think>", "</think>"]) + prose() +
                "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"" + name + "\">\n"
                "<｜DSML｜parameter name=\"q\" string=\"true\">" + mixed() + "</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"n\" string=\"false\">" + number() + "</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>")

    def long_text():
        target = r.randrange(10_000, 60_000)
        gens = [prose, code, cjk, mixed, whitespace, numbers]
        s = []
        size = 0
        while size < target:
            x = r.choice(gens)()
            s.append(x)
            size += len(x.encode())
        return "\n".join(s)

    def long_run():
        x = r.random()
        k = r.randrange(100, 5000)
        if x < 0.25:
            return " " * k + "x"
        if x < 0.5:
            return r.choice(CHINESE[0]) * (k // 3)
        if x < 0.75:
            return "a" * k
        return "".join(r.choice("0123456789") for _ in range(k))

    def bad_bytes():
        pieces = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                  b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff", b"\xfe", b"\xe2\x82",
                  b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3", b"\xe3\x81", b"\xef\xbf\xbd", b"\xe2\x82\xac",
                  b"\xf0\x9f\x98\x80", b"\xc3\xa9", b"\x00"]
        out = b""
        for _ in range(r.randrange(1, 12)):
            x = r.random()
            if x < 0.4:
                out += r.choice(pieces)
            elif x < 0.6:
                out += bytes(r.randrange(256) for _ in range(r.randrange(1, 6)))
            else:
                out += r.choice([words(1), " ", "\n", r.choice(CHINESE), r.choice(EMOJI)]).encode()
        return out

    plan = [("prose", prose, 1600), ("code", code, 900), ("cjk", cjk, 1200), ("emoji", emoji, 600),
            ("numbers", numbers, 800), ("whitespace", whitespace, 1000), ("mixed", mixed, 1200),
            ("punct", punct, 700), ("unicode", random_unicode, 1000), ("special", special, 700),
            ("dsml", dsml, 200), ("long", long_text, 24), ("longrun", long_run, 40), ("bytes", bad_bytes, 500)]
    scale = n_target / sum(k for _, _, k in plan)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    n = 0
    raw = 0
    with gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as gz:
        for cat, gen, k in plan:
            for _ in range(max(1, round(k * scale)) if cat not in ("long", "longrun") else k):
                rec = {"cat": cat}
                x = gen()
                if isinstance(x, bytes):
                    rec["b"] = x.hex()
                    x = x.decode("utf-8", "replace")
                rec["t"] = x
                rec["ids"] = tok.encode(x, add_special_tokens=False).ids
                p = plain.encode(x, add_special_tokens=False).ids
                if p != rec["ids"]:
                    rec["plain"] = p
                line = json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n"
                gz.write(line.encode("utf-8"))
                raw += len(x.encode("utf-8"))
                n += 1
    print(f"make_tokenizer_golden: {n} strings, {raw} bytes of text, tokenizers {tokenizers.__version__} "
          f"-> {os.path.relpath(OUT, ROOT)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
