"""The package's floors: every module imports only its own unit and the floors below it.

The order is the architecture (DESIGN.md, section 3, "Floors"); a new import that points
upward or sideways (to another unit of the same floor) fails here with the module and the line.
Every import counts, wherever it is written: at module level, inside a function or a method,
under ``if TYPE_CHECKING:`` (the AST is walked whole).
"""
import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cotsdl"

#: Lowest first.  Units are the top-level modules and subpackages of ``cotsdl``.  Units that share
#: a floor do not import each other.
FLOORS = [
    ("checks", "stops", "cudaemu"),   # plain checks; stop signals; the CUDA emulator
    ("progress",),                    # progress bars and lines (re-raise a swallowed stop: `stops`)
    ("backend",),                     # numpy / cuda / cuda-emu, kernel loading
    ("array",),                       # boxes, grids, distributed arrays, exchanges, collectives
    ("ops",),                         # filter, pool, LCN on either backend
    ("io", "nn"),                     # datasets and checkpoints; layers, networks, the network plan
    ("planner",),                     # the run planner (given the optimizer's slot count, never the registry)
    ("train",),                       # the trainer (`overlap = "auto"` asks the planner)
    ("evaluate", "bench"),            # the face experiment; benchmarks
    ("tools",),                       # developer tooling: the NVRTC binding, `cotsdl check-kernels`
    ("cli",),                         # the command
    ("__main__",),                    # `python -m cotsdl`
]
LEVEL = {unit: k for k, units in enumerate(FLOORS) for unit in units}


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0].removesuffix(".py")


def imports_in(source: str, pkg: list[str]):
    """(line, unit) of every import of a cotsdl unit in ``source``, a module of package ``pkg`` (its
    folders under ``cotsdl/``), at any depth: module level, functions, methods, conditionals."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                parts = base + [p for p in (node.module or "").split(".") if p]
                names = [parts[0]] if parts else [a.name for a in node.names]
            elif (node.module or "").split(".")[0] == "cotsdl":
                parts = node.module.split(".")[1:]
                names = [parts[0]] if parts else [a.name for a in node.names]
            else:
                continue
            for name in names:
                yield node.lineno, name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("cotsdl."):
                    yield node.lineno, a.name.split(".")[1]


def imported_units(path: Path):
    """(line, unit) of every import of another cotsdl unit in ``path``."""
    return imports_in(path.read_text(), list(path.relative_to(ROOT).parts[:-1]))


def violations(me: str, found) -> list[tuple[int, str]]:
    """The (line, unit) of ``found`` that ``me`` may not import: a unit on its own floor or above."""
    return [(line, other) for line, other in found if other in LEVEL and other != me and LEVEL[other] >= LEVEL[me]]


def test_every_unit_has_a_floor():
    units = {unit_of(p) for p in ROOT.rglob("*.py")} - {"__init__"}
    assert units <= set(LEVEL), f"give these a floor in FLOORS: {sorted(units - set(LEVEL))}"


def test_no_module_imports_its_own_floor_or_a_higher_one():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        me = unit_of(path)
        if me == "__init__":
            continue
        for line, other in violations(me, imported_units(path)):
            how = "a higher floor" if LEVEL[other] > LEVEL[me] else "its own floor"
            wrong.append(f"{path.relative_to(ROOT.parent)}:{line} ({me}) imports {other} ({how})")
    assert not wrong, "imports that do not point down:\n" + "\n".join(wrong)


def test_imports_inside_functions_count():
    """The import that once ran up a floor was inside a function (planner -> train.optim)."""
    source = textwrap.dedent('''
        from ..nn.network import Network

        def optimizer_slots(opt):
            from ..train.optim import slot_count  # noqa: PLC0415
            return slot_count(opt)

        class Later:
            def method(self):
                import cotsdl.evaluate.report
                from cotsdl import bench
                from . import machine
    ''')
    found = sorted(imports_in(source, ["planner"]))
    assert found == [(2, "nn"), (5, "train"), (10, "evaluate"), (11, "bench"), (12, "planner")]
    assert violations("planner", found) == [(5, "train"), (10, "evaluate"), (11, "bench")]
    assert violations("io", [(1, "nn")]) == [(1, "nn")]  # sideways: the same floor
