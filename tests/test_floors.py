"""The package's floors: every module imports only its own floor and the floors below it.

The order is the architecture (docs/design.md, "Floors"); a new import that points
upward fails here with the module and the line.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cotsdl"

#: Lowest first.  Units are the top-level modules and subpackages of ``cotsdl``.
FLOORS = [
    ("checks", "progress", "stops", "cudaemu"),  # plain checks; progress bars and lines; stop signals; the CUDA emulator
    ("backend",),                     # numpy / cuda / cuda-emu, kernel loading
    ("array",),                       # boxes, grids, distributed arrays, exchanges, collectives
    ("ops",),                         # filter, pool, LCN on either backend
    ("io", "nn"),                     # datasets and checkpoints; layers, networks, the network plan
    ("train", "planner"),             # the trainer; the run planner
    ("evaluate", "bench"),            # the face experiment; benchmarks
    ("tools",),                       # developer tooling: the NVRTC binding, `cotsdl check-kernels`
    ("cli", "__main__"),              # the command
]
LEVEL = {unit: k for k, units in enumerate(FLOORS) for unit in units}


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0].removesuffix(".py")


def imported_units(path: Path):
    """(line, unit) of every import of another cotsdl unit in ``path``."""
    pkg = list(path.relative_to(ROOT).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_every_unit_has_a_floor():
    units = {unit_of(p) for p in ROOT.rglob("*.py")} - {"__init__"}
    assert units <= set(LEVEL), f"give these a floor in FLOORS: {sorted(units - set(LEVEL))}"


def test_no_module_imports_a_higher_floor():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        me = unit_of(path)
        if me == "__init__":
            continue
        for line, other in imported_units(path):
            if other in LEVEL and other != me and LEVEL[other] > LEVEL[me]:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} ({me}) imports {other}")
    assert not upward, "imports of a higher floor:\n" + "\n".join(upward)
