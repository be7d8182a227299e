"""The package's modules import each other along the data flow, never in a circle."""

import ast
import pathlib

import keras_pipeline_tuner

PACKAGE = pathlib.Path(keras_pipeline_tuner.__file__).parent
NAME = "keras_pipeline_tuner"


def module_name(path: pathlib.Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """Every import between the package's own modules: module level, in functions,
    and under `if TYPE_CHECKING:` alike."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from package import module` names a module; otherwise the module itself.
                targets = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in modules and target != name and target != NAME:
                    edges[name].add(target)
    return edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_check_finds_a_cycle():
    # The check itself can fail: a made-up circle of three is found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_evidence_never_imports_judgement_or_outputs():
    edges = import_graph()
    evidence = ("timing", "profiling", "pipeline")
    later = ("advice", "outputs", "run")
    for name, targets in edges.items():
        if name.split(".")[1:2] and name.split(".")[1] in evidence:
            wrong = [t for t in targets if t.split(".")[1] in later]
            assert not wrong, f"{name} imports {wrong}"
