"""Config files: defaults, --set overrides, and one clear message per mistake."""
import tomllib
from pathlib import Path

import pytest

from cotsdl.cli import config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "jobs" / "configs" / "demo.toml"


def test_every_sample_config_is_valid_and_round_trips():
    samples = sorted((ROOT / "jobs" / "configs").glob("*.toml"))
    assert DEMO in samples
    for path in samples:
        cfg = config.load(path)
        assert config.validate(tomllib.loads(config.dumps(cfg, "header"))) == cfg, path.name


def test_defaults_are_filled_in():
    cfg = config.load(DEMO)
    assert cfg["train"]["optimizer"]["beta2"] == 0.999  # the kind's own defaults
    assert cfg["network"]["stages"][0]["filter"]["block"] == [1, 1]
    assert cfg["train"]["schedule"]["start_factor"] == 0.0 and cfg["train"]["schedule"]["min_lr"] == 0.0
    bare = config.load(DEMO, ["train.schedule={}"])  # no schedule given: a constant learning rate
    assert bare["train"]["schedule"] == {"kind": "constant", "warmup_steps": 0, "start_factor": 0.0}
    assert cfg["parallel"] == {"replicas": 1, "grid": "auto", "overlap": "auto", "reduction": "auto", "fuse": "auto",
                               "fuse_filter": "auto"}


@pytest.mark.parametrize("text, value", [('"auto"', "auto"), ('"on"', "on"), ("off", "off"), ("[0]", [0]),
                                         ("[]", [])])
def test_fuse_is_auto_on_off_or_stages(text, value):
    assert config.load(DEMO, [f"parallel.fuse={text}"])["parallel"]["fuse"] == value


@pytest.mark.parametrize("text", ["true", "[-1]", '"some"', "[0.5]"])
def test_a_bad_fuse_names_the_key_and_the_value(text):
    with pytest.raises(config.ConfigError, match=r"parallel\.fuse.*must be one of"):
        config.load(DEMO, [f"parallel.fuse={text}"])


@pytest.mark.parametrize("text, value", [('"auto"', "auto"), ('"on"', "on"), ("off", "off"), ("[0]", [0])])
def test_fuse_filter_is_auto_on_off_or_stages(text, value):
    assert config.load(DEMO, [f"parallel.fuse_filter={text}"])["parallel"]["fuse_filter"] == value


@pytest.mark.parametrize("text", ["true", "[-1]", '"some"'])
def test_a_bad_fuse_filter_names_the_key_and_the_value(text):
    with pytest.raises(config.ConfigError, match=r"parallel\.fuse_filter.*must be one of"):
        config.load(DEMO, [f"parallel.fuse_filter={text}"])


@pytest.mark.parametrize("fuse, filters, message", [
    ("[0]", "[1]", r"parallel\.fuse_filter: stage 1's filter joins its pool and LCN only where they are fused; "
                   r"parallel\.fuse fuses \[0\]"),
    ('"off"', '"on"', None), ('"auto"', "[5]", r"parallel\.fuse_filter: stage 5 is not a stage of the network"),
    ("[7]", '"auto"', r"parallel\.fuse: stage 7 is not a stage of the network")])
def test_fuse_filter_is_checked_against_the_network_and_fuse_when_read(fuse, filters, message):
    from cotsdl.cli import run

    over = [f"parallel.fuse={fuse}", f"parallel.fuse_filter={filters}"]
    if message is None:  # "on" with nothing fused: no filter joins anything
        assert run.read(DEMO, over).parallel.fuse_filter == "on"
        return
    with pytest.raises(config.ConfigError, match=str(DEMO).replace(".", r"\.") + ": " + message):
        run.read(DEMO, over)


@pytest.mark.parametrize("text, value", [('"auto"', "auto"), ("true", True), ("false", False)])
def test_overlap_is_auto_true_or_false(text, value, tmp_path):
    assert config.load(DEMO, [f"parallel.overlap={text}"])["parallel"]["overlap"] == value
    path = tmp_path / "c.toml"
    path.write_text(DEMO.read_text().replace("[parallel]", f"[parallel]\noverlap = {text}", 1))
    assert config.load(path)["parallel"]["overlap"] == value
    assert config.load(DEMO, ["parallel.overlap=auto"])["parallel"]["overlap"] == "auto"  # a bare word: a string


def test_set_overrides_any_key():
    cfg = config.load(DEMO, ["network.stages[1].filter.channels=5", "train.steps=7", "run.folder=runs/x",
                             "train.optimizer.kind=\"momentum\"", "train.optimizer.momentum=0.5",
                             "train.schedule.kind=\"cosine\"", "train.schedule.total_steps=70", "parallel.grid=[1, 2]"])
    assert cfg["network"]["stages"][1]["filter"]["channels"] == 5
    assert cfg["train"]["steps"] == [7, 7]  # one number: every stage (the demo has two)
    assert cfg["run"]["folder"] == "runs/x"  # a bare word is a string
    lr = config.load(DEMO)["train"]["optimizer"]["lr"]  # kept; adam's beta1, beta2, eps are no longer allowed
    assert cfg["train"]["optimizer"] == {"kind": "momentum", "lr": lr, "weight_decay": 0.0, "clip_norm": None,
                                         "momentum": 0.5}
    assert cfg["train"]["schedule"]["total_steps"] == 70 and cfg["parallel"]["grid"] == [1, 2]


@pytest.mark.parametrize("override, message", [
    ("network.stages[0].filter.chanels=3", "unknown key network.stages[0].filter.chanels; did you mean 'channels'?"),
    ("network.stages[0].filter.stride=[2.5, 2]",
     "network.stages[0].filter.stride = [2.5, 2]: must be a list of 2 integers >= 1"),
    ("network.stages[1].filter.channels=5.7", "network.stages[1].filter.channels = 5.7: must be an integer >= 1"),
    ("network.stages[0].lcn.size=4", "network.stages[0].lcn.size = 4: must be an odd integer >= 1"),
    ("network.input=[48, 48]", "network.input = [48, 48]: must be a list of 3 integers >= 1"),
    ('train.optimizer.lr="0.01"', 'train.optimizer.lr = "0.01": must be a number > 0'),
    ("train.optimizer.kind=\"sgdd\"", 'train.optimizer.kind = "sgdd": must be one of "sgd", "momentum"'),
    ("train.optimizer.momentum=0.9", "unknown key train.optimizer.momentum (allowed: kind, lr, weight_decay, "
                                     "clip_norm, beta1, beta2, eps)"),
    ("train.steps=-3", "train.steps = -3: must be an integer >= 0, or a list of them (one per stage)"),
    ("train.steps=[10, 10, 10]", "train.steps = [10, 10, 10]: needs one entry per stage (2)"),
    ("train.epochs=1", "give exactly one of train.steps and train.epochs"),
    ("train.checkpoint_every=-1", "train.checkpoint_every = -1: must be an integer >= 0"),
    ("train.tied=1", "train.tied = 1: must be true or false"),
    ("data.preprocess=whiten", 'data.preprocess = "whiten": must be one of "standardize", "center", "none"'),
    ("data.batch=0", "data.batch = 0: must be an integer >= 1"),
    ("parallel.grid=[2]", 'parallel.grid = [2]: must be one of "auto" or a list of 2 integers >= 1'),
    ("parallel.overlap=sometimes", 'parallel.overlap = "sometimes": must be one of "auto" or true or false'),
    ("parallel.overlap=1", "parallel.overlap = 1: must be one of \"auto\" or true or false"),
    ("parallel.reduction=tree", 'parallel.reduction = "tree": must be one of "auto", "flat", "two-level"'),
    ("parallel.replica=2", "unknown key parallel.replica; did you mean 'replicas'?"),
    ("trian.steps=3", "unknown key trian; did you mean 'train'?"),
    ("network.stages[5].filter.channels=2", "network.stages[5].filter.channels has no element [5]"),
    ("train.steps", "expected KEY.PATH=VALUE"),
])
def test_each_mistake_gets_its_message(override, message):
    with pytest.raises(config.ConfigError) as e:
        config.load(DEMO, [override])
    assert message in str(e.value)
    assert str(e.value).startswith(str(DEMO)) or str(e.value).startswith("--set")


def test_cross_key_checks():
    with pytest.raises(config.ConfigError, match=r"train.optimizer.nesterov = true: needs train.optimizer.momentum > 0"):
        config.load(DEMO, ['train.optimizer={kind = "sgd", nesterov = true}'])
    assert config.load(DEMO, ['train.optimizer={kind = "sgd", nesterov = true, momentum = 0.5}'])


def test_strings_with_control_characters_round_trip():
    cfg = config.load(DEMO, ['run.folder="runs/a\\nb\\t\\u0001\\"q\\\\"'])
    assert cfg["run"]["folder"] == 'runs/a\nb\t\x01"q\\'
    assert config.validate(tomllib.loads(config.dumps(cfg))) == cfg


def test_file_errors(tmp_path):
    with pytest.raises(config.ConfigError, match="config .*nope.toml: no such file"):
        config.load(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[data]\nfile = \n")
    with pytest.raises(config.ConfigError, match=r"bad.toml: not valid TOML: .*line 2"):
        config.load(tmp_path / "bad.toml")
    text = DEMO.read_text().replace('[run]\nfolder = "runs/demo"', "[run]")
    (tmp_path / "norun.toml").write_text(text)
    with pytest.raises(config.ConfigError, match=r"norun.toml: run.folder is required"):
        config.load(tmp_path / "norun.toml")


def test_optimizers_and_schedules_come_from_their_registries():
    """One list each: the config's kinds and keys, its errors, ``cotsdl train --help`` and the constructors'
    ranges are the registries' (train.optim.OPTIMIZERS, train.schedules.SCHEDULES, checks.Param)."""
    import subprocess
    import sys

    from cotsdl.train import optim, schedules

    assert set(config.OPTIMIZER_KEYS) == set(optim.OPTIMIZERS)
    assert set(config.SCHEDULE_KEYS) == set(schedules.SCHEDULES)
    with pytest.raises(config.ConfigError) as bad:
        config.load(DEMO, ["train.optimizer.kind=adamw"])
    assert all(f'"{k}"' in str(bad.value) for k in optim.OPTIMIZERS)
    # a range is written once: the config and the constructor say the same
    with pytest.raises(config.ConfigError, match=r"train.optimizer.momentum = 1.0: must be a number >= 0 and < 1"):
        config.load(DEMO, ["train.optimizer={kind = \"momentum\", momentum = 1.0}"])
    with pytest.raises(ValueError, match=r"momentum must be a number >= 0 and < 1, got 1.0"):
        optim.Momentum(0.01, momentum=1.0)
    text = subprocess.run([sys.executable, "-m", "cotsdl", "train", "--help"], capture_output=True, text=True).stdout
    flat = " ".join(text.split())
    for name, (_, keys) in {**optim.OPTIMIZERS, **schedules.SCHEDULES}.items():
        assert f"{name} ({', '.join(keys) or 'no keys'})" in flat, name


def test_what_would_fail_later_is_rejected_when_the_config_is_read(tmp_path):
    from cotsdl.cli import run

    with pytest.raises(config.ConfigError, match=r"pool.eps = 0.0: must be a number > 0"):
        config.load(DEMO, ["network.stages[0].pool.eps=0.0"])
    assert config.load(DEMO, ["network.stages[0].pool={size = [2, 2], stride = [2, 2]}"])[
        "network"]["stages"][0]["pool"]["eps"] == 0.01  # the default trains
    with pytest.raises(config.ConfigError, match=r"stages\[0\].filter: its 7x7 windows at stride 2x2 over a 32x32 "
                                                 r"input leave 1 row\(s\) and 1 column\(s\) unread"):
        run.read(DEMO, ["network.stages[0].filter.stride=[2, 2]", "network.stages[1].filter.size=[3, 3]"])
    cropped = run.read(DEMO, ["network.stages[0].filter.stride=[2, 2]", "network.stages[1].filter.size=[3, 3]",
                              "network.allow_crop=true"])
    assert cropped.network.unused_input()[0][1:] == (1, 1)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(DEMO.read_bytes().replace(b"[data]", b"# caf\xe9\n[data]", 1))
    with pytest.raises(config.ConfigError, match=f"config {bad}: not UTF-8 text"):
        config.load(bad)


def test_a_byte_order_mark_is_named(tmp_path):
    """Saved "UTF-8 with BOM", a config used to be refused as "Invalid statement (at line 1, column 1)",
    naming nothing one can see."""
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + DEMO.read_bytes())
    with pytest.raises(config.ConfigError) as e:
        config.load(bom)
    assert str(e.value).startswith(f"config {bom}: starts with a UTF-8 byte-order mark (the invisible bytes EF BB BF")
    assert "save the file as UTF-8 without a BOM" in str(e.value)
    inside = tmp_path / "inside.toml"  # elsewhere it is a character like any other: TOML's own message
    inside.write_bytes(DEMO.read_bytes().replace(b"[data]", b"\xef\xbb\xbf[data]", 1))
    with pytest.raises(config.ConfigError, match=f"config {inside}: not valid TOML"):
        config.load(inside)


def test_a_decaying_schedule_whose_warmup_outlasts_it_is_refused():
    """Cosine warming up for 50 steps of 5 trained every step at rate 0 and reported success."""
    from cotsdl.cli import run

    with pytest.raises(config.ConfigError) as e:
        run.read(DEMO, ["train.steps=[5,5]", "train.schedule.total_steps=5"])
    assert str(e.value).startswith(f"{DEMO}: train.optimizer / train.schedule: warmup_steps = 50 must be less than "
                                   "total_steps = 5 of the cosine schedule")
    assert "min_lr = 0" in str(e.value)
    assert run.read(DEMO, ["train.steps=[5,5]", "train.schedule.total_steps=5", "train.schedule.warmup_steps=2"])


def test_a_set_value_is_named_as_typed_and_floats_beyond_float32_are_refused():
    """std_floor divides float32 images: 1e-300 would round to 0 (every constant image NaN, blamed on
    the data) and 1e300 to infinity; the message names the --set as typed (1e300, not 1e+300)."""
    for typed in ("1e-300", "1e300"):
        with pytest.raises(config.ConfigError) as e:
            config.load(DEMO, [f"data.std_floor={typed}"])
        assert str(e.value) == f"--set data.std_floor = {typed}: must be a number >= 1e-30 and <= 1e+30"
    from cotsdl.io.reader import STD_FLOOR

    with pytest.raises(ValueError, match=r"std_floor must be a number >= 1e-30 and <= 1e\+30, got 1e-300"):
        STD_FLOOR.check("std_floor", 1e-300)
