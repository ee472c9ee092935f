"""The layout shows the architecture (docs/design.md): no import circles, and arrows only go down.

Every `import` in `sepo/` and `analysis/` counts, including those inside functions (a lazy import
hides a circle from Python, not from a reader). Layers, top to bottom: the run layer (entry point,
task wrapper, validation, sweeps, tracking), the stages, the library.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the run layer: the package `sepo.run` (entry point, config, task wrapper, sweeps), `python -m sepo`, and the
#: tracker the stages log to
RUN_LAYER = {"sepo.run", "sepo.__main__", "sepo.tracking"}
#: research tools built on top of everything, outside the package: the benchmarks and studies (`python -m
#: benchmarks ...`, `python -m benchmarks.<topic>.<script>`) and the launch scripts
TOOLS = {"benchmarks", "launch"}


def is_tool(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TOOLS)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for top in ("sepo", "analysis", *TOOLS) for p in (ROOT / top).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (`from a.b import c` counts a.b.c where that is a module)."""
    out = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out.update(n for n in names if n in modules)
    out.discard(module_name(path))
    return out


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imports_of(p, modules) for m, p in modules.items()}


def layer(module: str) -> str:
    if module in RUN_LAYER or module.startswith("sepo.run.") or is_tool(module):
        return "run"
    if module == "sepo.stages" or module.startswith("sepo.stages."):
        return "stages"
    if module.startswith("analysis"):
        return "analysis"
    return "library"


def test_no_import_circles():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(g[m]):
            # a package's __init__ importing its own submodules is how a registry fills itself
            if n.startswith(m + "."):
                continue
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n] if n in stack else [m, n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import circles: {cycles}"


def test_arrows_go_down():
    g = graph()
    rank = {"run": 0, "stages": 1, "analysis": 1, "library": 2}
    upward = [
        (m, n)
        for m, deps in g.items()
        for n in deps
        if rank[layer(n)] < rank[layer(m)] and not (layer(m) == "stages" and n == "sepo.tracking")
    ]
    assert not upward, f"the library imports the run layer or a stage: {upward}"


def test_the_sepo_loop_has_a_name_that_says_what_it_is():
    modules = project_modules()
    assert "sepo.sepo" not in modules
    assert "sepo.stages.sepo_loop" in modules
    assert {"sepo.training.objective", "sepo.games.kuhn.exact", "sepo.stages.sft"} <= set(modules)


def test_nothing_but_the_tools_imports_the_benchmarks():
    """The benchmarks sit beside the package, not in it: no library, stage, run-layer or analysis module
    imports them or the launch scripts (deleting benchmarks/ leaves every run working), and an installed
    wheel carries none of them."""
    g = graph()
    users = sorted((m, n) for m, deps in g.items() for n in deps if is_tool(n) and not is_tool(m))
    assert not users, f"imports of the tools from outside them: {users}"
    assert "benchmarks.gpu.full_size" in g
    assert not [m for m in g if m.startswith("sepo.") and "bench" in m], "no benchmark inside the package"
    assert len((ROOT / "benchmarks" / "__main__.py").read_text().splitlines()) <= 60, "only a command line"


def test_test_modules_share_fixtures_through_conftest_only():
    """No test module defines a fixture that conftest.py defines (one would shadow the other), and none
    imports from another test module (shared helpers live in conftest.py)."""
    tests = ROOT / "tests"

    def fixtures(path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if isinstance(target, ast.Attribute) and target.attr == "fixture":
                        out.add(node.name)
        return out

    shared = fixtures(tests / "conftest.py")
    shadowed = {p.name: sorted(fixtures(p) & shared) for p in tests.glob("test_*.py") if fixtures(p) & shared}
    assert not shadowed, f"fixtures that shadow conftest.py's: {shadowed}"
    cross = sorted(
        p.name
        for p in tests.glob("test_*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level and (node.module or "").startswith("test_")
    )
    assert not cross, f"test modules importing another test module: {cross}"


def test_dotted_keys_and_leaves_of_a_config_tree():
    from sepo.trees import dotted_keys, leaves

    tree = {"a": 1, "b": {"c": 2, "d": {"e": None}}, "f": {}}
    assert dotted_keys(tree) == ["a", "b", "b.c", "b.d", "b.d.e", "f"]
    assert leaves(tree) == {"a": 1, "b.c": 2, "b.d.e": None}  # an empty node has no leaf


def test_the_language_model_layer_sits_below_policies_and_training():
    """`sepo.lm` imports nothing else of the project but its errors and section timers, and the agent that
    plays (`sepo.policies`) does not reach into training for what both share: that lives in the layer below."""
    g = graph()
    allowed = ("sepo.lm", "sepo.errors", "sepo.profiling")
    lm_imports = sorted(
        (m, n) for m, deps in g.items() if m.startswith("sepo.lm") for n in deps if not n.startswith(allowed)
    )
    assert not lm_imports, f"the language-model layer imports the project: {lm_imports}"
    policies_on_training = sorted(
        (m, n) for m, deps in g.items() if m.startswith("sepo.policies") for n in deps if n.startswith("sepo.training")
    )
    assert not policies_on_training, f"policies import training: {policies_on_training}"


def test_games_sit_below_the_agents_that_play_them():
    """A game's rules know nothing of the agents: reading a policy's table at Kuhn's information sets lives with
    the policies (`sepo.policies.played_table`), which import the games."""
    g = graph()
    games_on_policies = sorted(
        (m, n) for m, deps in g.items() if m.startswith("sepo.games") for n in deps if n.startswith("sepo.policies")
    )
    assert not games_on_policies, f"games import policies: {games_on_policies}"


def test_the_stages_hand_their_run_dirs_to_the_analysis_through_the_run_layer():
    """The pipeline's tables are a hook the run layer sets (`sepo.stages.pipeline.tables_hook`): no stage imports
    the analysis, which reads run dirs written by any stage."""
    g = graph()
    stages_on_analysis = sorted(
        (m, n) for m, deps in g.items() if layer(m) == "stages" for n in deps if layer(n) == "analysis"
    )
    assert not stages_on_analysis, f"stages import the analysis: {stages_on_analysis}"


#: the most lines a module of the package, and a function in it, may have: past them a module holds more than
#: one job, and a function more than one step of its caller's table of contents
MODULE_LINES, FUNCTION_LINES = 400, 60


def test_modules_and_functions_stay_small():
    too_long = []
    for module, path in project_modules().items():
        if not module.startswith("sepo"):
            continue
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            too_long.append(f"{module}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    too_long.append(f"{module}.{node.name}: {length} lines")
    assert not too_long, too_long
