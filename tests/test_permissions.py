"""What errors point users at resolves in an installed package: no docs/ pages (the wheel
carries none), and the command that prints the permissions a query needs, which docs/security.md
shows as it prints."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nats_spark.permissions import authorization_block

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "nats_spark"


def _message_texts() -> list[tuple[str, str]]:
    """(file, text) of every string constant in the package other than docstrings: what its
    errors and logs can say."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and id(node) not in docstrings:
                found.append((str(path.relative_to(REPO)), text))
    return found


def test_no_message_points_at_a_docs_page() -> None:
    pointing = [(f, t) for f, t in _message_texts() if re.search(r"docs/|\w\.md\b", t)]
    assert not pointing, pointing


def test_every_command_a_message_names_runs() -> None:
    modules = {
        m for _, t in _message_texts() for m in re.findall(r"python -m (nats_spark[\w.]*)", t)
    }
    assert "nats_spark.permissions" in modules
    for module in sorted(modules):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (module, done.stderr)


def test_the_permissions_command_prints_what_docs_security_shows() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    shown = re.search(r"^authorization \{.*?^\} \} \] \}$", text, re.MULTILINE | re.DOTALL)
    assert shown, "no authorization block in docs/security.md"
    printed = subprocess.run(
        [sys.executable, "-m", "nats_spark.permissions", "ORDERS"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert printed.rstrip("\n") == shown.group(0) == authorization_block("ORDERS")
