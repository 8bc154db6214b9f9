"""MAGI-1's prompt cleaning (the reference ``T5Embedder.clean_caption``, from DeepFloyd IF), without bs4.

The DiT was trained on captions cleaned this way, and the reference cleans every prompt twice before
tokenizing (`clean_prompt`). The steps and their order are the reference's: URL-decode and lower-case,
drop URLs, strip HTML (BeautifulSoup with ``html.parser`` there; `_html_text` reproduces its ``.text``
on the standard library's parser, which bs4 itself drives), drop @nicks, CJK, IPs, ids, file names and
shop boilerplate, normalise dashes and quotes, ftfy + HTML unescape, collapse whitespace.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import Callable
from html.entities import html5
from html.parser import HTMLParser

import ftfy

from inferix.errors import UserError

__all__ = ["clean_caption", "clean_prompt"]

Step = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]


def _steps(*pairs: tuple[str, str]) -> list[Step]:
    return [(re.compile(pattern), replacement) for pattern, replacement in pairs]


# A URL: scheme-led, or host.tld with one of a few TLDs; the second pass catches "www:" typos.
_URL_TAIL = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_URLS = _steps(
    (r"\b((?:https?:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),
    (r"\b((?:www:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),
)

# Between the HTML strip and ftfy. One class for the reference's seven CJK blocks (U+31C0..U+9FFF are
# contiguous, and deleting them block by block deletes exactly their union).
_DASHES = (
    r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0"
    r"\uFE31\uFE32\uFE58\uFE63\uFF0D]+"
)
# "#&@" and friends become a space; the reference's class, character for character.
_BAD_PUNCT = r"[#®•©™&@·º½¾¿¡§~)(\]\[}{|\\/*]+"
_BEFORE_FTFY = _steps(
    (r"@[\w\d]+\b", ""),  # @nickname
    (r"[\u31c0-\u9fff]+", ""),  # CJK strokes .. unified ideographs
    (_DASHES, "-"),  # every dash -> "-"
    (r"[`´«»“”¨]", '"'),
    (r"[‘’]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),  # a literal backslash-n
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),
    (r"[\S]+\.(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)", ""),  # file names
    (r"[\"\']{2,}", '"'),
    (r"[\.]{2,}", " "),
    (_BAD_PUNCT, " "),
    (r"\s+\.\s+", " "),
)
# this-is-my-cute-cat / this_is_my_cute_cat: only rewritten when there are more than 3 separators.
_WORD_SEPARATOR = re.compile(r"(?:\-|\_)")
_MAX_KEPT_SEPARATORS = 3

_AFTER_FTFY = _steps(
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),  # jc6640
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),  # jc6640vc
    (r"\b\d+[a-zA-Z]+\d+\b", ""),  # 6640vc231
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),  # j2d1a2a...
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # 1920x1080 (Latin x, Cyrillic х, ×)
    (r"\b\s+\:\s+", ": "),
    (r"(\D[,\./])\b", r"\1 "),
    (r"\s+", " "),
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),  # surrounding quotes
    (r"^[\'\_,\-\:;]", ""),
    (r"[\'\_,\-\:\-\+]$", ""),
    (r"^\.\S+$", ""),
)


def _apply(steps: list[Step], text: str) -> str:
    for pattern, replacement in steps:
        text = pattern.sub(replacement, text)
    return text


# ---- HTML -> text, as BeautifulSoup(text, "html.parser").text --------------------------------------
# bs4 resolves entity names without their ';' from the HTML5 table (first spelling in sorted order).
_ENTITIES: dict[str, str] = {}
for _name, _char in sorted(html5.items()):
    _ENTITIES.setdefault(_name.removesuffix(";"), _char)
# bs4 treats these as void elements: closed right after they open.
_VOID_TAGS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "menuitem", "meta", "param",
     "source", "track", "wbr", "basefont", "bgsound", "command", "frame", "image", "isindex", "nextid", "spacer"}
)  # fmt: skip
# Text inside these is not document text for bs4's .text (scripts, styles, templates, ruby annotations).
_HIDDEN_TEXT_TAGS = frozenset({"rt", "rp", "style", "script", "template"})
# Inside these bs4 keeps whitespace-only strings as they are instead of shrinking them.
_PRESERVE_WHITESPACE_TAGS = frozenset({"pre", "textarea"})
_ASCII_SPACES = frozenset("\x20\x0a\x09\x0c\x0d")


class _TextExtractor(HTMLParser):
    """Collects the strings bs4's tree builder would keep, in document order, with its quirks.

    Strings end at every tag, comment or declaration; a whitespace-only string shrinks to one space
    (or newline) outside ``pre``/``textarea``; strings inside script/style/template/rt/rp, comments,
    doctypes, declarations and processing instructions are dropped; CDATA is kept; unknown entities
    stay as ``&name`` (without their ``;``), numeric references below 256 are read as windows-1252.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.strings: list[str] = []
        self._pending: list[str] = []
        self._open: list[str] = []  # element stack, innermost last
        self._closed_void: list[str] = []

    # -- strings --
    def _end_string(self, keep: bool = True) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending = []
        if not any(tag in _PRESERVE_WHITESPACE_TAGS for tag in self._open) and set(text) <= _ASCII_SPACES:
            text = "\n" if "\n" in text else " "
        if keep:
            self.strings.append(text)

    def _end_text_string(self) -> None:
        """End a plain string: kept unless its innermost special container hides it."""
        container = next((tag for tag in reversed(self._open) if tag in _HIDDEN_TEXT_TAGS), None)
        self._end_string(keep=container is None)

    def handle_data(self, data: str) -> None:
        self._pending.append(data)

    def handle_entityref(self, name: str) -> None:
        self._pending.append(_ENTITIES.get(name, f"&{name}"))

    def handle_charref(self, name: str) -> None:
        self._pending.append(_charref(name))

    # -- tags --
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, void=True)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, void=False)
        self.handle_endtag(tag)

    def _start(self, tag: str, void: bool) -> None:
        self._end_text_string()
        self._open.append(tag)
        if void and tag in _VOID_TAGS:
            self._end_tag(tag)
            self._closed_void.append(tag)

    def handle_endtag(self, tag: str) -> None:
        # A "</br>" right after "<br>" closes nothing: the void element was closed already.
        if tag in self._closed_void:
            self._closed_void.remove(tag)
        else:
            self._end_tag(tag)

    def _end_tag(self, tag: str) -> None:
        self._end_text_string()
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    # -- markup that is not text --
    def handle_comment(self, data: str) -> None:
        self._end_text_string()

    def handle_decl(self, decl: str) -> None:
        self._end_text_string()

    def handle_pi(self, data: str) -> None:
        self._end_text_string()

    def unknown_decl(self, data: str) -> None:
        self._end_text_string()
        if data.upper().startswith("CDATA["):
            # CDATA is text for bs4, whatever element it sits in.
            self._pending.append(data[len("CDATA[") :])
            self._end_string()

    def text(self) -> str:
        self._end_text_string()
        return "".join(self.strings)


def _charref(name: str) -> str:
    """A numeric character reference the way bs4 decodes it (windows-1252 below 256)."""
    code = int(name[1:], 16) if name[0] in "xX" else int(name)
    if code < 256:
        try:
            return bytes([code]).decode("windows-1252")
        except UnicodeDecodeError:
            pass  # the five undefined windows-1252 bytes fall through to chr()
    try:
        return chr(code)
    except (ValueError, OverflowError):
        return "\N{REPLACEMENT CHARACTER}"


def _html_text(text: str) -> str:
    parser = _TextExtractor()
    try:
        parser.feed(text)
        parser.close()
    except AssertionError as exc:
        # html.parser asserts on some malformed declarations; bs4 (and so the reference) rejects them too.
        raise UserError(f"prompt {text[:60]!r}... has malformed HTML markup ({exc}); remove the '<!' part") from exc
    return parser.text()


# ---- the pipeline ---------------------------------------------------------------------------------
def _basic_clean(text: str) -> str:
    """Fix mojibake (ftfy) and double-escaped entities (``&amp;amp;``)."""
    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def clean_caption(caption: str) -> str:
    """One pass of the reference ``clean_caption`` (the reference applies it twice: `clean_prompt`)."""
    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = text.replace("<person>", "person")
    text = _html_text(_apply(_URLS, text))
    text = _apply(_BEFORE_FTFY, text)
    if len(_WORD_SEPARATOR.findall(text)) > _MAX_KEPT_SEPARATORS:
        text = _WORD_SEPARATOR.sub(" ", text)
    text = _apply(_AFTER_FTFY, _basic_clean(text))
    return text.strip()


def clean_prompt(prompt: str) -> str:
    """The prompt as the reference hands it to the tokenizer: `clean_caption` applied twice."""
    return clean_caption(clean_caption(prompt))
