"""The cases' figures (`bench/cases.py`) beside issue 38's targets, and as lines to read: each
ratio with its case, the marginal client CPU per message by process kind, and nats-server's CPU
per message in the same runs (the floor no client goes below on this layout)."""

from __future__ import annotations

from typing import Any

# Process kinds of `bench.common.ProcessSampler`, as the report names them. The client is what
# the connector runs (Spark's JVM, its Python workers, the streaming source runner); the driver
# (the process that started the query) is apart: in the warm case it is the bench itself.
CLIENT_KINDS = {"jvm": "JVM", "python_worker": "Python workers", "source_runner": "source runner"}
DRIVER_KIND = "driver_python"

# Issue 38's figures, by key count: marginal client CPU (µs per message) at most, and the ratio
# to the tuned nats-py loop at least, on the 4N run (1.2M messages with --issue-sizes).
CLIENT_CPU_GOAL = {1000: 3.0, 10000: 4.0}
FRESH_RATIO_GOAL = {1000: 3.0, 10000: 1.8}
WARM_RATIO_GOAL = {1000: 4.0}


def client_cpu(by_kind: dict[str, float]) -> float:
    """The connector's processes' share of a per-message CPU figure."""
    return round(sum(by_kind.get(kind, 0.0) for kind in CLIENT_KINDS), 2)


def case_goals(both_cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each key count's figures beside issue 38's targets (None where it sets none)."""
    goals: dict[str, Any] = {}
    for c in both_cases:
        keys, large = c["keys"], c["messages"]["4N"]
        goals[f"{c['keys']}_keys"] = {
            **{
                f"marginal_client_cpu_us_per_msg_{case}": client_cpu(
                    c[case]["marginal_cpu_us_per_msg"]
                )
                for case in ("warm", "fresh")
            },
            "marginal_client_cpu_goal": CLIENT_CPU_GOAL.get(keys),
            f"fresh_ratio_{large}": c["fresh"]["ratio_to_nats_py"]["4N"]["ratio"],
            "fresh_ratio_goal": FRESH_RATIO_GOAL.get(keys),
            "fresh_ratio_bound": c["fresh"]["ratio_bound"]["4N"],
            f"warm_ratio_{large}": c["warm"]["ratio_to_nats_py"]["4N"]["ratio"],
            "warm_ratio_goal": WARM_RATIO_GOAL.get(keys),
            "nats_server_marginal_cpu_us_per_msg": c["warm"]["marginal_cpu_us_per_msg"].get(
                "nats_server"
            ),
            "driver_cpu_4N_over_N_warm": c["warm"]["driver_cpu_4N_over_N"],
            "ledger_bytes_per_msg_warm": c["warm"]["ledger_bytes_per_msg"],
            "planned_batch_bytes": c["planned_batch_bytes"],
        }
    goals["ratio_goals_apply_to"] = "1,200,000 messages (4N with --issue-sizes), 100 B"
    return goals


def _case_name(case: str) -> str:
    return "warm session" if case == "warm" else "fresh process"


def case_lines(both_cases: list[dict[str, Any]]) -> list[str]:
    """What a reader looks for first, a line each: every ratio named by its case, then each
    case's marginal CPU per message by process kind with nats-server's beside it."""
    lines = []
    for c in both_cases:
        keys, sizes = c["keys"], c["messages"]
        for case in ("warm", "fresh"):
            for size, count in sizes.items():
                r = c[case]["ratio_to_nats_py"][size]
                server = c[case]["cpu_us_per_msg"][size].get("nats_server")
                lines.append(
                    f"{keys:,} keys, {c['payload']} B, {_case_name(case)}, {count:,} messages: "
                    f"{r['ratio']:.2f}x the tuned nats-py loop ({r['connector_msgs_per_s']:,} vs "
                    f"{r['nats_py_msgs_per_s']:,} msg/s; nats-py fetch {c['nats_py_fetch']}, "
                    f"max_ack_pending unbounded); nats-server {server} us/msg"
                )
        for case in ("warm", "fresh"):
            marginal = c[case]["marginal_cpu_us_per_msg"]
            kinds = ", ".join(
                f"{name} {marginal.get(k, 0.0):.2f}" for k, name in CLIENT_KINDS.items()
            )
            jvm = c[case]["cpu_seconds"]
            lines.append(
                f"{keys:,} keys, {_case_name(case)}, marginal CPU us/msg between "
                f"{sizes['N']:,} and {sizes['4N']:,} messages: client {client_cpu(marginal):.2f} "
                f"({kinds}); driver {marginal.get(DRIVER_KIND, 0.0):.2f}; nats-server "
                f"{marginal.get('nats_server', 0.0):.2f} (the floor)"
                + (
                    f"; the JVM's CPU-s {jvm['N'].get('jvm', 0.0)} and "
                    f"{jvm['4N'].get('jvm', 0.0)} (a fresh JVM's start alone varies by seconds)"
                    if case == "fresh"
                    else ""
                )
            )
        steps = c["stages_cpu_us_per_msg"]
        named = ", ".join(
            f"{step.replace('_', ' ')} {us:.2f}" for step, us in steps.items() if step != "in_all"
        )
        lines.append(
            f"{keys:,} keys, a reader's steps on one synthetic pull of 4,096 (bench/stages.py, "
            f"CPU us/msg, in one process): {named}; in all {steps['in_all']:.2f}"
        )
        py = c["nats_py"]["4N"]["cpu_us_per_msg"]
        lines.append(
            f"{keys:,} keys, the tuned nats-py loop on {sizes['4N']:,} messages: "
            f"client {py.get(DRIVER_KIND, 0.0):.1f} us/msg, nats-server "
            f"{py.get('nats_server', 0.0):.1f} us/msg"
        )
    return lines
