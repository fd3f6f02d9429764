"""Examples in docstrings run as doctests; every public name is documented."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import posenc as pe

MODULES = [
    importlib.import_module(f"posenc.{m.name}")
    for m in pkgutil.iter_modules(pe.__path__)
    if not m.name.startswith("_")
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_all_public_names_exist_and_are_documented():
    for name in pe.__all__:
        obj = getattr(pe, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


def test_every_module_all_is_reexported():
    for module in MODULES:
        for name in getattr(module, "__all__", []):
            if module.__name__ not in ("posenc.viz", "posenc.exercises"):
                assert getattr(pe, name) is getattr(module, name), name
