"""The groups library's public names: `nats_spark.pcg` imports them lazily, and lists them three
times (for type checkers, for the lazy import, and `__all__`); the three must agree."""

import ast
import importlib
import inspect

import pytest

import nats_spark.pcg as pcg

pytestmark = pytest.mark.unit


def type_checking_names() -> set[str]:
    """The names the package imports under `if TYPE_CHECKING:`, read from its source."""
    tree = ast.parse(inspect.getsource(pcg))
    guard = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_three_lists_of_public_names_agree() -> None:
    assert type_checking_names() == set(pcg.__all__)
    assert set(pcg._HOMES) | {"admin"} == set(pcg.__all__)


@pytest.mark.parametrize("name", sorted(pcg._HOMES))
def test_each_public_name_is_the_one_its_module_defines(name: str) -> None:
    home = importlib.import_module(f"nats_spark.pcg.{pcg._HOMES[name]}")
    assert getattr(pcg, name) is getattr(home, name)
    assert name in dir(pcg)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'consumer'"):
        _ = pcg.consumer
