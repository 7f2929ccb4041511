"""``cotsdl plan CONFIG``: the run planner (per-rank memory, FLOPs, halo traffic, predicted step time)."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sp = sub.add_parser("plan", help="per-rank memory, FLOPs, halo bytes and predicted step time (not implemented yet)",
                        description="cotsdl plan: per-rank memory, FLOPs, halo bytes and predicted step time. "
                                    "Not implemented in this version; it exits with status 2.")
    sp.add_argument("args", nargs="*", help="reserved")


def run(args: argparse.Namespace) -> int:
    raise ValueError("'cotsdl plan' is not implemented in this version")
