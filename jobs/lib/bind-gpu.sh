#!/usr/bin/env bash
# Give this rank its GPU before MPI starts, then run the command:
#   srun ... bash jobs/lib/bind-gpu.sh python -m mpi4py -m cotsdl train CONFIG
# MVAPICH2-GDR and other CUDA-aware MPIs set up GPU memory transfers inside MPI_Init,
# on the device that is current then: the device must be chosen before, not by the
# program after `python -m mpi4py` has initialized MPI.  The node-local rank comes from
# the launcher (SLURM_LOCALID, MV2_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
# PMI_LOCAL_RANK, MPI_LOCALRANKID); the rank sees GPU (local rank mod GPUs) of those
# visible (CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists) as its only device.
# Without a local rank, or without GPUs, it changes nothing (the program then picks the
# GPU by the ranks that share its node).  COTSDL_BIND_GPU=0 turns it off.
set -euo pipefail
local_rank=
for v in SLURM_LOCALID MV2_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_RANK PMI_LOCAL_RANK MPI_LOCALRANKID; do
    if [[ ${!v:-} =~ ^[0-9]+$ ]]; then local_rank=${!v}; break; fi
done
if [ "${COTSDL_BIND_GPU:-1}" != 0 ] && [ -n "$local_rank" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null; then
        mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
    else
        gpus=()
    fi
    if [ "${#gpus[@]}" -gt 0 ]; then
        export CUDA_VISIBLE_DEVICES=${gpus[local_rank % ${#gpus[@]}]// /}
    fi
fi
exec "$@"
