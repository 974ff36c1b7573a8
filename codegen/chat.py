"""A model's chat template, decomposed into the fixed strings the runtime pastes around turns.

The C runtime cannot run Jinja, so at build time the model's own chat_template (from
tokenizer_config.json) is rendered here, in the same sandboxed Jinja2 environment transformers
uses (trim_blocks, lstrip_blocks, loopcontrols, tojson, raise_exception, strftime_now), on small
conversations whose contents are sentinel strings. Splitting the output at the sentinels yields
ChatStrings; then several ordinary multi-turn conversations, with and without a system message,
are rendered both directly and by re-assembling the pieces (ChatStrings.render), and must match
byte for byte. A template whose output depends on the content or on the position of a turn in
ways the pieces cannot express fails there with a ChatError naming the model.

The conversation shape the pieces describe:

    start of the conversation   bos  (the template's bos_token when it writes it first, else "")
    with a system message S     system_prefix + S + system_suffix  (+ user_prefix, see below)
    without one                 no_system_prefix  (any default system block)
    each user turn U            user_prefix + U + user_suffix
    each assistant turn A       assistant_prefix + assistant_lead + A + assistant_suffix
    to let the model speak      assistant_prefix   (the generation prompt)

system_in_first_user: Llama-2 style templates fold the system message into the first user turn
("<s>[INST] <<SYS>>\\nS\\n<</SYS>>\\n\\nU [/INST]"); then system_prefix already contains the first
user_prefix and the first user turn is pasted without one. has_system is False when the template
refuses a system message (Mistral-7B-Instruct-v0.2 raises) or silently drops it.

assistant_lead is text the template writes between the generation prompt and the content of a
past assistant turn that the model is expected to produce itself (" " for [INST] templates, whose
models start every answer with a space); the runtime, which keeps the generated tokens, needs it
only to re-render history.

Determinism: strftime_now (used by Llama-3.2's template for "Today Date") returns a fixed date,
26 Jul 2024 by default (the date Llama-3.1's template hard-codes), because the strings are baked
into a binary at build time, where "today" would be the build date anyway and would make the
generated sources differ between builds. Pass now= to override.

Content is pasted verbatim; templates that strip or trim the content (Llama-2, Llama-3) agree with
the pieces for content without leading or trailing whitespace, which is what the checks use.
"""

import json
import os
import pickle
import resource
import select
import signal
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .spec import parse_json

FIXED_NOW = datetime(2024, 7, 26)

# Sentinel contents for the decomposition: plain ASCII (they survive trim, strip and tojson) that
# no real template contains.
SENTINEL = {"system": "@@SYSTEM@@", "user": "@@USER{}@@", "assistant": "@@ASSISTANT{}@@"}

# Ordinary contents for the check: inner spaces, newlines, punctuation, non-ASCII, no leading or
# trailing whitespace (see the module comment).
CHECK_SYSTEM = "You are a terse assistant.\nAnswer in one line."
CHECK_TURNS = ["Hi! What is 2 + 2?", "2 + 2 = 4.", "And in French, s'il vous plaît?",
               "Quatre.\n\nAnything else?", "No, thanks: that's all.", "Bye then."]


# Bytes of fixed text a template may write around the turns (the pieces pasted into the binary):
# real templates write well under a few KiB, a long default system prompt included.
CHAT_STRINGS_MAX = 1 << 16


class ChatError(Exception):
    """The template of a model cannot be decomposed; the message is one line naming the model."""


@dataclass(frozen=True)
class ChatStrings:
    name: str                       # the model, for messages and the generated banner
    bos: str                        # bos_token text the template starts with, or ""
    has_system: bool                # False: the template refuses or drops system messages
    system_in_first_user: bool      # the system block sits inside the first user turn
    system_prefix: str              # conversation start when a system message is given
    system_suffix: str
    no_system_prefix: str           # conversation start when none is given
    default_system: str | None      # what the template injects as system content when none is
                                    # given (None: it injects no system block)
    user_prefix: str
    user_suffix: str
    assistant_prefix: str           # the generation prompt
    assistant_lead: str             # see the module comment; usually ""
    assistant_suffix: str           # after an assistant turn in the history
    end_of_turn: str | None = None  # the token the assistant ends its turn with (from the suffix)
    stop_token_ids: tuple = field(default_factory=tuple)   # ids that end generation, ascending
    stop_tokens: tuple = field(default_factory=tuple)     # their token strings, same order

    def render(self, messages: list, add_generation_prompt: bool) -> str:
        """The conversation re-assembled from the pieces, as the runtime will paste it."""
        out = [self.bos]
        msgs = list(messages)
        first_user_prefix = self.user_prefix
        if msgs and msgs[0]["role"] == "system":
            if not self.has_system:
                raise ChatError(f"{self.name}: the chat template has no system role")
            out.append(self.system_prefix + msgs[0]["content"] + self.system_suffix)
            if self.system_in_first_user:
                first_user_prefix = ""
            msgs = msgs[1:]
        else:
            out.append(self.no_system_prefix)
        for i, m in enumerate(msgs):
            if m["role"] == "user":
                out.append((first_user_prefix if i == 0 else self.user_prefix) + m["content"]
                           + self.user_suffix)
            elif m["role"] == "assistant":
                out.append(self.assistant_prefix + self.assistant_lead + m["content"]
                           + self.assistant_suffix)
            else:
                raise ChatError(f"{self.name}: role {m['role']!r} at turn {i}: "
                                        "expected user or assistant")
        if add_generation_prompt:
            out.append(self.assistant_prefix)
        return "".join(out)


# ------------------------------------------------------------------------------------------------
# The Jinja environment transformers renders chat templates in

class _GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant text with it for
    training masks; for rendering it is transparent."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def compile_template(source: str, now: datetime = FIXED_NOW) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env.from_string(source)


# ------------------------------------------------------------------------------------------------
# Decomposition

def _conv(*roles, system=False):
    """A conversation of sentinel contents: roles 'u'/'a', numbered from 1."""
    msgs = [{"role": "system", "content": SENTINEL["system"]}] if system else []
    for i, r in enumerate(roles, 1):
        role = {"u": "user", "a": "assistant"}[r]
        msgs.append({"role": role, "content": SENTINEL[role].format(i)})
    return msgs


def decompose(template: str, name: str, special_tokens: dict,
              now: datetime = FIXED_NOW) -> ChatStrings:
    """ChatStrings for a chat template, checked by re-assembly. special_tokens holds the variables
    transformers passes besides the messages (bos_token, eos_token, ...)."""
    try:
        tmpl = compile_template(template, now)
    except TemplateError as e:
        raise ChatError(f"{name}: chat template does not compile: {e}") from None

    def render(msgs, gen):
        try:
            return tmpl.render(messages=msgs, add_generation_prompt=gen, tools=None,
                               documents=None, **special_tokens)
        except TemplateError as e:
            shape = "/".join(m["role"] for m in msgs)
            raise ChatError(f"{name}: chat template fails on a {shape} conversation: {e}") from None
        except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError) as e:
            # the template's own code failed (1/0, a string plus a number...): the template's fault
            shape = "/".join(m["role"] for m in msgs)
            raise ChatError(f"{name}: chat template fails on a {shape} conversation: {type(e).__name__}: {e}") from None

    def cut(msgs, gen):
        """The rendered text split at the contents: len(msgs) + 1 segments."""
        text = render(msgs, gen)
        segs = []
        for m in msgs:
            head, sep, text = text.partition(m["content"])
            if not sep or m["content"] in text:
                raise ChatError(f"{name}: chat template does not render the {m['role']} "
                                "content exactly once, verbatim")
            segs.append(head)
        return segs + [text]

    def fail(what):
        raise ChatError(f"{name}: chat template cannot be decomposed into fixed strings: {what}")

    p0, user_suffix = cut(_conv("u"), False)
    p0g, tail = cut(_conv("u"), True)
    if p0g != p0 or not tail.startswith(user_suffix):
        fail("the generation prompt changes the user turn")
    assistant_prefix = tail[len(user_suffix):]
    _, ua, assistant_suffix = cut(_conv("u", "a"), False)
    _, ua2, au, _ = cut(_conv("u", "a", "u"), True)
    if ua2 != ua or not ua.startswith(user_suffix):
        fail("a user turn followed by an assistant turn ends differently from a last user turn")
    history_prefix = ua[len(user_suffix):]
    if not history_prefix.startswith(assistant_prefix):
        fail(f"assistant turns in the history start with {history_prefix!r}, "
             f"not with the generation prompt {assistant_prefix!r}")
    if not au.startswith(assistant_suffix):
        fail("an assistant turn followed by a user turn ends differently from a last one")
    user_prefix = au[len(assistant_suffix):]
    if not p0.endswith(user_prefix):
        fail(f"the first user turn does not start with the user prefix {user_prefix!r}")
    no_system_prefix = p0[:len(p0) - len(user_prefix)]

    has_system, folded, system_prefix, system_suffix, default_system = False, False, "", "", None
    sys_msgs = _conv("u", system=True)
    try:
        text = render(sys_msgs, False)
    except ChatError:
        text = None  # the template refuses a system message (raise_exception)
    if text is not None and SENTINEL["system"] in text:
        has_system = True
        system_prefix, between, _ = cut(sys_msgs, False)
        if between.endswith(user_prefix):
            system_suffix = between[:len(between) - len(user_prefix)]
        else:
            folded, system_suffix = True, between
        n = len(system_prefix) + len(system_suffix)
        if (not folded and len(no_system_prefix) >= n and no_system_prefix.startswith(system_prefix)
                and no_system_prefix.endswith(system_suffix)):
            default_system = no_system_prefix[len(system_prefix):len(no_system_prefix)
                                              - len(system_suffix)]

    # The BOS the template writes by name (bos_token) before the first turn leads the conversation
    # as its own piece, so the runtime can put it as a token id. A literal "<|im_start|>" that
    # happens to equal bos_token (SmolLM2) is not it (told apart by rendering with a sentinel
    # bos_token), nor is a BOS written into every user turn (Llama-2: it stays in user_prefix).
    bos = special_tokens.get("bos_token") or ""
    if bos:
        probe = dict(special_tokens, bos_token="@@BOS@@")
        first = tmpl.render(messages=_conv("u"), add_generation_prompt=False, tools=None,
                            documents=None, **probe)
        if (not first.startswith("@@BOS@@") or not no_system_prefix.startswith(bos)
                or (has_system and not system_prefix.startswith(bos))):
            bos = ""
        no_system_prefix = no_system_prefix[len(bos):]
        if has_system:
            system_prefix = system_prefix[len(bos):]

    cs = ChatStrings(name=name, bos=bos, has_system=has_system, system_in_first_user=folded,
                     system_prefix=system_prefix, system_suffix=system_suffix,
                     no_system_prefix=no_system_prefix, default_system=default_system,
                     user_prefix=user_prefix, user_suffix=user_suffix,
                     assistant_prefix=assistant_prefix,
                     assistant_lead=history_prefix[len(assistant_prefix):],
                     assistant_suffix=assistant_suffix)
    fixed = sum(len(getattr(cs, f).encode()) for f in _STRING_FIELDS) + len((default_system or "").encode())
    if fixed > CHAT_STRINGS_MAX:
        raise ChatError(f"{name}: chat template writes {fixed} bytes of fixed text around the turns, "
                        f"more than {CHAT_STRINGS_MAX}")
    _check(cs, render)
    return cs


def check_conversations(has_system: bool) -> list:
    """(messages, add_generation_prompt) pairs the decomposition must reproduce: 1 to 3 exchanges,
    ending on a user turn (with and without the generation prompt) or on an assistant turn, with
    and without a system message."""
    convs = []
    systems = [False, True] if has_system else [False]
    for with_system in systems:
        head = [{"role": "system", "content": CHECK_SYSTEM}] if with_system else []
        for n in range(1, len(CHECK_TURNS) + 1):
            msgs = head + [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                           for i, c in enumerate(CHECK_TURNS[:n])]
            convs.append((msgs, False))
            if n % 2 == 1:
                convs.append((msgs, True))
    return convs


def _check(cs: ChatStrings, render) -> None:
    for msgs, gen in check_conversations(cs.has_system):
        want = render(msgs, gen)
        got = cs.render(msgs, gen)
        if got != want:
            i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b),
                     min(len(got), len(want)))
            shape = "/".join(m["role"] for m in msgs) + ("+prompt" if gen else "")
            raise ChatError(
                f"{cs.name}: chat template depends on the content or position of turns: "
                f"a {shape} conversation renders {want[i:i + 40]!r} at offset {i} where the "
                f"fixed strings give {got[i:i + 40]!r}")


# ------------------------------------------------------------------------------------------------
# A model directory

def _token_content(t):
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts; anything else
    is no token (as runtime/chat_template.c reads it)."""
    t = t.get("content") if isinstance(t, dict) else t
    return t if isinstance(t, str) else None


def _ids(value) -> list:
    """The ids of an eos_token_id value (an id or a list of them); what is not an id (an integer in
    0..2^31-1) is skipped, as runtime/chat_template.c skips it."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31]


def _load_json(path: Path) -> dict:
    try:
        value = parse_json(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:
        raise ChatError(f"{path}: unreadable ({e})") from None
    if not isinstance(value, dict):
        raise ChatError(f"{path}: expected a JSON object")
    return value


def token_table(model_dir: Path) -> dict:
    """{token string: id} for the added tokens, from tokenizer.json or else tokenizer_config.json."""
    def is_id(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31

    tok = _load_json(model_dir / "tokenizer.json")
    if tok.get("added_tokens") and isinstance(tok["added_tokens"], list):
        return {a["content"]: a["id"] for a in tok["added_tokens"]
                if isinstance(a, dict) and isinstance(a.get("content"), str) and is_id(a.get("id"))}
    decoder = _load_json(model_dir / "tokenizer_config.json").get("added_tokens_decoder")
    return {v["content"]: int(k) for k, v in (decoder.items() if isinstance(decoder, dict) else ())
            if k.isdigit() and is_id(int(k)) and isinstance(v, dict) and isinstance(v.get("content"), str)}


def load_chat_strings(model_dir: str | Path, name: str | None = None,
                      now: datetime = FIXED_NOW) -> ChatStrings | None:
    """ChatStrings for an HF model directory, with the stop tokens filled in: every eos_token_id of
    config.json and generation_config.json, plus the end-of-turn token (the special token the
    assistant suffix starts with, e.g. <|im_end|>, <|eot_id|>, </s>).

    None when the directory has no chat template (no tokenizer_config.json, or one without
    chat_template: a base model, or a config-only test model); the caller decides what chat means
    then."""
    model_dir = Path(model_dir)
    name = name or model_dir.resolve().name
    tc = _load_json(model_dir / "tokenizer_config.json")
    template = tc.get("chat_template")
    if isinstance(template, list):  # [{name, template}]: transformers uses "default"
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if not template or not isinstance(template, str):  # as runtime/chat_template.c: no usable template
        return None
    special = {k: _token_content(tc[k]) for k in ("bos_token", "eos_token", "unk_token",
                                                   "pad_token") if _token_content(tc.get(k)) is not None}
    cs = decompose_isolated(template, name, special, now)

    table = token_table(model_dir)
    ids = set(_ids(_load_json(model_dir / "config.json").get("eos_token_id")))
    ids |= set(_ids(_load_json(model_dir / "generation_config.json").get("eos_token_id")))
    end_of_turn = next((t for t in sorted(table, key=len, reverse=True)
                        if cs.assistant_suffix.lstrip().startswith(t)), None)
    if end_of_turn is not None:
        ids.add(table[end_of_turn])
    by_id = {i: t for t, i in table.items()}
    missing = sorted(i for i in ids if i not in by_id)
    if missing:
        raise ChatError(f"{name}: stop token id {missing[0]} is not an added token of "
                                "the tokenizer")
    stop_ids = tuple(sorted(ids))
    return replace(cs, end_of_turn=end_of_turn, stop_token_ids=stop_ids,
                   stop_tokens=tuple(by_id[i] for i in stop_ids))


# ------------------------------------------------------------------------------------------------
# A model directory's template is untrusted code: rendered apart, with a deadline and a memory cap

# A real template decomposes in milliseconds and in a few MiB; one that loops for minutes or
# doubles a string into gigabytes (a namespace variable concatenated with itself in a loop: no
# sandbox hook sees Jinja's ~ or {% set %}) is refused in one line instead of hanging the build or
# exhausting the machine.
DECOMPOSE_SECONDS = 10
DECOMPOSE_MEMORY = 1 << 30  # bytes of address space beyond what the generator already maps


def _address_space() -> int:
    """This process's mapped bytes (VmSize), which the child's cap adds to."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise ChatError("cannot read VmSize from /proc/self/status to cap the chat template's memory")


def decompose_isolated(template: str, name: str, special_tokens: dict, now: datetime = FIXED_NOW,
                       seconds: float = DECOMPOSE_SECONDS, memory: int = DECOMPOSE_MEMORY) -> ChatStrings:
    """decompose() in a forked child under a deadline and an address-space cap: the result, or its
    ChatError, comes back through a pipe; running out of either is a ChatError naming the limit."""
    cap = _address_space() + memory
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            os.close(r)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            try:
                out = ("ok", decompose(template, name, special_tokens, now))
            except ChatError as e:
                out = ("error", str(e))
            except MemoryError:
                out = ("error", f"{name}: chat template needs more than {memory >> 20} MiB to render")
            data = pickle.dumps(out)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # a bug of this module, not the template's: the parent says so
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise ChatError(f"{name}: chat template takes more than {seconds:g} s to render (a loop?)")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {os.WEXITSTATUS(status)}"
        raise ChatError(f"{name}: rendering the chat template ended with {how} and no result")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise ChatError(value)
    return value


# ------------------------------------------------------------------------------------------------
# The generic build's table of known templates

# What a generic build's table holds where a template writes a special token: the runtime
# (runtime/chat_template.c) pastes in the model's own, from its tokenizer_config.json, or "" when it
# has none, as transformers renders an undefined variable.
TOKEN_PLACEHOLDERS = {"bos_token": "@@BOS_TOKEN@@", "eos_token": "@@EOS_TOKEN@@",
                      "unk_token": "@@UNK_TOKEN@@", "pad_token": "@@PAD_TOKEN@@"}

# Token sets on which pasting into the placeholders must give what rendering with the tokens gives:
# all present, some absent, none.
_CHECK_TOKENS = [
    {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    {},
]

_STRING_FIELDS = ("bos", "system_prefix", "system_suffix", "no_system_prefix", "user_prefix", "user_suffix",
                  "assistant_prefix", "assistant_lead", "assistant_suffix")


def paste_tokens(cs: ChatStrings, tokens: dict) -> ChatStrings:
    """cs with each placeholder replaced by tokens' value for it ("" when absent)."""
    def paste(s):
        for key, placeholder in TOKEN_PLACEHOLDERS.items():
            s = s.replace(placeholder, tokens.get(key) or "")
        return s
    fields = {f: paste(getattr(cs, f)) for f in _STRING_FIELDS}
    if cs.default_system is not None:
        fields["default_system"] = paste(cs.default_system)
    return replace(cs, **fields)


def required_tokens(template: str, name: str) -> tuple:
    """The special tokens without which the template fails to render (written as bos_token + ...,
    where an undefined one raises): a model lacking one cannot chat, as a specialized build of it
    cannot be generated."""
    full = _CHECK_TOKENS[0]
    out = []
    for key in TOKEN_PLACEHOLDERS:
        try:
            decompose(template, name, {k: v for k, v in full.items() if k != key})
        except ChatError:
            out.append(key)
    return tuple(out)


def decompose_with_placeholders(template: str, name: str) -> tuple:
    """(ChatStrings with placeholders for the template's special tokens, the tokens it requires): a
    generic build's table entry, checked: for every token set of _CHECK_TOKENS (with the required
    ones added), pasting the tokens in gives exactly what decompose gives with them. A template that
    treats its tokens as more than text fails the check."""
    cs = decompose(template, name, TOKEN_PLACEHOLDERS)
    required = required_tokens(template, name)
    for tokens in _CHECK_TOKENS:
        tokens = {k: _CHECK_TOKENS[0][k] for k in required} | tokens
        want = decompose(template, name, tokens)
        if paste_tokens(cs, tokens) != want:
            raise ChatError(f"{name}: with special tokens {tokens}, the chat template renders other "
                            "strings than its placeholders give")
    return cs, required


def read_template(path: Path) -> str | None:
    """The chat template of a tokenizer_config.json (as load_chat_strings picks it), or a .jinja
    file's text."""
    path = Path(path)
    if path.suffix == ".jinja":
        return path.read_text(encoding="utf-8")
    template = _load_json(path).get("chat_template")
    if isinstance(template, list):
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template or None


@dataclass(frozen=True)
class KnownTemplate:
    source: str          # where it was read, for the generated comment
    template: str        # the chat_template text, exactly
    strings: ChatStrings  # with placeholders
    required: tuple      # the special tokens it cannot render without, e.g. ("bos_token",)


def known_templates(sources: list, display=str) -> list:
    """The generic build's table: each distinct template among sources (tokenizer_config.json or
    .jinja files), in the order given, decomposed with placeholders."""
    out, seen = [], set()
    for path in sources:
        template = read_template(path)
        if template is None or template in seen:
            continue
        seen.add(template)
        strings, required = decompose_with_placeholders(template, display(Path(path)))
        out.append(KnownTemplate(display(Path(path)), template, strings, required))
    return out
