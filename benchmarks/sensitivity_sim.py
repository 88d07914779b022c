"""How the Gyre gains move with timeout clustering and with the number of cells (same GPU budget).

Usage: python benchmarks/sensitivity_sim.py [--config configs/sim/paper_2p4t.yaml] [--out FILE]

1. Timeout clustering: ``workload.stuck_query_frac`` (queries whose runs all run into the timeout) from
   0 to 0.4, everything else as in the config; the table shows the resulting share of queries that hit
   the timeout and the gains gyre/colocate (hours_colocate / hours_gyre) and gyre/async.
2. Cells: 2, 4, 8, 16 cells over the same 192 nodes. Per-cell quantities scale with the cell size
   (capacity, KV slots, half_load, training tokens/s and pull bandwidth x 4 / cells); async keeps half the
   cells in its training pool.
"""
from __future__ import annotations

import argparse

from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.allocator.staleness import comparable
from gyre_hpc.config import load_config


def row(cfg_path: str, sets: list[str]) -> dict:
    result, _ = compare(load_config(cfg_path, sets + ["sim.policies=[gyre,colocate,async]"]))
    p, w = result["policies"], result["workload"]
    return {"gyre_h": p["gyre"]["hours"], "colocate_h": p["colocate"]["hours"], "async_h": p["async"]["hours"],
            "g_vs_c": p["colocate"]["hours"] / p["gyre"]["hours"], "g_vs_a": p["async"]["hours"] / p["gyre"]["hours"],
            "ge4": w["frac_queries_ge_4h"], "timeout": w["frac_queries_hit_timeout"],
            "near": w["frac_queries_within_5pct_of_timeout"], "d": p["gyre"]["staleness_mean"],
            "d_c": p["colocate"]["staleness_mean"], "d_a": p["async"]["staleness_mean"]}


def _ratio(x: float, d_ref: float, d: float) -> str:
    """A gain printed with the other policy's E[d]; marked when the two E[d] differ by more than 10%."""
    return f"{x:.2f} (E[d] {d:.2f}{'' if comparable(d_ref, d) else ', not comparable'})"


def fmt(label: str, r: dict) -> str:
    return (f"| {label} | {r['timeout']:.1%} | {r['near']:.1%} | {r['ge4']:.1%} | {r['gyre_h']:.1f} | "
            f"{r['colocate_h']:.1f} | {r['async_h']:.1f} | {_ratio(r['g_vs_c'], r['d'], r['d_c'])} | "
            f"{_ratio(r['g_vs_a'], r['d'], r['d_a'])} | {r['d']:.2f} |")


HEAD = ("| {} | hit timeout | within 5% | >= 4 h | gyre h | colocate h | async h | gyre vs colocate | "
        "gyre vs async | gyre E[d] |\n|---|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sim/paper_2p4t.yaml")
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg = load_config(args.config)
    lines = [f"Timeout clustering ({args.config}, stuck_query_frac varied):", "", HEAD.format("stuck_query_frac")]
    for frac in (0.0, 0.05, 0.1, cfg.workload.stuck_query_frac, 0.25, 0.4):
        lines.append(fmt(f"{frac:g}", row(args.config, [f"workload.stuck_query_frac={frac}"])))
    lines += ["", "Cells over the same 192 nodes (per-cell quantities scaled by 4 / cells):", "", HEAD.format("cells")]
    s, c = cfg.sim, cfg.scheduler
    for cells in (2, 4, 8, 16):
        k = 4 / cells
        sets = [f"cluster.cells={cells}", f"cluster.nodes_per_cell={192 // cells}",
                f"scheduler.capacity_runs_per_cell={max(1, round(c.capacity_runs_per_cell * k))}",
                f"sim.kv_slots_per_cell={max(1, round(s.kv_slots_per_cell * k))}",
                f"sim.half_load={s.half_load * k}", f"sim.train_tok_s_per_cell={s.train_tok_s_per_cell * k}",
                f"sim.pull_bytes_per_s={s.pull_bytes_per_s * k}", f"scheduler.async_train_cells={max(1, cells // 2)}"]
        lines.append(fmt(str(cells), row(args.config, sets)))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
