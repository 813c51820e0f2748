"""Text in and out for parity.serve: a checkpoint's Hugging Face tokenizer (tokenizer.json and
tokenizer_config.json, read with the PyPI package `tokenizers`, imported only when a checkpoint
ships one), incremental detokenization with per-token text offsets, and chat templates
rendered as transformers renders them (a jinja2 sandboxed environment with transformers'
options and globals; `jinja2` imported only when a chat request comes)."""
import datetime
import json
import os

from .protocol import ApiError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# The names transformers passes a chat template as its special_tokens_map (those set).
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


def _token_content(value):
    """A special token of tokenizer_config.json: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, the names of tokens, the ids that end
    generation, and the chat template."""

    def __init__(self, directory):
        from tokenizers import Tokenizer as HfTokenizer   # PyPI; only where a checkpoint has one
        self.directory = directory
        self.hf = HfTokenizer.from_file(os.path.join(directory, TOKENIZER_FILE))
        config = {}
        path = os.path.join(directory, CONFIG_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        self.config = config
        self.special = {name: _token_content(config.get(name)) for name in SPECIAL_NAMES}
        self.special = {k: v for k, v in self.special.items() if v is not None}
        self.bos_id = self._id(self.special.get("bos_token"))
        self.eos_id = self._id(self.special.get("eos_token"))
        # add_bos_token / add_eos_token when the config says (Llama's tokenizers), else the
        # post-processor of tokenizer.json decides (add_special_tokens=True)
        self.add_bos = config.get("add_bos_token")
        self.add_eos = config.get("add_eos_token")
        self.chat_template = config.get("chat_template")
        if isinstance(self.chat_template, list):      # named templates: the default one
            named = {t.get("name"): t.get("template") for t in self.chat_template
                     if isinstance(t, dict)}
            self.chat_template = named.get("default")
        if not isinstance(self.chat_template, str):
            self.chat_template = None
        jinja = os.path.join(directory, "chat_template.jinja")
        if self.chat_template is None and os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                self.chat_template = f.read()
        self.stop_ids = self._generation_eos(directory)
        self.byte_decoder = self._byte_decoder()
        self._compiled = None

    def _id(self, content):
        return None if content is None else self.hf.token_to_id(content)

    def _generation_eos(self, directory):
        """The ids that end a generation: generation_config.json's (or config.json's)
        eos_token_id, else the tokenizer's eos token."""
        for name in ("generation_config.json", "config.json"):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    ids = json.load(f).get("eos_token_id")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(ids, int) and not isinstance(ids, bool):
                ids = [ids]
            if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
                return sorted(set(ids))
        return [] if self.eos_id is None else [self.eos_id]

    def _byte_decoder(self):
        """For a byte-level BPE (a ByteLevel decoder): the byte of each of GPT-2's 256 stand-in
        characters, so that a token that is not whole UTF-8 can be named by its bytes."""
        decoder = json.loads(self.hf.to_str()).get("decoder") or {}
        kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
        if "ByteLevel" not in kinds:
            return None
        printable = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or
                     0xae <= b <= 0xff]
        table, extra = {}, 0
        for b in range(256):
            if b in printable:
                table[chr(b)] = b
            else:
                table[chr(256 + extra)] = b
                extra += 1
        return table

    # ---- text and ids ----

    def encode(self, text, add_special_tokens=True):
        """The token ids of `text`: with add_special_tokens, BOS (and EOS) as the tokenizer
        config says (or as tokenizer.json's post-processor adds them)."""
        if self.add_bos is None and self.add_eos is None:
            return self.hf.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id] + ids
            if self.add_eos and self.eos_id is not None:
                ids = ids + [self.eos_id]
        return ids

    def decode(self, ids, skip_special_tokens=True):
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_name(self, t):
        """A token as OpenAI's logprobs name it: its text, or "bytes:\\xNN..." where it is not
        whole UTF-8 by itself."""
        text = self.hf.decode([t], skip_special_tokens=False)
        if "\ufffd" in text and self.byte_decoder is not None:
            raw = self.token_bytes(t)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return "bytes:" + "".join("\\x%02x" % b for b in raw)
        return text

    def token_bytes(self, t):
        """The bytes of token t: a byte-level BPE's own bytes, else its text's UTF-8."""
        if self.byte_decoder is not None:
            piece = self.hf.id_to_token(t) or ""
            if piece and all(ch in self.byte_decoder for ch in piece):
                return bytes(self.byte_decoder[ch] for ch in piece)
        return self.hf.decode([t], skip_special_tokens=False).encode("utf-8")

    # ---- chat ----

    def render_chat(self, messages, add_generation_prompt, extra):
        """The prompt text of a conversation: the chat template rendered with the messages,
        add_generation_prompt, the special tokens and `extra` (chat_template_kwargs), as
        transformers' apply_chat_template renders it. ApiError 400 when the template raises."""
        if self.chat_template is None:
            raise ApiError(400, "this model has no chat template (its tokenizer_config.json has "
                           "no chat_template): use /v1/completions", "messages",
                           "no_chat_template")
        try:
            import jinja2
        except ImportError:
            raise ApiError(400, "chat templates need the PyPI package jinja2, which the server's "
                           "Python does not have (pip install jinja2)", "messages",
                           "no_jinja2") from None
        template = self._template()
        values = dict(self.special)
        values.update(extra)
        try:
            return template.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **values)
        except jinja2.exceptions.TemplateError as e:
            raise ApiError(400, "the chat template refused the messages: %s" % e,
                           "messages") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ApiError(400, "the chat template failed on the messages: %s: %s"
                           % (type(e).__name__, e), "messages") from None

    def _template(self):
        if self._compiled is None:
            self._compiled = compile_chat_template(self.chat_template)
        return self._compiled


def compile_chat_template(source):
    """A chat template compiled in an environment set up as transformers sets up its own:
    jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols
    extension, a {% generation %} block that renders its body, a tojson filter that keeps
    non-ASCII text and takes indent/separators/sort_keys, and the globals raise_exception,
    strftime_now, dict and namespace (the last two refusing underscore names)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: the body as it renders (transformers marks
        the assistant's tokens with it; a prompt needs the text alone)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [],
                                          body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class SafeDict:
        """dict(...) and dict.fromkeys(...) for templates, nothing else of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def _refuse_private(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "a chat template cannot set the attribute %r on a namespace" % name)

    class SafeNamespace(jinja2.utils.Namespace):
        """namespace(...) that refuses attributes starting with an underscore."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _refuse_private(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=SafeDict(), namespace=SafeNamespace)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ApiError(400, "this model's chat template does not compile: %s" % e, "messages",
                       "bad_chat_template") from None


class Detokenizer:
    """The text of a growing token sequence, a token at a time: `text` (what is whole so far)
    and each token's offset in it (where the text stood when the token came, OpenAI's
    text_offset). A token that ends inside a UTF-8 character adds its text with the token
    that completes it. Decoding covers a window of the last few tokens, so a token costs the
    same however long the sequence is."""

    __slots__ = ("tokenizer", "skip_special", "ids", "text", "offsets", "prefix", "read")

    def __init__(self, tokenizer, skip_special_tokens=True):
        self.tokenizer, self.skip_special = tokenizer, skip_special_tokens
        self.ids, self.text, self.offsets = [], "", []
        self.prefix = self.read = 0     # the window: ids[prefix:read] is text already out

    def add(self, t):
        """Appends token t; returns the text it made whole (maybe "")."""
        self.offsets.append(len(self.text))
        self.ids.append(t)
        dec = self.tokenizer.decode
        before = dec(self.ids[self.prefix:self.read], self.skip_special)
        after = dec(self.ids[self.prefix:], self.skip_special)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            delta = after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            self.text += delta
            return delta
        return ""

    def finish(self):
        """At the end: the text of tokens still waiting for a character's last bytes (as
        U+FFFD, as the tokenizer decodes them)."""
        if self.read == len(self.ids):
            return ""
        dec = self.tokenizer.decode
        before = dec(self.ids[self.prefix:self.read], self.skip_special)
        after = dec(self.ids[self.prefix:], self.skip_special)
        delta = after[len(before):]
        self.prefix = self.read = len(self.ids)
        self.text += delta
        return delta


def load(directory):
    """(Tokenizer or None, why there is none): the tokenizer of a checkpoint directory, None for
    a directory without tokenizer.json (or a synthetic model), or None and the reason where the
    PyPI package `tokenizers` is missing or the files do not load."""
    if not directory or not os.path.isfile(os.path.join(directory, TOKENIZER_FILE)):
        return None, None
    try:
        return Tokenizer(directory), None
    except ImportError:
        return None, ("this model's tokenizer (%s) needs the PyPI package tokenizers, which "
                      "this Python does not have (pip install tokenizers)"
                      % os.path.join(directory, TOKENIZER_FILE))
    except Exception as e:  # the files: any failure of the tokenizer's parser
        return None, "this model's tokenizer (%s) does not load: %s: %s" % (
            directory, type(e).__name__, e)
