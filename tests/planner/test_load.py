"""The load of other processes: the /proc sampler, the machine file's ``load`` record and the warning
when the load now differs from the calibration's (no timing assertions: the load now is monkeypatched)."""
import json
import os
import socket
from pathlib import Path

import pytest

from cotsdl.planner import PRESETS, MachineError, choose_overlap, load_machine, validate_machine
from cotsdl.planner import load, machine as machine_mod
from cotsdl.planner.machine import LOAD_MARGIN, load_warning
from cotsdl.planner.overlap import with_load_warning

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "tests/planner/three_stage.toml")
LINUX = os.path.exists("/proc/stat")


def calibrated(busy, host=None, **extra):
    """The gtx680-fdr preset as if calibrated on ``host`` (default: this one) with ``busy`` other busy cores."""
    rec = {"host": socket.gethostname() if host is None else host, "other_busy_cores": busy, "cores_watched": 2,
           "seconds": 20.0, "loadavg1": 0.5, **extra}
    return validate_machine({**PRESETS["gtx680-fdr"], "name": "here", "load": rec})


@pytest.fixture
def no_measuring(monkeypatch):
    """The load now must not be measured (there is nothing to compare it with)."""
    def fail(*a, **k):
        raise AssertionError("load_now was called")
    monkeypatch.setattr(machine_mod, "load_now", fail)


@pytest.mark.skipif(not LINUX, reason="no /proc: every reading is None")
def test_the_sampler_returns_busy_cores_within_the_watched_ones():
    busy = load.measure(0.05)
    assert busy is not None and 0.0 <= busy <= len(load.watched_cpus())
    assert load.measure(0.05, pids=[os.getpid(), 999_999_999]) is not None  # a process gone counts 0
    snap = load.snapshot()
    assert snap.cpus == len(load.watched_cpus()) and snap.busy_ticks > 0 and snap.job_ticks >= 0
    rec = load.record(snap, load.snapshot())
    assert set(rec) == set(machine_mod.LOAD_KEYS) and rec["host"] == socket.gethostname()
    assert 0.0 <= rec["other_busy_cores"] <= rec["cores_watched"]


def test_other_busy_cores_subtracts_the_job_and_clamps(monkeypatch):
    tick = os.sysconf("SC_CLK_TCK")
    a = load.Snapshot(wall=10.0, busy_ticks=0, job_ticks=0, cpus=4)
    assert load.other_busy_cores(a, load.Snapshot(12.0, 3 * tick, tick, 4)) == pytest.approx(1.0)  # (3 - 1) s / 2 s
    assert load.other_busy_cores(a, load.Snapshot(11.0, tick, 2 * tick, 4)) == 0.0  # the job's time on other CPUs
    assert load.other_busy_cores(a, load.Snapshot(11.0, 9 * tick, 0, 4)) == 4.0  # never above the watched cores
    assert load.other_busy_cores(None, a) is None and load.other_busy_cores(a, a) is None


def test_no_proc_means_none(monkeypatch):
    def gone(*a, **k):
        raise OSError("no /proc here")
    monkeypatch.setattr(load, "_busy_ticks", gone)
    assert load.snapshot() is None and load.measure(0.0) is None
    rec = load.record(None, None)
    assert rec["other_busy_cores"] is None and rec["seconds"] is None
    validate_machine({**PRESETS["gtx680-fdr"], "load": rec})  # a file written there still loads


def test_warns_when_the_load_differs_and_not_when_it_matches():
    quiet = calibrated(0.0)
    w = load_warning(quiet, now=1.0)
    assert w == ("warning: machine here was calibrated with 0.0 other busy cores, now 1.0: predictions may be off; "
                 "recalibrate under the load you will run with (cotsdl bench calibrate)")
    assert load_warning(calibrated(1.2), now=0.1).startswith("warning: machine here was calibrated with 1.2")
    assert load_warning(quiet, now=LOAD_MARGIN - 0.01) is None
    assert load_warning(calibrated(0.9), now=1.0) is None


def test_warns_when_ranks_and_other_processes_crowd_the_cores():
    """Calibrated under the load of now, but the ranks and the other busy cores outnumber a CPU node's
    cores: the model does not time ranks sharing cores with other processes."""
    cpu = validate_machine({**calibrated(0.9), "kind": "cpu",
                            "device": {**PRESETS["gtx680-fdr"]["device"], "cores": 2}})
    w = load_warning(cpu, now=1.0, ranks_per_node=4)
    assert w == ("warning: 4 rank(s) share the 2 cores of machine here with other processes that keep 1.0 of them "
                 "busy: the model times ranks sharing cores with each other, not with other processes; predictions "
                 "may be off")
    assert load_warning(cpu, now=1.0, ranks_per_node=2) is not None  # 2 + 1.0 >= 2 + LOAD_MARGIN
    assert load_warning(cpu, now=1.0, ranks_per_node=1) is None  # 1 + 1.0 < 2 + LOAD_MARGIN: a core each
    assert load_warning(cpu, now=1.0) is None  # ranks unknown
    quiet = validate_machine({**cpu, "load": {**cpu["load"], "other_busy_cores": 0.0}})
    assert load_warning(quiet, now=0.1, ranks_per_node=4) is None  # ranks sharing with each other: modelled
    assert load_warning(calibrated(0.9), now=1.0, ranks_per_node=64) is None  # a GPU machine's ranks
    assert "calibrated with 0.0" in load_warning(quiet, now=1.0, ranks_per_node=4)  # the load differs: that first


def test_measures_the_load_now_when_not_given(monkeypatch):
    seen = []
    monkeypatch.setattr(load, "measure", lambda window, pids=None, cpus=None: seen.append((window, pids)) or 1.5)
    machine_mod._NOW.clear()
    assert "now 1.5" in load_warning(calibrated(0.0))
    assert "now 1.5" in load_warning(calibrated(0.2))  # several machines: measured once
    assert seen == [(machine_mod.LOAD_WINDOW, None)]
    machine_mod._NOW.clear()


def test_no_record_another_host_or_no_reading_is_no_warning(no_measuring, tmp_path):
    old = {k: v for k, v in calibrated(0.0).items() if k != "load"}  # written before the load was recorded
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(old))
    assert load_warning(load_machine(str(path))) is None
    assert load_warning(load_machine("gtx680-fdr")) is None
    assert load_warning(calibrated(0.0, host="another-host.example")) is None
    assert load_warning(calibrated(None)) is None  # calibrated where /proc could not be read


@pytest.mark.parametrize("load_value, key", [([], "load must be an object"), ({"busy": 1}, "unknown key load.busy"),
                                             ({"other_busy_cores": -1}, "load.other_busy_cores = -1"),
                                             ({"host": 3}, "load.host = 3")])
def test_a_bad_load_record_is_refused_by_name(load_value, key):
    with pytest.raises(MachineError, match=key):
        validate_machine({**PRESETS["gtx680-fdr"], "load": load_value}, "m.json")


def test_auto_overlaps_reason_ends_with_the_warning(monkeypatch):
    from cotsdl.cli import run

    net = run.read(DEMO).network
    monkeypatch.setattr(machine_mod, "load_now", lambda pids=None, cpus=None: 1.0)
    m = calibrated(0.0)
    decided = choose_overlap(net, 32, 4, (2, 2), 1, m)
    warned = with_load_warning(decided, m)
    assert warned.on == decided.on and warned.reason == decided.reason + "; " + load_warning(m, now=1.0)
    rule = choose_overlap(net, 32, 1, None, 1, m)  # the model did not decide: nothing to warn about
    assert with_load_warning(rule, m) == rule
    assert with_load_warning(decided, calibrated(1.0)) == decided


def test_plan_prints_the_warning_once(monkeypatch, tmp_path, capsys):
    from cotsdl.cli import main

    path = tmp_path / "machine.json"
    path.write_text(json.dumps(calibrated(0.0)))
    monkeypatch.setattr(machine_mod, "load_now", lambda pids=None, cpus=None: 1.0)
    out = tmp_path / "plan.json"
    assert main(["plan", DEMO, "--ranks", "4", "--machine", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("warning: machine here was calibrated with 0.0 other busy cores, now 1.0") == 1
    assert json.loads(out.read_text())["load_warning"].startswith("warning: machine here")
    assert main(["plan", "--table", DEMO, "--ranks", "1", "4", "--machine", str(path), "gtx680-fdr"]) == 0
    assert capsys.readouterr().out.count("warning: machine here was calibrated") == 1
    monkeypatch.setattr(machine_mod, "load_now", lambda pids=None, cpus=None: 0.1)
    assert main(["plan", DEMO, "--ranks", "4", "--machine", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
