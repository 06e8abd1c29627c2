"""NATS subject names: which a pattern matches, which one may publish to, which stream captures
one. Imported wherever options are parsed, so it imports nothing of nats-py."""

from __future__ import annotations

from collections.abc import Iterable


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether `subject` matches `pattern` (`*` one token, `>` one or more trailing tokens)."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or (token != "*" and token != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def valid_publish_subject(subject: str) -> bool:
    """A subject one may publish to: non-empty tokens, no wildcards, no whitespace."""
    return bool(subject) and all(
        token and token not in ("*", ">") and not any(c.isspace() for c in token)
        for token in subject.split(".")
    )


class SubjectCapture:
    """The subjects of a set of streams, and which stream (if any) stores a given subject."""

    def __init__(self, streams: Iterable[dict[str, object]]) -> None:
        self.patterns = [
            (pattern, str(config["name"]))
            for config in streams
            for pattern in config.get("subjects") or []  # type: ignore[attr-defined]
        ]

    def stream_of(self, subject: str) -> str | None:
        return next(
            (name for pattern, name in self.patterns if subject_matches(pattern, subject)), None
        )
