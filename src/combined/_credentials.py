"""Which names hold a credential, and how to keep credentials out of text and data.

One place decides what a credential looks like (a configuration key, a libpq
keyword, a URL query parameter, an error's context key), so that the check
refusing a literal secret in a project file and the redaction of errors,
logs and stored configurations always agree. A false positive is cheap: a
secret reference is accepted under any key.

A key name is split into words (``sslPassword`` -> ssl, password;
``AWS_SECRET_ACCESS_KEY`` -> aws, secret, access, key). Trailing words that
only say how the value is written (``_value``, ``_pem``, ``_v2``) are set
aside, and the last remaining word, the one that says what the value is,
decides:

* a credential word, alone or ending a run-together word: ``password``,
  ``sslpassword``, ``passwd``, ``pwd``, ``passphrase``, ``secret``,
  ``clientsecret``, ``token``, ``authtoken``, ``authorization``, ``bearer``,
  ``cookie``, ``jwt``; ``pass``
  only as a word of its own (``bypass`` is not one); a near miss of a long
  one (``pasword``);
* ``key`` or ``keys`` after a word that makes it a credential: ``api_key``,
  ``apikey``, ``access_key``, ``secret_access_key``, ``private_key``. A bare
  ``key`` (a dataset key, a TLS key file) or ``primary_key`` is not one;
* ``credentials`` / ``creds`` group other settings: only a value written
  directly under them counts, while anything under any other credential
  key is part of the secret (``password: {value: ...}``).

So ``password_file``, ``token_url`` or ``api_key_header`` are not
credentials: their last word says they name something else.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from combined._secret_forms import Masker, forms, masker_of

SECRET_KEY = "secret"
"""The one key of a secret reference mapping: ``{secret: "env:NAME"}``."""

MASK = "***"
"""What a redacted credential is replaced with."""

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

# Credential words, matched as the last word or as the end of a run-together one.
_CREDENTIAL_ENDINGS = (
    "password",
    "passwords",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "authorization",
    # A bearer value, a session cookie and a JWT each sign a request on their own.
    "bearer",
    "cookie",
    "cookies",
    "jwt",
)
# Matched as whole words only: as endings they end ordinary words (bypass, compass).
_WHOLE_WORDS = frozenset({"pass"})
# Words that group credentials with other settings (a user name, a host).
_GROUP_ENDINGS = ("credential", "credentials", "creds")
# Long words whose misspellings (``pasword``) still name them.
_NEAR_MISS_WORDS = ("password", "passphrase", "credential", "credentials")
_NEAR_MISS_CUTOFF = 0.85
# Words before ``key`` that make it a credential rather than a column or a file.
_KEY_QUALIFIERS = (
    "api",
    "access",
    "private",
    "secret",
    "signing",
    "encryption",
    "master",
    "shared",
    "auth",
    "app",
    "account",
    "license",
    "subscription",
    "hmac",
)
# Trailing words that say how a value is written, not what it is.
_FORM_WORDS = frozenset(
    {
        "value",
        "text",
        "string",
        "str",
        "plain",
        "plaintext",
        "raw",
        "literal",
        "data",
        "pem",
        "b64",
        "base64",
        "hex",
        "content",
        "contents",
        "bytes",
        "v",
    }
)

Kind = Literal["leaf", "group"]


def _words(name: str) -> list[str]:
    words = [word.lower() for word in _WORD.findall(name)]
    while words and (words[-1] in _FORM_WORDS or words[-1].isdigit()):
        words.pop()
    return words


def credential_kind(name: object) -> Kind | None:
    """Whether the key ``name`` holds a credential: ``leaf``, ``group`` or None.

    Everything under a ``leaf`` key (``password``, ``api_key``) is part of the
    secret; only a value written directly under a ``group`` key
    (``credentials``) is one.
    """
    if not isinstance(name, str):
        return None
    return _text_kind(name)


# Redaction asks about every name it meets; a long text repeats a few names.
@functools.lru_cache(maxsize=4096)
def _text_kind(name: str) -> Kind | None:
    words = _words(name)
    if not words:
        return None
    head = words[-1]
    if head.endswith(_GROUP_ENDINGS):
        return "group"
    if head in _WHOLE_WORDS or head.endswith(_CREDENTIAL_ENDINGS):
        return "leaf"
    for suffix in ("keys", "key"):
        if head.endswith(suffix):
            qualifier = head[: -len(suffix)] or (words[-2] if len(words) > 1 else "")
            return "leaf" if qualifier and qualifier.endswith(_KEY_QUALIFIERS) else None
    if len(head) >= 6:
        close = difflib.get_close_matches(head, _NEAR_MISS_WORDS, n=1, cutoff=_NEAR_MISS_CUTOFF)
        if close:
            return "group" if close[0].startswith("credential") else "leaf"
    return None


def is_credential_key(name: object) -> bool:
    """Whether a configuration key, keyword or parameter conventionally holds a credential."""
    return credential_kind(name) is not None


def is_secret_ref(value: object) -> bool:
    """Whether ``value`` is shaped like a secret reference: ``{secret: "<text>"}``."""
    return isinstance(value, Mapping) and len(value) == 1 and isinstance(value.get(SECRET_KEY), str)


def is_literal(value: object) -> bool:
    """Whether ``value`` is a scalar that could be a secret (non-empty text or a number)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) or (isinstance(value, str) and value != "")


Loc = tuple[str | int, ...]


def walk(config: Mapping[Any, Any]) -> Iterator[tuple[Loc, Any, bool]]:
    """Yield (location, value, under a credential) for everything below ``config``.

    ``config`` is a mapping of settings, never itself a reference. Secret
    references are yielded but not entered. List items share their list's
    standing; a mapping item is under a credential if its own key is
    credential-like or a ``leaf`` credential key encloses it at any depth.
    """
    for key, item in config.items():
        yield from _walk(item, (str(key),), *_below(key, False))


def _walk(value: Any, loc: Loc, under: bool, inside: bool) -> Iterator[tuple[Loc, Any, bool]]:
    yield loc, value, under
    if is_secret_ref(value):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*loc, str(key)), *_below(key, inside))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(item, (*loc, index), under, inside)


def _below(key: object, inside: bool) -> tuple[bool, bool]:
    """(under a credential, inside a leaf credential) for the value of ``key``."""
    kind = credential_kind(key)
    return inside or kind is not None, inside or kind == "leaf"


def redact_data(value: Any, *, key: object = None) -> Any:
    """A copy of ``value`` that is safe to store, log and show.

    Literal credentials (see :func:`walk`) become ``"***"``, text is passed
    through :func:`redact`, secret references stay as they are (they are not
    secrets). ``key`` is the name ``value`` is stored under, if any. A pair
    (a 2-tuple: ``parse_qsl``, ``dict.items()``, headers, in bytes too) is
    read as a key and its value; a list is not (a configuration's list of
    names is data).
    """
    return _clean(value, *_below(key, False))


def _clean(value: Any, under: bool, inside: bool) -> Any:
    if is_secret_ref(value):
        return {SECRET_KEY: value[SECRET_KEY]}
    if isinstance(value, Mapping):
        return {k: _clean(item, *_below(k, inside)) for k, item in value.items()}
    if isinstance(value, list):
        return [_clean(item, under, inside) for item in value]
    if isinstance(value, tuple):
        if len(value) == 2 and is_credential_key(name := _pair_key(value[0])):
            return (_clean(value[0], under, inside), _clean(value[1], *_below(name, inside)))
        return tuple(_clean(item, under, inside) for item in value)
    if under and (is_literal(value) or (isinstance(value, bytes) and value != b"")):
        return MASK
    if isinstance(value, str):
        return redact(value)
    return value


def _pair_key(key: object) -> object:
    """The key of a pair as text: a header name in bytes is decoded."""
    return key.decode("latin-1") if isinstance(key, bytes) else key


# ``scheme://user:password@host``. The password may hold an unescaped ``@``
# (or ``/``): it runs to the last ``@`` of the URL. An ``@`` later in the path
# or query masks more than the password, never less.
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):(?P<pw>\S*)@")
_SPACE = re.compile(r"\s")
# A value as libpq reads it: in single quotes with backslash escapes (as
# psycopg's ``make_conninfo`` writes it), else up to whitespace. An
# unterminated single quote runs to the end, so a message cut short still
# hides the rest. Double quotes (not libpq's) count only when closed: psycopg
# writes a value without a space as it is (``"abc``). A quoted value runs on
# to the end of its word, so what follows its closing quote in the same word
# is masked with it (``password='a b')`` in a repr of keyword arguments,
# ``'abc'def``). A repr's string prefix (``b'...'``) belongs to the value.
_SINGLE_QUOTED = re.compile(r"(?s)'(?:\\.|[^'\\])*(?:'|\\?\Z)")
_ESCAPED_DOUBLE = re.compile(r'\\+"')
_WORD_VALUE = re.compile(r"(?s)(?:\\.|\S)+")
_WORD_REST = re.compile(r"(?s)(?:\\.|\S)*")
_EMPTY_VALUES = ("''", '""')


def _is_word(char: str) -> bool:
    """``char`` matches ``\\w`` (Python's rule for ``str`` patterns)."""
    return char.isalnum() or char == "_"


def _next_key(text: str, pos: int) -> tuple[int, str, int] | None:
    """The first ``name=`` of ``text`` from ``pos``: (start of name, name, end of ``=\\s*``).

    ``name=value`` pairs are libpq keywords, URL query parameters and
    command-line options. The name is what the pattern
    ``(?<!\\w)[A-Za-z_][\\w.-]*`` matches just before ``\\s*=\\s*``, found
    leftmost first; searched for with that pattern, a long run such as
    ``a.a.a...`` with no ``=`` takes quadratic time. Here each ``=`` is found
    first and its name read backwards from it, in linear time (``\\w`` is
    ``isalnum`` or ``_``, ``\\s`` is ``isspace``, as Python's ``re`` reads ``str``).
    """
    while (equals := text.find("=", pos)) >= 0:
        end = equals
        while end > pos and text[end - 1].isspace():
            end -= 1
        run = end
        while run > pos and (_is_word(text[run - 1]) or text[run - 1] in ".-"):
            run -= 1
        for start in range(run, end):
            first = text[start]
            if (first == "_" or (first.isascii() and first.isalpha())) and (
                start == 0 or not _is_word(text[start - 1])
            ):
                after = equals + 1
                while after < len(text) and text[after].isspace():
                    after += 1
                return start, text[start:end], after
        pos = equals + 1
    return None


def _credential_pairs(text: str) -> Iterator[tuple[int, str, str, int]]:
    """Each ``name=value`` whose name is credential-like: (start, name, value, end of value).

    The values of other names are scanned too, so ``a=b&password=c`` is found.
    """
    pos = 0
    while (pair := _next_key(text, pos)) is not None:
        start, key, pos = pair
        if not is_credential_key(key):
            continue
        end = _with_credentials(text, pos, _value_end(text, pos))
        yield start, key, text[pos:end], end
        pos = end


#: Words that open an HTTP ``Authorization`` value: the credentials follow them.
_AUTH_SCHEMES = frozenset({"basic", "bearer", "token", "digest", "negotiate", "ntlm", "apikey"})


def _with_credentials(text: str, pos: int, end: int) -> int:
    """Where a value ends that is an auth scheme word (``Bearer``): after its credentials."""
    if text[pos:end].lower() in _AUTH_SCHEMES and text[end : end + 1] == " ":
        word = _WORD_VALUE.match(text, end + 1)
        return word.end() if word is not None else end
    return end


def _value_end(text: str, pos: int) -> int:
    """Where the value of a ``name=value`` pair, starting at ``pos``, ends (``pos`` if empty)."""
    end: int | None = None
    if (opened := _STRING_PREFIX.match(text, pos)) is not None:
        quote = opened.end() - 1
        if text[quote] == "'":
            single = _SINGLE_QUOTED.match(text, quote)
            end = single.end() if single is not None else None
        else:
            end = _double_quoted_end(text, quote)
    elif (escaped := _ESCAPED_DOUBLE.match(text, pos)) is not None and len(escaped[0]) % 2 == 0:
        # ``\"``, ``\\\"``: a quote escaped as JSON or a repr escapes one (JSON
        # of ``password="a b"``), never psycopg, which doubles every backslash.
        end = _escaped_end(text, escaped.end(), escaped[0])
    if end is not None:
        rest = _WORD_REST.match(text, end)
        return rest.end() if rest is not None else end
    word = _WORD_VALUE.match(text, pos)
    return word.end() if word is not None else pos


def _double_quoted_end(text: str, start: int) -> int | None:
    """Where the double-quoted value opening at ``start`` closes; None if it does not.

    A quote behind an even run of backslashes is ambiguous (see
    :func:`_plain_quoted_end`): the rest of the text is masked if a quote
    beyond the word could close the value instead, else the value closes
    there (psycopg writes the password ``"\\"`` as ``"\\\\"``, unquoted). With no
    closing quote at all, the value is not a quoted one (psycopg writes ``"abc``).
    """
    pos = start + 1
    while (pos := text.find('"', pos)) >= 0:
        run = _backslashes_before(text, pos, start + 1)
        pos += 1
        if run == 0:
            return pos
        if run % 2 == 0:
            space = _SPACE.search(text, pos)
            beyond = text.find('"', space.end()) if space is not None else -1
            return len(text) if beyond >= 0 else pos
    return None


# ``'name': value`` / ``"name": value``: a mapping as Python's repr or JSON writes it
# (an exception quoting a configuration, a validation error's input), also
# escaped inside a quoted string (``{\"password\": \"...\"}``: JSON in JSON).
_QUOTED_KEY = re.compile(r"(?<!\\)(?P<q>\\*['\"])(?P<key>[A-Za-z_][\w.-]*)(?P=q)\s*:\s*")
# ``('name', value)`` / ``["name", value]``: a key/value pair as Python's repr
# or JSON writes it (``parse_qsl``, ``list(mapping.items())``, HTTP headers as
# a list of pairs, in bytes as ASGI writes them), escaped inside a quoted
# string too. Any sequence whose first item is a credential name counts, so
# ``['password', 'user']`` loses its second item: a false positive is cheap.
_PAIR_KEY = re.compile(r"[(\[]\s*b?(?P<q>\\*['\"])(?P<key>[A-Za-z_][\w.-]*)(?P=q)\s*,\s*")
# ``Secret('...')``: a credential-named class or function called with a quoted
# first argument, as the repr of an object holding a secret writes it.
_CALL_ARG = re.compile(r"(?<!\w)(?P<name>\w+)\(\s*(?P<value>[bru]{0,2}(?P<q>\\*['\"]))")
# A quoted value (an unterminated one runs to the end), else up to a separator.
_REPR_VALUE = re.compile(
    r"[bru]{0,2}(?:'(?:\\.|[^'\\])*(?:'|$)|\"(?:\\.|[^\"\\])*(?:\"|$))|[^\s,}\]]+"
)
# An unquoted item of a pair: a number, ``None``, ``null``.
_PAIR_ITEM = re.compile(r"[^\s,)}\]]+")
# A call as a value (``SecretStr('a b')``): masked whole, to its closing parenthesis.
_CALL_VALUE = re.compile(r"[A-Za-z_][\w.]*(?=\()")
_OPEN = {"{": "}", "[": "]", "(": ")"}
# A quoted value's opening, with a repr's string prefix (``b'...'``).
_STRING_PREFIX = re.compile(r"[bru]{0,2}['\"]")


def _nested_end(text: str, start: int) -> int:
    """Where the bracketed value opening at ``start`` closes (quotes respected), or the end."""
    closing: list[str] = []
    pos = start
    while pos < len(text):
        char = text[pos]
        if char in "'\"":
            quoted = _REPR_VALUE.match(text, pos)
            pos = quoted.end() if quoted is not None else pos + 1
            continue
        if char in _OPEN:
            closing.append(_OPEN[char])
        elif closing and char == closing[-1]:
            closing.pop()
            if not closing:
                return pos + 1
        pos += 1
    return len(text)


def _escaped_end(text: str, start: int, quote: str) -> int:
    """Where a value opened by the escaped ``quote`` (``\\"``) closes, or the end.

    Each level of escaping doubles every backslash of what it encloses, and
    JSON adds one before a quote (a repr of a JSON string does not): the
    key's quote, behind ``k`` backslashes, went through ``k.bit_length()``
    levels, and the value's own text through one more. So a backslash of the
    value is a run of ``u = 2 ** (k.bit_length() + 1)`` backslashes here, and
    the closing quote is preceded by a run of ``k`` modulo ``u``; a quote
    inside the value has another remainder (``u - 1`` for JSON in JSON,
    ``u - 2`` for a repr of it).
    """
    escapes, char = len(quote) - 1, quote[-1]
    unit = 2 << escapes.bit_length()
    pos = start
    while (pos := text.find(char, pos)) >= 0:
        run = _backslashes_before(text, pos, start)
        pos += 1
        if run % unit == escapes:
            return pos
    return len(text)


def _backslashes_before(text: str, pos: int, floor: int) -> int:
    """How many backslashes stand right before ``pos``, counting back to ``floor`` at most."""
    run = 0
    while pos - run > floor and text[pos - run - 1] == "\\":
        run += 1
    return run


def _plain_quoted_end(text: str, start: int) -> int:
    """Where the quoted value opening at ``start`` closes; the end of ``text`` when unsure.

    A quote behind no backslash closes it; behind an odd run it is escaped.
    Behind an even run it is either an escaped backslash closing the value
    (``"a\\\\"``) or a quote escaped one level deeper (a repr of JSON shows
    the JSON's ``\\"`` as ``\\\\"``): the two cannot be told apart, so the
    rest of the text is masked, which hides the value either way.
    """
    char = text[start]
    pos = start + 1
    while (pos := text.find(char, pos)) >= 0:
        run = _backslashes_before(text, pos, start + 1)
        pos += 1
        if run == 0:
            return pos
        if run % 2 == 0:
            break
    return len(text)


def _quoted_pairs(text: str) -> Iterator[tuple[int, int, int]]:
    """Each ``'name': value`` whose name is credential-like: (start, end of key, end of value).

    A bracketed value (a nested mapping or list) or a call is masked whole.
    """
    pos = 0
    while (pair := _QUOTED_KEY.search(text, pos)) is not None:
        pos = pair.end()
        if not is_credential_key(pair["key"]) or pos >= len(text):
            continue
        end = _repr_value_end(text, pos, pair["q"], _REPR_VALUE)
        if text[pos:end] != MASK:
            yield pair.start(), pair.end(), end
        pos = end


def _pair_items(text: str) -> Iterator[tuple[int, int]]:
    """Each ``('name', value)`` whose name is credential-like: (start, end of the value)."""
    pos = 0
    while (pair := _PAIR_KEY.search(text, pos)) is not None:
        pos = pair.end()
        if not is_credential_key(pair["key"]) or pos >= len(text):
            continue
        end = _repr_value_end(text, pos, pair["q"], _PAIR_ITEM)
        if end > pos and text[pos:end] != MASK:  # ``('password',)`` holds no value
            yield pos, end
        pos = end


def _repr_value_end(text: str, pos: int, quote: str, unquoted: re.Pattern[str]) -> int:
    """Where the value at ``pos`` ends, its key quoted with ``quote`` (``'``, ``\\"``).

    ``unquoted`` reads a value that is neither quoted, nor bracketed, nor a call.
    """
    if text[pos] in _OPEN:
        return _nested_end(text, pos)
    if len(quote) > 1 and text.startswith(quote, pos):
        return _escaped_end(text, pos + len(quote), quote)
    if (opened := _STRING_PREFIX.match(text, pos)) is not None:
        return _plain_quoted_end(text, opened.end() - 1)
    if (call := _CALL_VALUE.match(text, pos)) is not None:
        return _nested_end(text, call.end())
    value = unquoted.match(text, pos)
    return value.end() if value is not None else pos


def _call_args(text: str) -> Iterator[tuple[int, int]]:
    """Each quoted first argument of a credential-named call: (start, end of the argument)."""
    pos = 0
    while (call := _CALL_ARG.search(text, pos)) is not None:
        pos = call.end()
        if not is_credential_key(call["name"]):
            continue
        quote = call["q"]
        if len(quote) > 1:
            pos = _escaped_end(text, pos, quote)
        else:
            pos = _plain_quoted_end(text, pos - 1)
        yield call.start("value"), pos


def _url_passwords(text: str) -> Iterator[re.Match[str]]:
    """The matches ``_URL_PASSWORD.finditer`` gives, in time linear in long scheme-like runs.

    Tried at every position, the regex reads each run of scheme characters
    (``aaaa...``) to its end looking for ``://``: quadratic. Here each ``://``
    is found first and the scheme read backwards from it, back to the end of
    the previous match at most, as ``finditer`` would.
    """
    done = 0
    word_end = last_at = -1  # the non-space run holding ``sep``: its end and its last ``@``
    while (sep := text.find("://", done)) >= 0:
        if sep >= word_end:
            space = _SPACE.search(text, sep)
            word_end = space.start() if space is not None else len(text)
            last_at = text.rfind("@", sep, word_end)
        if last_at < sep:  # no ``@`` after it in its run: no password can follow
            done = sep + 3
            continue
        run = sep
        while (
            run > done
            and text[run - 1].isascii()
            and (text[run - 1].isalnum() or text[run - 1] in "+.-")
        ):
            run -= 1
        start = next((i for i in range(run, sep) if text[i].isascii() and text[i].isalpha()), None)
        found = _URL_PASSWORD.match(text, start) if start is not None else None
        if found is None:
            done = sep + 3
            continue
        yield found
        done = found.end()


def has_inline_credential(text: str) -> bool:
    """Whether ``text`` carries a credential in a URL or a ``name=value`` pair."""
    if any(url["pw"] for url in _url_passwords(text)):
        return True
    return any(
        value and value not in _EMPTY_VALUES and value[0] not in "&;"
        for _, _, value, _ in _credential_pairs(text)
    )


# -- secret values known to this process ------------------------------------------

_known: set[str] = set()
_known_masker: Masker | None = None
_reserved_env: set[str] = set()
_known_lock = threading.Lock()


def remember_secret(value: str) -> None:
    """Mask ``value`` from now on in every text :func:`redact` cleans, in this process.

    Every secret Combined resolves passes here, so an error, a log line or a
    program's output that echoes one (an API returning the token it was sent,
    a tap printing its configuration) is masked wherever it is stored or
    shown, whatever shape surrounds it. Its escaped forms (in a URL however
    encoded, in JSON, in a repr, in base64) and each line of a multi-line
    secret (a PEM key) are masked too (:mod:`combined._secret_forms`).
    """
    if value in _known or not any(forms(value)):
        return
    global _known_masker
    with _known_lock:
        _known.add(value)
        _known_masker = masker_of(_known)


def reserve_env(name: str) -> None:
    """Record that a secret reference names the environment variable ``name``.

    A program Combined runs never inherits such a variable: it gets a secret
    only as its own configuration gives it one.
    """
    with _known_lock:
        _reserved_env.add(name)


def reserved_env() -> frozenset[str]:
    """The environment variables secret references of this process's projects name."""
    return frozenset(_reserved_env)


def _mask_known(text: str) -> str:
    masker = _known_masker
    return masker(text, MASK) if masker is not None else text


#: A terminal's control sequence (CSI: colours, cursor moves), as a library's error may carry;
#: its ESC as it is, or as a repr or JSON writes it (an error's repr is kept as text too).
_TERMINAL_CONTROL = re.compile(r"(?:\x1b|\\x1b|\\u001b|\\033)\[[0-?]*[ -/]*[@-~]")


def redact(text: str) -> str:
    """``text`` with credentials masked: in URLs, reprs, calls and ``name=value`` pairs.

    Terminal control sequences go too (delta-rs colours each line of an
    error's chain): a remote server's text kept or shown never drives a terminal.

    Secret values this process resolved (:func:`remember_secret`) are masked
    first, wherever they stand. Then each kind is masked in turn, on the text
    the previous ones left. Calls
    come after the reprs: a credential word before ``('`` may be prose, and
    its guessed argument must not hide a mapping's key from them. They come
    before the ``name=value`` pairs, so that ``password=Secret('a b')`` is
    masked whole.
    """
    text = _mask_known(_TERMINAL_CONTROL.sub("", text))
    text = _masked(text, ((m.start(), f"{m['head']}:", m.end("pw")) for m in _url_passwords(text)))
    text = _masked(
        text, ((start, text[start:kept], end) for start, kept, end in _quoted_pairs(text))
    )
    text = _masked(text, ((start, "", end) for start, end in _pair_items(text)))
    text = _masked(text, ((start, "", end) for start, end in _call_args(text)))
    text = _masked(
        text, ((start, f"{key}=", end) for start, key, _, end in _credential_pairs(text))
    )
    return _masked(text, ((start, "", end) for start, end in _header_values(text)))


# ``Name: value`` opening a line (a real one, or ``\n`` / ``\r`` as a repr writes
# it): an HTTP header as a library's debug log prints it (``Authorization: Bearer
# ...``, ``x-api-key: ...``), a YAML setting. The value runs to the line's end,
# or to a backslash (the next escaped line break of a repr).
_HEADER = re.compile(r"(?m)(?:^|(?<=\\[nr]))[ \t]*(?P<name>[A-Za-z][\w-]*)[ \t]*:[ \t]*")
_HEADER_VALUE = re.compile(r"[^\r\n\\]*")


def _header_values(text: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of each credential-named header or setting line's value."""
    for header in _HEADER.finditer(text):
        value = _HEADER_VALUE.match(text, header.end())
        if value is not None and value.end() > value.start() and is_credential_key(header["name"]):
            yield value.start(), value.end()


def masking(secrets: Iterable[str]) -> Callable[[str], str]:
    """A function that masks each of ``secrets`` in a text, then applies :func:`redact`.

    For the values a component knows to be secret (a resolved password, a
    token and its encoded forms), which no credential shape would find. The
    longest are masked first, so that none is left half shown by a shorter
    one it contains.
    """
    exact = value_masking(secrets)

    def mask(text: str) -> str:
        return redact(exact(text))

    return mask


def value_masking(secrets: Iterable[str]) -> Callable[[str], str]:
    """A function that masks each of ``secrets`` (in every form: URL-encoded, base64...) and
    the secrets this process resolved (:func:`remember_secret`) in a text, and nothing else.

    For a text given back to a program (a tap's state): :func:`redact`'s
    credential shapes would cut a value of it that only looks like one (a
    page token in a next-page URL, ``...?page_token=...&limit=100``).
    """
    masker = masker_of(secrets, shortest=1)

    def mask(text: str) -> str:
        if masker is not None:
            text = masker(text, MASK)
        return _mask_known(text)

    return mask


def _masked(text: str, spans: Iterator[tuple[int, str, int]]) -> str:
    """``text`` with each (start, prefix, end) span replaced by its prefix and the mask."""
    out: list[str] = []
    done = 0
    for start, prefix, end in spans:
        out.append(f"{text[done:start]}{prefix}{MASK}")
        done = end
    out.append(text[done:])
    return "".join(out)
