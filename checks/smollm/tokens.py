"""SmolLM2's tokenizer on chapter 02's byte-level BPE: its merges in chapter 02's format, its
pre-tokenizer, its chat template, and the ids Hugging Face's tokenizer gives chapter 02's
examples. Built from the cache's tokenizer fields, or from the file's metadata alone when there
is no cache (no weights are dequantised).
"""

from __future__ import annotations


import functools
import numbers
from pathlib import Path


from .cache import cached_tokenizer_fields
from .file import model_file, verified_fingerprint


FIRST_MERGE_ID = 256      # chapter 02: ids 0..255 are the bytes


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's display alphabet: each byte as a printable character (printable ASCII and most of
    Latin-1 stand for themselves; the other bytes, space and newline among them, are shifted to
    U+0100 onwards: space is 'Ġ', newline 'Ċ'). Vocabulary files spell tokens this way so that
    every token is a printable string; it changes nothing about the bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in keep}
    shifted = (b for b in range(256) if b not in spelling)
    spelling.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return spelling


# SmolLM2's pre-tokenizer ("smollm" in the GGUF file; `Digits(individual_digits=True)` then
# GPT-2's `ByteLevel` split in its tokenizer.json; the same in llama.cpp): every digit is a piece
# of its own, and the text between digits is cut by GPT-2's pattern: English contractions, an
# optional space followed by letters, by digits, or by other symbols, and whitespace (a run of
# spaces gives its last space to the word that follows).
_GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                 r"|\s+(?!\S)|\s+")


@functools.lru_cache(maxsize=1)
def _patterns():
    import regex   # Unicode classes (\p{L} letters, \p{N} digits), which `re` lacks

    return regex.compile(r"(\p{N})"), regex.compile(_GPT2_PATTERN)


def pre_tokenize(text: str) -> list[str]:
    """The pieces SmolLM2's tokenizer encodes one by one (no special tokens in `text`)."""
    digit, gpt2 = _patterns()
    pieces: list[str] = []
    for i, part in enumerate(digit.split(text)):
        if i % 2:                     # a digit: a piece of its own
            pieces.append(part)
        elif part:
            pieces += gpt2.findall(part)
    return pieces


class Tokenizer:
    """SmolLM2's tokenizer, built on chapter 02's byte-level BPE.

    - `merges`: {(a, b): new_id} in chapter 02's format and order: ids 0..255 are the bytes,
      merge k of SmolLM2's table makes id 256 + k. Each course id stands for one token of the
      model's vocabulary (`real_ids` maps them; the model's own numbering puts 17 special tokens
      first and leaves out 21 bytes that never occur in its training text).
    - `encode(text, bpe_encode=None)`: the model's ids for `text`. Special tokens such as
      `<|im_start|>` are matched first; the rest is cut into pieces by `pre_tokenize` (the split
      the merges were learned on: no merge crosses a piece boundary) and each piece is encoded by
      `bpe_encode(piece, merges)`, by default chapter 02's reference. The `merges` passed for a
      piece are the entries of `self.merges` that can apply inside it (those whose token's bytes
      occur in the piece), in the same order with the same ids: any other merge can never fire
      there, so a correct `bpe_encode` gives the same ids either way, only much faster.
      Bytes with no token of their own (a few control characters) are dropped, as Hugging Face's
      tokenizer does.
    - `decode(ids)`, `token_text(id)`, `token_bytes(id)`, `chat_prompt(user, system=None)`,
      `im_start_id`, `im_end_id`.
    """

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str],
                 pre: str = "smollm") -> None:
        if pre != "smollm":
            raise ValueError(f"pre-tokenizer {pre!r}: this tokenizer implements 'smollm' only")
        spelling = _bytes_to_unicode()
        byte_of_char = {ch: b for b, ch in spelling.items()}
        real_of_text = {t: i for i, t in enumerate(tokens)}
        # Special (control) tokens are matched in the text as they are, never cut.
        self.special_ids = {t: i for i, (t, kind) in enumerate(zip(tokens, token_types))
                            if kind == 3}
        self.im_start_id = self.special_ids["<|im_start|>"]
        self.im_end_id = self.special_ids["<|im_end|>"]
        self.endoftext_id = self.special_ids["<|endoftext|>"]

        # Course ids: the 256 bytes, then one per merge in the table's order.
        course_of_text = {spelling[b]: b for b in range(256)}
        self.merges: dict[tuple[int, int], int] = {}
        for k, line in enumerate(merges):
            left, right = line.split(" ")
            new_id = FIRST_MERGE_ID + k
            if left + right in course_of_text:
                # Two merges making the same token would give it two course ids: the one-to-one
                # map onto the vocabulary would break. SmolLM2's table has none.
                raise ValueError(f"merge {k} ({line!r}) makes a token an earlier merge made")
            self.merges[(course_of_text[left], course_of_text[right])] = new_id
            course_of_text[left + right] = new_id
        # course id -> real id (-1: a byte the vocabulary lacks), and the bytes of every real id.
        self._real = [real_of_text.get(t, -1) for t in
                      sorted(course_of_text, key=course_of_text.get)]
        mapped = [r for r in self._real if r >= 0]
        if len(set(mapped)) != len(mapped) or len(mapped) + len(self.special_ids) != len(tokens):
            raise ValueError("the merges do not map one-to-one onto the vocabulary")
        to_latin1 = str.maketrans({ch: chr(b) for ch, b in byte_of_char.items()})
        specials = set(self.special_ids.values())
        self._bytes = [t.encode("utf-8") if i in specials
                       else t.translate(to_latin1).encode("latin-1") for i, t in enumerate(tokens)]
        # For `encode`: each merged token's bytes -> its course id, and its pair.
        self._course_of_bytes = {self._bytes[r]: c for c, r in enumerate(self._real)
                                 if c >= FIRST_MERGE_ID}
        self._pair_of = {c: pair for pair, c in self.merges.items()}
        self._longest = max(map(len, self._course_of_bytes))
        import regex
        self._special_split = regex.compile(
            "(" + "|".join(regex.escape(t) for t in sorted(self.special_ids, key=len,
                                                           reverse=True)) + ")")
        self.vocab_size = len(tokens)

    # -- ids

    def real_ids(self, course_ids: list[int]) -> list[int]:
        """The model's ids for chapter 02's ids (bytes without a token of their own dropped)."""
        out = []
        for given in course_ids:
            i = int(given) if isinstance(given, numbers.Integral) else -1   # numpy, torch ints too
            if isinstance(given, bool) or not 0 <= i < len(self._real):
                raise ValueError(f"{given!r} is not a token id of SmolLM2's merges (0 .. "
                                 f"{len(self._real) - 1})")
            if self._real[i] >= 0:
                out.append(self._real[i])
        return out

    def merges_within(self, piece: str) -> dict[tuple[int, int], int]:
        """The entries of `merges` whose token's bytes occur in `piece`, in the same order: the
        only merges that can fire while encoding it."""
        data = piece.encode("utf-8")
        found = set()
        for i in range(len(data)):
            for j in range(i + 2, min(len(data), i + self._longest) + 1):
                c = self._course_of_bytes.get(data[i:j])
                if c is not None:
                    found.add(c)
        return {self._pair_of[c]: c for c in sorted(found)}

    def encode(self, text: str, bpe_encode=None) -> list[int]:
        """The model's token ids for `text` (special tokens recognised; no BOS is added)."""
        if bpe_encode is None:
            from ..reference import bpe_encode
        ids: list[int] = []
        for i, chunk in enumerate(self._special_split.split(text)):
            if i % 2:
                ids.append(self.special_ids[chunk])
                continue
            for piece in pre_tokenize(chunk):
                ids += self.real_ids(list(bpe_encode(piece, self.merges_within(piece))))
        return ids

    def decode(self, ids) -> str:
        """The text of `ids`: all tokens' bytes joined, decoded once (invalid UTF-8 -> U+FFFD)."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[int(token_id)]

    def token_text(self, token_id: int) -> str:
        """One token as text (a token holding part of a character shows U+FFFD)."""
        return self.decode([token_id])

    def chat_prompt(self, user: str, system: str | None = None) -> list[int]:
        """The ids of a one-turn chat, ending with the assistant's header: the model's chat
        template (ChatML), with its default system message when `system` is None."""
        return self.encode(chat_text(user, system))


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_text(user: str, system: str | None = None) -> str:
    """SmolLM2's chat template (ChatML) for one user turn, with the generation prompt."""
    system = DEFAULT_SYSTEM if system is None else system
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


#: Chapter 02's examples and the ids Hugging Face's tokenizer, built from the same file, gives
#: them (recorded; tests/smollm/test_oracle_smollm.py checks them against Hugging Face and this
#: package).
HF_IDS: dict[str, tuple[str, list[int]]] = {
    "the article's sentence": ("我喜欢学习 AI Infra", [
        19805, 235, 176, 240, 246, 177, 122, 112, 18753, 116, 27948, 250, 5646, 5883, 317]),
    "the chat prompt": (chat_text("What is the capital of France?"), [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198]),
    "mixed text": ("Tokenizers meet 中文、English and digits: 2024-11-05, 3.14159, 1,000,000.\n\n"
                   "    Indented  by   four,\ttabbed\nand 12 个空格  之后。", [
        20855, 7927, 2220, 216, 28589, 29184, 29917, 14901, 284, 18638, 42, 216, 34, 32, 34, 36,
        29, 33, 33, 29, 32, 37, 28, 216, 35, 30, 33, 36, 33, 37, 41, 28, 216, 33, 28, 32, 32,
        32, 28, 32, 32, 32, 30, 1004, 1218, 6574, 216, 411, 256, 1876, 28, 197, 15999, 5776, 198,
        397, 216, 33, 34, 216, 26951, 178, 119, 135, 26519, 137, 216, 216, 27948, 229, 46667,
        19076]),
}


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, fingerprint: tuple[int, str]) -> Tokenizer:
    data = cached_tokenizer_fields(Path(path), *fingerprint)
    return Tokenizer(data["tokens"].split("\n"), data["token_types"].tolist(),
                     data["merges"].split("\n"), data["pre"])


def tokenizer(path: Path | None = None) -> Tokenizer:
    """SmolLM2's tokenizer (built once per process)."""
    p = Path(path) if path else model_file()
    return _tokenizer(str(p), verified_fingerprint(p))

