"""Secrets on a command line, masked before ``run_start`` records it (pure).

Training scripts take tokens as options (``--hf-token hf_...``, ``--wandb_api_key=...``, Hydra's
``trainer.hf_token=...``), and ``run_start`` puts ``sys.argv`` in the history for good, where every
reader of the store sees it. What is masked, as :data:`~trainvigil.schemas.redact.MASK`:

- the value of an option (``-x``/``--x``, as ``--x VALUE`` or ``--x=VALUE``) or an assignment
  (``NAME=VALUE``, Hydra's overrides) whose name has a word that ends in a secret word
  (:data:`SECRET_WORDS`): ``--hf-token``, ``--apiKey``, ``--db_password``, ``client.secret=``.
  Words, not substrings, so ``--max_tokens`` and ``--tokenizer`` stay as written;
- anything shaped like a known token format (:data:`TOKEN_FORMATS`), wherever it appears;
- the password of a URL (``postgres://me:***@db``), as :func:`~trainvigil.schemas.redact.redact_url` shows it.

A false alarm costs a masked argument in the history; a miss leaks a credential, so names are read
generously (``--monkey`` is masked too).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainvigil.schemas.redact import MASK, redact_url

__all__ = ["SECRET_WORDS", "TOKEN_FORMATS", "redact_argv", "secret_name"]

SECRET_WORDS = ("token", "key", "password", "passwd", "secret", "credential", "credentials")
"""A name is a secret's when one of its words (split at anything but letters and digits, lower-cased) ends in one."""

TOKEN_FORMATS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API key
    r")"
)
"""Tokens recognisable by their shape, masked wherever they appear in an argument."""

_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]*")
_ASSIGNED = re.compile(r"[+~]{0,2}[A-Za-z_][A-Za-z0-9_.-]*")
"""A ``NAME`` of ``NAME=VALUE``: Hydra's overrides (``+db.password=...``), an environment-style ``HF_TOKEN=...``."""
_LOOKS_LIKE_AN_OPTION = re.compile(r"--?[A-Za-z]")


def secret_name(name: str) -> bool:
    """Whether the option or key ``name`` (``--hf-token``, ``db.apiKey``) names a secret (see :data:`SECRET_WORDS`)."""
    return any(word.endswith(SECRET_WORDS) for word in re.split(r"[^a-z0-9]+", name.lower()) if word)


def _masked(text: str) -> str:
    """``text`` with known token formats and URL passwords masked."""
    text = TOKEN_FORMATS.sub(MASK, text)
    return redact_url(text) if "://" in text else text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with what looks like a secret replaced by ``***`` (see the module); a new list, never raises
    on strings. ``--hf-token VALUE`` masks ``VALUE`` unless it looks like the next option (a flag alone)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not _LOOKS_LIKE_AN_OPTION.match(arg):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, equals, value = arg.partition("=")
        if _OPTION.fullmatch(name) or (equals and _ASSIGNED.fullmatch(name)):
            if secret_name(name):
                out.append(f"{name}={MASK}" if equals else arg)
                hide_next = not equals
                continue
            if equals:
                out.append(f"{name}={_masked(value)}")
                continue
        out.append(_masked(arg))
    return out
