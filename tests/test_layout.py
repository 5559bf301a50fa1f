"""The package's shape: modules depend on each other without circles, reach no private
name of another module, and each fact has one table that the rest reads."""

import ast
from pathlib import Path

import llm_smolq
from llm_smolq import defaults
from llm_smolq._kernel import ffi
from llm_smolq.model.model_file import ARCHITECTURES, LAYER_TENSORS

PACKAGE = Path(llm_smolq.__file__).parent


# The layers, lowest first. A module may import from its own layer and the ones below it,
# never from one above: not at the top of the file, not inside a function, not for type
# checking. "pkg.*" is the package and every module in it; a plain name is that module
# alone ("llm_smolq" is the package's __init__: the Python API, load and Engine). The
# compiled kernel, llm_smolq._kernel, lies below them all.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["llm_smolq.errors", "llm_smolq.defaults", "llm_smolq.paths",  # the one tables
              "llm_smolq.pages"]),  # and the system's memory pages
    ("cache", ["llm_smolq.cache.*"]),  # header cache, packed weights, kernel identity, atomic writes
    ("model", ["llm_smolq.model.*"]),  # the GGUF header, the model description, the tokenizer
    ("engine", ["llm_smolq.engine.*", "llm_smolq.kernel", "llm_smolq"]),  # eval, KV cache, kernel calls
    ("decode", ["llm_smolq.decode.*"]),  # sampling, the generate loop, drafts, constraints
    ("chat", ["llm_smolq.chat.*"]),  # the chat template, <think>, tool calls
    ("store", ["llm_smolq.store.*"]),  # the catalog of model files, downloads, the prompt cache
    ("plugin", ["llm_smolq.plugin.*"]),  # the llm hooks and `llm smolq`
    ("dev", ["llm_smolq.dev.*"]),  # benchmarks, fuzzer, synthetic models: never imported below
]


def package_modules() -> dict[str, Path]:
    """Each module of the package by its dotted name (a package's __init__ by the package's)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_in(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, package module) for every import in the file, wherever it stands: at the top,
    inside a function, under `if TYPE_CHECKING`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{name}: relative import; the package imports by absolute names")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_smolq"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append((node.lineno, full if full in modules else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in modules]
    return sorted((line, dep) for line, dep in found if dep in modules and dep != name)


def module_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package modules it imports (at run time or for
    type checking; a package's __init__ counts as its own module)."""
    modules = package_modules()
    return {name: {dep for _, dep in imports_in(name, path, modules)} for name, path in modules.items()}


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer that holds module; a KeyError for one no layer names."""
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member.removesuffix(".*") or (member.endswith(".*") and module.startswith(member[:-1])):
                return index
    raise KeyError(module)


def layer_violations(modules: dict[str, Path]) -> list[str]:
    """Every import from a lower layer to a higher one, as "file:line: what, and the rule"."""
    order = " < ".join(layer for layer, _ in LAYERS)
    found = []
    for name, path in sorted(modules.items()):
        for line, dep in imports_in(name, path, modules):
            if layer_of(dep) > layer_of(name):
                low, high = LAYERS[layer_of(name)][0], LAYERS[layer_of(dep)][0]
                where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
                found.append(f"{where}:{line}: {name} ({low}) imports {dep} ({high}); "
                             f"a module imports only from its own layer or a lower one: {order}")
    return found


def test_no_module_imports_itself_through_others():
    graph = module_imports()
    assert len(graph) > 30  # the walk found the package
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_every_module_has_one_layer():
    modules = package_modules()
    unplaced = []
    for name in sorted(modules):
        try:
            layer_of(name)
        except KeyError:
            unplaced.append(name)
    assert not unplaced, f"no layer in tests/test_layout.py's LAYERS holds {unplaced}: place them there"
    members = [m for _, layer in LAYERS for m in layer]
    assert len(members) == len(set(members))


def test_no_module_imports_from_a_higher_layer():
    found = layer_violations(package_modules())
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_the_layer_check_catches_an_import_up_the_layers(tmp_path):
    # a cache module that reaches the model through a function-level import, and one that
    # does for type checking only: both are named, with their lines
    modules = package_modules()
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from llm_smolq.engine.engine import Engine\n\n"
                   "def f():\n    from llm_smolq.model import model_file\n")
    modules["llm_smolq.cache.bad"] = bad
    found = [v for v in layer_violations(modules) if "llm_smolq.cache.bad" in v]
    assert len(found) == 2
    assert ":4: llm_smolq.cache.bad (cache) imports llm_smolq.engine.engine (engine)" in found[0]
    assert ":7: llm_smolq.cache.bad (cache) imports llm_smolq.model.model_file (model)" in found[1]
    assert "a module imports only from its own layer or a lower one: base < cache < model" in found[0]


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_smolq"):
                found += [f"{path.relative_to(PACKAGE)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and a.name != "_kernel"]
    assert not found


def test_every_exception_class_lives_in_errors():
    defined = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id in ("Exception",))
                    for b in node.bases) and not node.name.startswith("_"):
                defined.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    elsewhere = [d for d in defined if not d.startswith("errors.py:") and not d.startswith("dev/")]
    assert any(d.startswith("errors.py:") for d in defined) and not elsewhere, elsewhere


def test_the_layer_tensor_table_names_every_tensor_field_the_kernel_reads():
    # smolq.h's sq_layer holds one sq_tensor per weight, in the table's order
    tensor = ffi.typeof("sq_tensor")
    fields = [name for name, f in ffi.typeof("sq_layer").fields if f.type == tensor]
    assert len(fields) == 9 and [t.field for t in LAYER_TENSORS] == fields
    assert len({t.name for t in LAYER_TENSORS}) == len(LAYER_TENSORS)


def test_every_architecture_has_the_model_cards_sampling_defaults():
    assert set(defaults.SAMPLING_BY_ARCH) == set(ARCHITECTURES)
    for card in defaults.SAMPLING_BY_ARCH.values():
        assert set(card) == {"temperature", "top_p"} and 0 < card["top_p"] <= 1 and card["temperature"] >= 0


def test_the_readme_and_benchmarks_stay_a_short_read():
    """README.md is for users (200 lines at most; the rest is in docs/), BENCHMARKS.md the
    current state (300 lines at most; history is in git log)."""
    root = Path(llm_smolq.__file__).resolve().parent.parent
    for name, most in (("README.md", 200), ("BENCHMARKS.md", 300)):
        lines = len((root / name).read_text().splitlines())
        assert lines <= most, f"{name} has {lines} lines, more than {most}: move detail to docs/ or shorten it"
