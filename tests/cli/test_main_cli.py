"""`cotsdl info`, `check-kernels` and `bench` as a user runs them: under mpiexec, with good and bad arguments."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def cotsdl(*args, ranks=2, timeout=120):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", *args]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)


@pytest.mark.timeout(200)
def test_bench_exchange_writes_table_and_json(tmp_path):
    out = tmp_path / "ex.json"
    res = cotsdl("bench", "exchange", "--shape", "20", "17", "2", "3", "--halos", "0", "1", "3",
                 "--repeats", "3", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("cotsdl bench exchange: 2 rank(s)") == 1  # rank 0 reports, once
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and data["shape"] == [20, 17, 2, 3]
    rows = {r["halo"]: r for r in data["results"]}
    assert rows[0]["bytes_sent_all_ranks"] == 0
    # grid 2x1 over 20 rows: each rank sends h rows of 17*2*3 float32 to the other
    assert rows[3]["bytes_sent_all_ranks"] == 2 * 3 * 17 * 2 * 3 * 4
    assert 0 < rows[3]["fraction_of_pingpong"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.timeout(200)
@pytest.mark.parametrize("args, message", [
    (["--json", "/nonexistent/dir/x.json"], "folder /nonexistent/dir does not exist"),
    (["--shape", "0", "4", "1", "1"], "--shape must be four positive integers"),
    (["--grid", "3", "1"], "grid 3x1 needs 3 ranks, the communicator has 2"),
    (["--halos", "-1"], "--halos must be non-negative"),
    (["--json", "/tmp"], "--json /tmp is a folder: give a file name"),
])
def test_bad_arguments_fail_on_every_rank_without_hanging(tmp_path, args, message):
    res = cotsdl("bench", "exchange", "--shape", "8", "8", "1", "1", "--repeats", "1", *args)
    assert res.returncode != 0
    assert res.stderr.count(message) == 1, res.stderr  # said once, by rank 0
    assert not (tmp_path / "x.json").exists()


def test_info():
    res = cotsdl("info", ranks=1)
    assert res.returncode == 0, res.stderr
    assert "MPI:" in res.stdout and "kernel sources:" in res.stdout


@pytest.mark.timeout(200)
def test_bench_layers_table_and_json(tmp_path):
    out = tmp_path / "layers.json"
    cmd = [sys.executable, "-m", "cotsdl", "bench", "layers", "--repeats", "1", "--min-time", "0", "--json", str(out),
           "--shapes", "A,D-blocks"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "sgemm 2048^3 ceiling" in res.stdout
    data = json.loads(out.read_text())
    assert data["sgemm_2048_GFLOPs"] > 0
    assert [r["shape"] for r in data["results"]] == ["A", "D-blocks"]
    # the ceiling is measured again before each shape; the highest so far counts
    ceilings = [r["ceiling_GFLOPs"] for r in data["results"]]
    assert ceilings == sorted(ceilings) and ceilings[-1] == data["sgemm_2048_GFLOPs"]
    for row in data["results"]:
        fl = row["ops"]["filter_forward"]
        assert fl["fraction_of_sgemm"] == pytest.approx(fl["GFLOPs"] / row["ceiling_GFLOPs"])
        assert set(row["ops"]) == {"filter_forward", "filter_bwd_data", "filter_bwd_weights", "pool_forward",
                                   "pool_backward", "lcn_forward", "lcn_backward", "train_step"}
        assert 0 < row["ops"]["filter_forward"]["fraction_of_sgemm"]


def test_bench_layers_bad_output_folder():
    res = subprocess.run([sys.executable, "-m", "cotsdl", "bench", "layers", "--json", "/nonexistent/l.json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "folder /nonexistent does not exist" in res.stderr


def test_bench_emulator(tmp_path):
    out = tmp_path / "emu.json"
    res = subprocess.run([sys.executable, "-m", "cotsdl", "bench", "emulator", "--blocks", "2", "--threads", "64",
                          "--iters", "10", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"assembly", "ucontext"}
    assert all(r["switches_per_s"] > 0 for r in data["results"].values())


def test_check_kernels_command():
    res = subprocess.run([sys.executable, "-m", "cotsdl", "check-kernels"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "with no spills" in res.stdout and "pack_box_f32" in res.stdout


@pytest.mark.timeout(120)
def test_ranks_given_different_arguments_fail_without_hanging():
    base = [sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench", "exchange", "--shape", "8", "8", "1", "1",
            "--repeats", "1", "--halos"]
    cmd = [MPIEXEC, "-n", "1", *base, "1", ":", "-n", "1", *base, "1", "2"]  # MPMD: each rank its own command line
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**os.environ, "MPIEXEC_TIMEOUT": "60"})
    assert res.returncode != 0
    # refused before any work, naming each rank's command (the library's own check, ``agree``, is the
    # second line of defence: tests/mpi/test_agreement.py)
    assert res.stderr.count("the ranks were started with different commands (rank 0: cotsdl bench exchange --shape "
                            "8 8 1 1 --repeats 1 --halos 1; rank 1: cotsdl bench exchange --shape 8 8 1 1 --repeats 1 "
                            "--halos 1 2)") == 1, res.stderr


def test_a_closed_pipe_ends_quietly():
    """`cotsdl plan … | head -1`: no traceback, no error line, exit 0."""
    res = subprocess.run(f"{sys.executable} -m cotsdl plan {Path(__file__).resolve().parents[2] / 'jobs/configs/demo.toml'} --ranks 2 | head -1",
                         shell=True, capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("plan: ") and res.stderr == "", res.stderr


def test_every_prepare_data_command_shown_to_users_parses_with_the_source_first():
    """The commands in the configs' comments, the README and every other page of documentation parse,
    and name their folder or dataset before the file they write (the paper configs once had SRC and
    OUT swapped)."""
    import re
    import shlex

    from cotsdl.cli import _parser

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", root / "DESIGN.md"] + sorted(
        p for folder in ("cotsdl", "cuda", "data", "jobs", "tests") for p in (root / folder).rglob("*.md"))
    texts = [p.read_text() for p in sorted((root / "jobs" / "configs").glob("*.toml"))] + [p.read_text() for p in pages]
    pattern = r"cotsdl (prepare-data (?:folder|resize) [^\n`#|]+)"
    commands = [m.group(1) for t in texts for m in re.finditer(pattern, t)]
    assert len(commands) >= 6
    assert len(re.findall(pattern, (root / "README.md").read_text())) >= 2  # the guide shows its own examples
    for cmd in commands:
        args = _parser().parse_args(shlex.split(cmd.replace("\\", "")))
        src = getattr(args, "src_folder", None) or getattr(args, "src", None)
        assert args.out.endswith(".h5") and src is not None and not src.endswith(".h5") or args.builder == "resize", cmd
