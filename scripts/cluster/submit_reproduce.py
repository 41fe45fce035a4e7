"""Submit a reproduction to SLURM with submitit (pip install 'lengthgen[cluster]').

One SLURM job on one node runs `reproduce(..., backend="ray")`: a local Ray instance over the
node's GPUs and CPUs, each run on a GPU of its own (the local process pool would put every run
on the first GPU), then the report. For several nodes use ray-slurm.sbatch beside this file.
The job's logs and result go to OUT/slurm; submitting the same command again continues an
interrupted reproduction (finished runs are skipped, unfinished ones resume).

    python scripts/cluster/submit_reproduce.py looped --scale paper --out /shared/runs/looped-paper \
        --gpus 8 --cpus 32 --hours 48 --partition gpu
    python scripts/cluster/submit_reproduce.py looped --tasks parity --seeds 1 --out runs/try --cluster local --wait
"""
from __future__ import annotations

import argparse
from pathlib import Path

import submitit

from lengthgen.reproduction.runner import reproduce


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paper", help="a folder name under experiments/ or a folder holding a grid.toml")
    p.add_argument("--scale")
    p.add_argument("--seeds", type=int)
    p.add_argument("--tasks", help="comma list (default: the grid's default tasks)")
    p.add_argument("--arms", help="comma list (default: the grid's default arms)")
    p.add_argument("--out", required=True, help="output folder, on a filesystem the node shares with this one")
    p.add_argument("--threads", type=int, default=0, help="torch threads (and CPUs asked of Ray) per CPU run; default 1")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the node")
    p.add_argument("--cpus", type=int, default=8, help="CPUs of the node")
    p.add_argument("--hours", type=float, default=24.0, help="time limit of the job")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--cluster", choices=("slurm", "local"), default=None,
                   help="local: run the job on this machine (to try the script); default: SLURM where it is available")
    p.add_argument("--wait", action="store_true", help="wait for the job and print its report")
    args = p.parse_args()

    out = Path(args.out).resolve()  # the job's working folder may differ from this one
    executor = submitit.AutoExecutor(folder=out / "slurm", cluster=args.cluster)
    executor.update_parameters(name=f"lengthgen-{Path(args.paper).name}", nodes=1, tasks_per_node=1,
                               gpus_per_node=args.gpus, cpus_per_task=args.cpus, timeout_min=int(args.hours * 60),
                               **({"slurm_partition": args.partition} if args.partition else {}))
    split = lambda text: text.split(",") if text else None  # noqa: E731
    job = executor.submit(reproduce, args.paper, args.scale, seeds=args.seeds, tasks=split(args.tasks),
                          arms=split(args.arms), out=out, workers=1, progress=False, threads=args.threads or 1,
                          backend="ray")
    print(f"submitted job {job.job_id}; its logs: {out / 'slurm'}")
    if args.wait:
        print(job.result().read_text())


if __name__ == "__main__":
    main()
