"""The package's shape: modules depend on each other without circles, reach no private
name of another module, and each fact has one table that the rest reads."""

import ast
from pathlib import Path

import llm_smolq
from llm_smolq import defaults
from llm_smolq._kernel import ffi
from llm_smolq.model.model_file import ARCHITECTURES, LAYER_TENSORS

PACKAGE = Path(llm_smolq.__file__).parent


def module_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package modules it imports (at run time or for
    type checking; a package's __init__ counts as its own module)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{name}: relative import; the package imports by absolute names")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_smolq"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


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
