#!/usr/bin/env bash
# The paper's smallest network (jobs/configs/paper-185m.toml, 186M parameters) on this machine's CPUs,
# measured against the run planner: builds a 200x200x3 dataset (first run only), calibrates this
# machine (when there is no machine file), plans, trains every stage for a few tens of steps on
# N ranks with the numpy backend (a checkpoint inside the first stage, as a long run makes them),
# then prints per stage the predicted and measured step time and the peak memory per rank.
#   bash jobs/paper-185m-cpu.sh [--ranks N] [--steps S] [--machine FILE] [--fresh]
# Defaults: 2 ranks, 20 steps per stage; the machine file ./machine.json if there is one, else
# runs/machine.json, written by `cotsdl bench calibrate` when missing.
# About 3 minutes and 3 GB per rank on 2 cores.  The run goes to runs/paper-185m-cpu/ (--fresh: anew),
# the dataset to data/paper-185m/natural-200.h5; the plan, each rank's peak memory and the comparison
# to runs/paper-185m-cpu.measured/ (plan.json, peak-rss.RANK, compare.json).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=2
steps=20
machine=
fresh=0
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) ranks=${2:?--ranks needs a number}; shift ;;
        --steps) steps=${2:?--steps needs a number}; shift ;;
        --machine) machine=${2:?--machine needs a file}; shift ;;
        --fresh) fresh=1 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "jobs/paper-185m-cpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$ranks" "$steps"; do
    case "$v" in ''|*[!0-9]*|0) echo "jobs/paper-185m-cpu.sh: --ranks and --steps must be positive integers" >&2; exit 2 ;; esac
done
. jobs/env.sh
[ -n "$machine" ] || { [ -f machine.json ] && machine=machine.json; } || machine=runs/machine.json
config=jobs/configs/paper-185m.toml
data=data/paper-185m/natural-200.h5
run=runs/paper-185m-cpu
out=$run.measured
mkdir -p "$(dirname "$data")"
# 400 random crops of scikit-image's photographs, 200x200 RGB (deterministic; delete the file to rebuild)
[ -f "$data" ] || cotsdl prepare-data natural "$data" --count 400 --size 200 200 --channels 3 --seed 0
if [ ! -f "$machine" ]; then
    echo "[cotsdl] no machine file $machine: calibrating this machine (about 30 s, best on an idle machine)"
    mkdir -p "$(dirname "$machine")"
    mpiexec -n 2 python -m mpi4py -m cotsdl bench calibrate --json "$machine"
fi
if [ "$fresh" = 1 ]; then
    for d in "$run" "$out"; do
        if [ -e "$d" ]; then echo "[cotsdl] --fresh: removing $d"; rm -rf "$d"; fi
    done
fi
if [ -f "$run/summary.json" ]; then
    echo "jobs/paper-185m-cpu.sh: $run is complete; --fresh to measure again" >&2; exit 2
fi
sets=(--set run.backend=numpy --set "data.file=$data" --set "run.folder=$run"
      --set "train.steps=[$steps,$steps,$steps]" --set "train.checkpoint_every=$(( steps > 1 ? steps / 2 : 1 ))"
      --set train.log_every=1)
mkdir -p "$out"
cotsdl plan "$config" --ranks "$ranks" --machine "$machine" "${sets[@]}" --json "$out/plan.json"
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-3600}
# every rank's peak resident memory (VmHWM) at its exit, into $out/peak-rss.RANK
echo "[cotsdl] mpiexec -n $ranks python -m mpi4py -m cotsdl train $config ${sets[*]}"
COTSDL_PEAK_RSS_DIR="$out" mpiexec -n "$ranks" python -m mpi4py jobs/lib/peak_rss.py train "$config" "${sets[@]}"
python - "$run" "$out" "$ranks" <<'EOF'
import json, statistics, sys
from pathlib import Path
run, out_dir, ranks = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
plan = json.loads((out_dir / "plan.json").read_text())
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
peak = [int((out_dir / f"peak-rss.{r}").read_text()) for r in range(ranks)]
out = {"machine": plan["machine"]["name"], "ranks": ranks, "stages": [], "peak_rss_bytes": peak}
print(f"\npaper-185m on {ranks} rank(s), machine {out['machine']}: predicted (cotsdl plan) vs measured")
print(f"{'stage':>5} {'steps':>5} {'predicted s':>11} {'measured s (median)':>20} {'range':>13} {'pred/meas':>9}"
      f" {'predicted GiB':>13}")
for p in plan["predictions"]:
    k = p["stage"]
    secs = [r["seconds"] for r in rows if r["stage"] == k][1:]  # the stage's first step warms up
    med = statistics.median(secs)
    out["stages"].append({"stage": k, "predicted_s": p["seconds"], "measured_s": secs, "median_s": med,
                          "predicted_memory_bytes": p["memory_bytes"], "memory": p["memory"]})
    print(f"{k:5d} {len(secs):5d} {p['seconds']:11.3f} {med:20.3f} {min(secs):6.2f}-{max(secs):<6.2f}"
          f" {p['seconds'] / med:9.2f} {p['memory_bytes'] / 2**30:13.2f}")
most = max(p["memory_bytes"] for p in plan["predictions"])
print(f"peak memory per rank: measured {', '.join(f'{b / 2**30:.2f}' for b in peak)} GiB (VmHWM), predicted "
      f"{most / 2**30:.2f} GiB (the largest stage): predicted/measured {most / max(peak):.2f}")
(out_dir / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {out_dir / 'compare.json'}")
EOF
