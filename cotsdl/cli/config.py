"""Training configs: TOML files checked against a schema, with defaults and ``--set`` overrides.

The only place that reads config files.  ``load(path, overrides)`` returns the
*resolved* config (every default filled in) as plain data, or raises
:class:`ConfigError` naming the file, the key path (``network.stages[1].filter.stride``),
the value and what is allowed; an unknown key is an error with a did-you-mean
suggestion.  ``dumps`` writes a resolved config back as TOML (the run folder's
``config.toml``).
"""
from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..backend import BACKENDS
from ..checks import REQUIRED, Param
from ..io.reader import STD_FLOOR
from ..planner.reduction import REDUCTIONS
from ..train import optim, schedules


class ConfigError(ValueError):
    """A config that cannot be used: names the file, key path, value and what is allowed."""


@dataclass(frozen=True)
class Key:
    """One key: a checker (value -> error text or None), a default, a description."""

    check: Callable[[Any], str | None]
    default: Any = REQUIRED
    doc: str = ""


# -- checkers (each returns what is allowed when the value is not) -------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
    def check(v):
        if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f" >= {lo}" if hi is None and lo is not None else (f" in [{lo}, {hi}]" if hi is not None else "")
            return f"must be an integer{rng}"
        return None
    return check


def number(lo: float | None = None, lo_open: bool = False, hi: float | None = None, hi_open: bool = False):
    def check(v):
        bad = not _is_num(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (
            hi is not None and (v >= hi if hi_open else v > hi))
        if bad:
            parts = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + (
                [f"{'<' if hi_open else '<='} {hi}"] if hi is not None else [])
            return "must be a number" + (" " + " and ".join(parts) if parts else "")
        return None
    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def string(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "must be a non-empty string"


def choice(*allowed: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in allowed else "must be one of " + ", ".join(f'"{a}"' for a in allowed)


def ints(n: int, lo: int = 1) -> Callable[[Any], str | None]:
    def check(v):
        ok = isinstance(v, list) and len(v) == n and all(_is_int(x) and x >= lo for x in v)
        return None if ok else f"must be a list of {n} integers >= {lo}"
    return check


def per_stage(item: Callable[[Any], str | None], what: str) -> Callable[[Any], str | None]:
    """A value for every stage, or a list with one per stage (the length is checked later)."""
    def check(v):
        vals = v if isinstance(v, list) else [v]
        ok = len(vals) >= 1 and all(item(x) is None for x in vals)
        return None if ok else f"must be {what}, or a list of them (one per stage)"
    return check


def odd_size(off: bool = False) -> Callable[[Any], str | None]:
    """An odd window width >= 1 (an LCN's), or also 0 meaning "off"."""
    def check(v: Any) -> str | None:
        if _is_int(v) and ((v >= 1 and v % 2) or (off and v == 0)):
            return None
        return "must be 0 (off) or an odd integer >= 1" if off else "must be an odd integer >= 1"
    return check


def stage_list(v: Any) -> str | None:
    """A list of stage indices (integers >= 0; checked against the network later)."""
    ok = isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v)
    return None if ok else "must be a list of stage indices (integers >= 0)"


def either(*checks: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check(v):
        errs = [c(v) for c in checks]
        return None if any(e is None for e in errs) else " or ".join(e.removeprefix("must be ") for e in errs)
    return lambda v: (None if (e := check(v)) is None else "must be " + e)


# -- the schema --------------------------------------------------------------------
STAGE = {
    "filter": {"size": Key(ints(2), doc="receptive field [rh, rw]"),
               "stride": Key(ints(2), doc="[sh, sw]"),
               "block": Key(ints(2), [1, 1], "[bh, bw] neurons per site sharing a field"),
               "channels": Key(integer(1), doc="K: maps per block")},
    "pool": {"size": Key(ints(2), doc="[ph, pw]"),
             "stride": Key(ints(2), doc="[qh, qw]"),
             "eps": Key(number(0, lo_open=True), 0.01, "inside the square root (> 0: training differentiates "
                        "through it)")},
    "lcn": {"size": Key(odd_size(), doc="odd Gaussian window width"),
            "sigma": Key(number(0, lo_open=True), doc="Gaussian std"),
            "eps": Key(number(0), 1e-4, "floor of the divisor")},
}

def _key(p: Param) -> Key:
    """A config key from a hyper-parameter's one definition (``checks.Param``)."""
    return Key(p.problem, p.default, p.doc)


# The optimizer and schedule keys come from their registries (train.optim, train.schedules).
OPTIMIZER_KEYS: dict[str, dict[str, Key]] = {name: {k: _key(p) for k, p in keys.items()}
                                             for name, (_, keys) in optim.OPTIMIZERS.items()}
OPTIMIZER_COMMON = {"kind": Key(choice(*OPTIMIZER_KEYS), "momentum", "the paper's: momentum"),
                    **{k: _key(p) for k, p in optim.COMMON.items()}}
SCHEDULE_KEYS: dict[str, dict[str, Key]] = {name: {k: _key(p) for k, p in keys.items()}
                                            for name, (_, keys) in schedules.SCHEDULES.items()}
SCHEDULE_COMMON = {"kind": Key(choice(*SCHEDULE_KEYS), "constant"),
                   **{k: _key(p) for k, p in schedules.COMMON.items()}}

SCHEMA: dict[str, Any] = {
    "data": {"file": Key(string, doc="HDF5 dataset (relative paths: to the working directory)"),
             "batch": Key(integer(1), 16, "images per replica per step"),
             "seed": Key(integer(0), 0, "seed of the per-epoch shuffles"),
             "shuffle": Key(boolean, True),
             "preprocess": Key(choice("standardize", "center", "none"), "standardize"),
             "std_floor": _key(STD_FLOOR),
             "prefetch": Key(boolean, True, "read the next minibatch in a background thread"),
             "input_lcn": {"size": Key(odd_size(off=True), 0,
                                       "0: off; else LCN of every input image with this odd window width"),
                           "sigma": Key(number(0, lo_open=True), 2.0, "Gaussian std of the input LCN"),
                           "eps": Key(number(0), 1e-3, "floor of the input LCN's divisor")}},
    "network": {"input": Key(ints(3), doc="[H, W, C]"), "stages": [STAGE],
                "allow_crop": Key(boolean, False, "let a stride that does not tile its input drop the last "
                                  "rows/columns (otherwise an error)")},
    "parallel": {"replicas": Key(integer(1), 1, "data-parallel model groups"),
                 "grid": Key(either(choice("auto"), ints(2)), "auto", "[Py, Px] per model group"),
                 "overlap": Key(either(choice("auto"), boolean), "auto",
                                "compute interiors while halos travel (same results); \"auto\": where the run "
                                "planner predicts a gain (cotsdl.planner.overlap)"),
                 "fuse": Key(either(choice("auto", "on", "off"), stage_list), "auto",
                             "stages whose pool and LCN share one halo exchange (the pooled border computed "
                             "twice; the same results): \"auto\": where the run planner predicts a gain "
                             "(cotsdl.planner.fuse), \"on\", \"off\" or a list of stages"),
                 "fuse_filter": Key(either(choice("auto", "on", "off"), stage_list), "auto",
                                    "fused stages whose filter joins their pool and LCN while frozen (one exchange "
                                    "of the stage's input, the neighbours' weights fetched once; the same results): "
                                    "\"auto\": where the run planner predicts a gain (cotsdl.planner.fuse), \"on\": "
                                    "every fused stage, \"off\" or a list of fused stages"),
                 "reduction": Key(choice(*REDUCTIONS), "auto", "how replicas sum their gradients: " + "; ".join(
                     f"{k}: {v}" for k, v in REDUCTIONS.items()))},
    "train": {"steps": Key(per_stage(integer(0), "an integer >= 0"), None, "steps per stage (or epochs)"),
              "epochs": Key(per_stage(number(0), "a number >= 0"), None, "passes over the data per stage"),
              "lam": Key(number(0), 0.1, "weight of the sparsity term"),
              "tied": Key(boolean, True, "decoder weights = encoder weights"),
              "filter_norm": Key(per_stage(either(number(0, lo_open=True), choice("auto", "none")),
                                           'a number > 0, "auto" or "none"'), "auto",
                                 "every unit's filter kept at this L2 norm (\"auto\": 0.4 of the norm of unit "
                                 "reconstruction gain; \"none\": unconstrained)"),
              "seed": Key(integer(0), 0, "weight initialization"),
              "dtype": Key(choice("float32", "float64"), "float32"),
              "checkpoint_every": Key(integer(0), 100, "global steps between checkpoints (0: at the end only)"),
              "keep": Key(integer(1), 3, "checkpoints kept"),
              "log_every": Key(integer(0), 10, "steps between log lines"),
              "max_bad_steps": Key(integer(1), 5, "consecutive non-finite steps before stopping"),
              "optimizer": "optimizer", "schedule": "schedule"},
    "run": {"folder": Key(string, doc="the run folder (checkpoints, metrics, log)"),
            "backend": Key(choice("auto", *BACKENDS), "auto"),
            "threads": Key(integer(0), 0, "threads of the numpy backend per rank (0: cores / ranks per node)"),
            "graph": Key(boolean, False, "launch each step's device work (forward and backward) as one captured CUDA "
                         "graph (cuda backend; elsewhere, or where capture fails, eager, and the log says why)")},
}


def _fmt(v: Any) -> str:
    return dumps_value(v) if isinstance(v, (bool, int, float, str, list)) else repr(v)


class _Checker:
    def __init__(self, source: str, given: dict[str, str] | None = None):
        self.source, self.given = source, given or {}

    def fail(self, path: str, value: Any, what: str) -> None:
        if path in self.given:  # a value from the command line: named there, exactly as it was typed
            raise ConfigError(f"--set {path} = {self.given[path]}: {what}")
        raise ConfigError(f"{self.source}: {path} = {_fmt(value)}: {what}")

    def table(self, path: str, data: Any, schema: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ConfigError(f"{self.source}: {path or 'the config'} must be a table, got {_fmt(data)}")
        for k in data:
            if k not in schema:
                near = difflib.get_close_matches(k, list(schema), n=1)
                hint = f"; did you mean '{near[0]}'?" if near else f" (allowed: {', '.join(schema)})"
                raise ConfigError(f"{self.source}: unknown key {_join(path, k)}{hint}")
        out: dict[str, Any] = {}
        for k, spec in schema.items():
            sub = _join(path, k)
            if spec == "optimizer":
                out[k] = self.kinded(sub, data.get(k, {}), OPTIMIZER_COMMON, OPTIMIZER_KEYS)
            elif spec == "schedule":
                out[k] = self.kinded(sub, data.get(k, {}), SCHEDULE_COMMON, SCHEDULE_KEYS)
            elif isinstance(spec, list):
                items = data.get(k, REQUIRED)
                if items is REQUIRED:
                    raise ConfigError(f"{self.source}: {sub} is required")
                if not isinstance(items, list) or not items:
                    self.fail(sub, items, "must be a non-empty list of tables ([[" + sub + "]])")
                out[k] = [self.table(f"{sub}[{i}]", it, spec[0]) for i, it in enumerate(items)]
            elif isinstance(spec, dict):
                out[k] = self.table(sub, data.get(k, {}), spec)
            else:
                out[k] = self.key(sub, data.get(k, REQUIRED), spec)
        return out

    def key(self, path: str, value: Any, spec: Key) -> Any:
        if value is REQUIRED:
            if spec.default is REQUIRED:
                raise ConfigError(f"{self.source}: {path} is required" + (f" ({spec.doc})" if spec.doc else ""))
            return spec.default
        err = spec.check(value)
        if err:
            self.fail(path, value, err)
        return value

    def kinded(self, path: str, data: Any, common: dict[str, Key], kinds: dict[str, dict[str, Key]]) -> dict:
        if not isinstance(data, dict):
            raise ConfigError(f"{self.source}: {path} must be a table, got {_fmt(data)}")
        kind = self.key(_join(path, "kind"), data.get("kind", REQUIRED), common["kind"])
        return self.table(path, data, {**common, **kinds[kind]})


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(data: dict[str, Any], source: str = "config", given: dict[str, str] | None = None) -> dict[str, Any]:
    """The resolved config (defaults filled in), or :class:`ConfigError`; ``given`` maps the key paths
    set on the command line to their ``--set`` text (errors name it instead of the file)."""
    ck = _Checker(source, given)
    cfg = ck.table("", data, SCHEMA)
    tr, nstages = cfg["train"], len(cfg["network"]["stages"])
    if (tr["steps"] is None) == (tr["epochs"] is None):
        raise ConfigError(f"{source}: give exactly one of train.steps and train.epochs (per stage)")
    opt = tr["optimizer"]
    if opt["kind"] == "sgd" and opt["nesterov"] and not opt["momentum"]:
        ck.fail("train.optimizer.nesterov", True, "needs train.optimizer.momentum > 0")
    for name in ("steps", "epochs", "filter_norm"):
        v = tr[name]
        if isinstance(v, list) and len(v) != nstages:
            ck.fail(f"train.{name}", v, f"needs one entry per stage ({nstages})")
        if v is not None and not isinstance(v, list):
            tr[name] = [v] * nstages
    return cfg


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Key paths where two plain-data trees differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in diff(old.get(k), new.get(k), _join(path, k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and any(
            isinstance(v, (dict, list)) for v in old):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in diff(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {json.dumps(old)} -> {json.dumps(new)}"]


_PATH = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")


def apply_override(data: dict[str, Any], assignment: str) -> Any:
    """``key.path=value`` (TOML value; a bare word is a string), e.g. ``network.stages[1].filter.channels=8``;
    returns the value set."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment}: expected KEY.PATH=VALUE")
    path, text = (s.strip() for s in assignment.split("=", 1))
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    steps: list[str | int] = []
    for part in path.split("."):
        m = _PATH.fullmatch(part)
        if not m:
            raise ConfigError(f"--set {assignment}: bad key path {path!r}")
        steps.append(m.group(1))
        steps += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    node: Any = data
    for here, nxt in zip(steps, steps[1:]):
        if isinstance(here, int):
            if not isinstance(node, list) or here >= len(node):
                raise ConfigError(f"--set {assignment}: {path} has no element [{here}]")
            node = node[here]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"--set {assignment}: {path} does not name a table")
            node = node.setdefault(here, [] if isinstance(nxt, int) else {})
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"--set {assignment}: {path} has no element [{last}]")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"--set {assignment}: {path} does not name a table")
    return value


#: The UTF-8 byte-order mark: refused at the start of a config, by name (TOML has no place for it).
BOM = b"\xef\xbb\xbf"


def load(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """Read, override and validate a config file."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
        if raw.startswith(BOM):  # tomllib would say "Invalid statement (at line 1, column 1)": name it
            raise ConfigError(f"config {p}: starts with a UTF-8 byte-order mark (the invisible bytes EF BB BF that "
                              "some editors write first); TOML does not allow one: save the file as UTF-8 without "
                              "a BOM")
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config {p}: no such file") from None
    except OSError as e:
        raise ConfigError(f"config {p}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {p}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {p}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
    given = {}  # key path -> its value as typed (TOML; a bare word is shown as the string it became)
    for o in overrides:
        value = apply_override(data, o)
        path, text = (t.strip() for t in o.split("=", 1))
        given[re.sub(r"\s", "", path)] = text if not isinstance(value, str) or text.startswith(("'", '"')) \
            else _fmt(value)
    return validate(data, str(p), given)


# -- writing TOML (resolved configs only: tables, arrays of tables, plain values) ------
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}

def dumps_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):  # a TOML basic string: backslash, quote and control characters escaped
        return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 32 or ord(c) == 127 else c)
                             for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(dumps_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as a TOML value")


def dumps(cfg: dict[str, Any], header: str = "") -> str:
    """TOML text of a resolved config (``None`` values are left out: they mean 'not set')."""
    lines = [f"# {h}" for h in header.splitlines()]

    def emit(path: str, table: dict[str, Any], array: bool = False) -> None:
        plain = {k: v for k, v in table.items() if v is not None and not isinstance(v, dict)
                 and not (isinstance(v, list) and v and isinstance(v[0], dict))}
        if path:
            lines.append("")
            lines.append(f"[[{path}]]" if array else f"[{path}]")
        lines.extend(f"{k} = {dumps_value(v)}" for k, v in plain.items())
        for k, v in table.items():
            if array and isinstance(v, dict) and not any(isinstance(x, (dict, list)) and x and isinstance(
                    x, dict) for x in v.values()):  # a stage's layers read best one per line
                lines.append(f"{k} = {{ " + ", ".join(f"{a} = {dumps_value(b)}" for a, b in v.items()
                                                        if b is not None) + " }")
            elif isinstance(v, dict):
                emit(_join(path, k), v)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    emit(_join(path, k), item, array=True)

    emit("", cfg)
    return "\n".join(lines).lstrip("\n") + "\n"
