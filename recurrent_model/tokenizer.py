"""The Huginn tokenizer: a thin wrapper over a Hugging Face ``tokenizers`` tokenizer.json.

Special tokens are found by their text, so the same code serves the published 65,536-token vocabulary
(specials at 65504 …) and smaller vocabularies trained by ``pretrain/`` (specials at V − 32 …).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

BOS = "<|begin_text|>"
EOS = "<|end_text|>"
BEGIN_HEADER = "<|begin_header|>"
END_HEADER = "<|end_header|>"
END_TURN = "<|end_turn|>"
PAD = "<|pad|>"
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>")
# In the order they follow each other from the first special id (65504 in the published vocabulary).
SPECIAL_TOKENS = (BOS, EOS, BEGIN_HEADER, END_HEADER, END_TURN, PAD, *FIM_TOKENS)
# The last NUM_SPECIAL ids of a vocabulary: the specials above, then reserved placeholders.
NUM_SPECIAL = 32
ALL_SPECIAL_TOKENS = SPECIAL_TOKENS + tuple(
    f"<|reserved_special_token_{i}|>" for i in range(NUM_SPECIAL - len(SPECIAL_TOKENS))
)
ASSISTANT_ROLE = "Huginn"


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used, or text/ids it cannot handle."""


def special_token_offset(vocab_size: int) -> int:
    """Id of the first special token: 32 below the end of the vocabulary (65504 for 65536)."""
    return vocab_size - NUM_SPECIAL


class TokenizerFile:
    """What every tokenizer here shares: a ``tokenizers`` tokenizer.json, decoded and saved as is."""

    backend: Tokenizer

    def save(self, path: str | os.PathLike) -> None:
        self.backend.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """The text of each token on its own (for axis labels), specials kept."""
        return [self.backend.decode([int(i)], skip_special_tokens=False) for i in ids]


class HuginnTokenizer(TokenizerFile):
    """Encode/decode text and chat messages with the Huginn special tokens and chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.backend = tokenizer
        missing = [
            t
            for t in (BOS, EOS, BEGIN_HEADER, END_HEADER, END_TURN, PAD)
            if tokenizer.token_to_id(t) is None
        ]
        if missing:
            raise TokenizerError(
                f"tokenizer lacks the Huginn special token(s) {', '.join(missing)}"
            )
        self.bos_id = tokenizer.token_to_id(BOS)
        self.eos_id = tokenizer.token_to_id(EOS)
        self.begin_header_id = tokenizer.token_to_id(BEGIN_HEADER)
        self.end_header_id = tokenizer.token_to_id(END_HEADER)
        self.end_turn_id = tokenizer.token_to_id(END_TURN)
        self.pad_id = tokenizer.token_to_id(PAD)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HuginnTokenizer:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"no tokenizer file at {path}")
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a generic Exception
            raise TokenizerError(f"{path} is not a valid tokenizer.json: {exc}") from exc
        return cls(backend)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Generation stops on BOS, EOS or end-of-turn (65504, 65505, 65508 in the published vocab)."""
        return (self.bos_id, self.eos_id, self.end_turn_id)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """BOS, then ``<|begin_header|>ROLE<|end_header|>\\n\\n`` + trimmed content + ``<|end_turn|>``.

        The assistant role is written "Huginn"; the generation prompt opens an assistant header.
        """
        parts = [BOS]
        for message in messages:
            try:
                role, content = message["role"], message["content"]
            except (KeyError, TypeError) as exc:
                raise TokenizerError(
                    f"a chat message needs 'role' and 'content', got {message!r}"
                ) from exc
            if role == "assistant":
                role = ASSISTANT_ROLE
            parts.append(f"{BEGIN_HEADER}{role}{END_HEADER}\n\n{content.strip()}{END_TURN}")
        if add_generation_prompt:
            parts.append(f"{BEGIN_HEADER}{ASSISTANT_ROLE}{END_HEADER}\n\n")
        return "".join(parts)

    def encode_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.backend.encode(text, add_special_tokens=False).ids


class PretrainedTokenizer(TokenizerFile):
    """Another family's tokenizer.json (Ouro's, a Llama's) with its own special tokens and chat
    template: BOS and EOS ids from config.json (``bos_token_id``, ``eos_token_id``, an id or a list)
    or tokenizer_config.json's token strings, the template from tokenizer_config.json's
    ``chat_template`` rendered in jinja2's sandbox, as the Hugging Face stack renders it. Whether
    ``encode`` adds a BOS is the tokenizer.json's own post-processor's choice."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        chat_template: str | None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.backend = tokenizer
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.chat_template = chat_template
        self.special_tokens = special_tokens or {}

    @classmethod
    def from_directory(cls, directory: str | os.PathLike, config: dict) -> PretrainedTokenizer:
        """The tokenizer of a checkpoint directory: tokenizer.json, tokenizer_config.json if present,
        and the special ids of its parsed config.json ``config``."""
        directory = Path(directory)
        try:
            backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a generic Exception
            raise TokenizerError(
                f"{directory / 'tokenizer.json'} is not a valid tokenizer.json: {exc}"
            ) from exc
        settings = _tokenizer_config(directory)
        specials = {k: _token_text(settings.get(k)) for k in ("bos_token", "eos_token")}
        specials = {k: v for k, v in specials.items() if v}
        bos = _ids(config.get("bos_token_id")) or _ids(
            backend.token_to_id(specials.get("bos_token", ""))
        )
        eos = _ids(config.get("eos_token_id")) or _ids(
            backend.token_to_id(specials.get("eos_token", ""))
        )
        template = settings.get("chat_template")
        return cls(
            backend,
            bos[0] if bos else None,
            eos,
            template if isinstance(template, str) else None,
            specials,
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Generation stops on the end-of-sequence ids."""
        return self.eos_ids

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_bos).ids

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The messages through the checkpoint's own chat template (TokenizerError without one)."""
        if not self.chat_template:
            raise TokenizerError("this tokenizer has no chat_template (tokenizer_config.json)")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            return env.from_string(self.chat_template).render(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )  # fmt: skip
        except TemplateError as exc:
            raise TokenizerError(f"the chat template failed on these messages: {exc}") from exc

    def encode_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.backend.encode(text, add_special_tokens=False).ids


def _tokenizer_config(directory: Path) -> dict:
    """tokenizer_config.json as a mapping ({} when absent); TokenizerError when unreadable."""
    from .json_files import read_json_object

    path = directory / "tokenizer_config.json"
    return read_json_object(path, TokenizerError) if path.is_file() else {}


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: object) -> tuple[int, ...]:
    """An id or a list of ids (config.json's eos_token_id may be either) as a tuple."""
    if isinstance(value, bool) or value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    return ()
