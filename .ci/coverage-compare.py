"""The gate's coverage of python/multigpu beside the full run's.

    python .ci/coverage-compare.py out/coverage/gate.json out/coverage/full.json

Reads two `coverage json` reports (`make coverage TIER=gate`, `make coverage
TIER=full`) and prints each tier's line and branch coverage and the share of
the full run's covered lines and branches that the gate covers too, then the
files where the gate misses most. Exits 1 when the gate keeps less than
`REQUIRED_SHARE` of the full run's lines (issue 61's bar).
"""

import json
import sys

REQUIRED_SHARE = 0.98


def covered(report):
    """(file, line) and (file, branch) pairs a report's run executed."""
    lines, branches = set(), set()
    for name, data in report["files"].items():
        lines.update((name, n) for n in data["executed_lines"])
        branches.update((name, tuple(b)) for b in data.get("executed_branches", ()))
    return lines, branches


def measured(report):
    """How many lines and branches a report measured in all."""
    totals = report["totals"]
    return totals["num_statements"], totals.get("num_branches", 0)


def main(gate_path, full_path):
    with open(gate_path) as file:
        gate = json.load(file)
    with open(full_path) as file:
        full = json.load(file)
    gate_lines, gate_branches = covered(gate)
    full_lines, full_branches = covered(full)
    statements, branches = measured(full)
    print(f"{'':8} {'lines':>16} {'branches':>16}")
    for tier, lines, arcs in (("gate", gate_lines, gate_branches),
                              ("full", full_lines, full_branches)):
        print(f"{tier:8} {len(lines):6d} ({len(lines) / statements:6.1%}) "
              f"{len(arcs):6d} ({len(arcs) / max(branches, 1):6.1%})")
    line_share = len(gate_lines & full_lines) / len(full_lines)
    branch_share = len(gate_branches & full_branches) / max(len(full_branches), 1)
    print(f"the gate covers {line_share:.2%} of the full run's lines and "
          f"{branch_share:.2%} of its branches")
    missed = {}
    for name, line in full_lines - gate_lines:
        missed.setdefault(name, []).append(line)
    for name, lines in sorted(missed.items(), key=lambda kv: -len(kv[1]))[:15]:
        print(f"  {len(lines):4d} lines only in the full run: {name} "
              f"{sorted(lines)[:12]}")
    if line_share < REQUIRED_SHARE:
        print(f"coverage-compare: the gate keeps {line_share:.2%} of the full "
              f"run's lines, under {REQUIRED_SHARE:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: coverage-compare.py GATE.json FULL.json")
    sys.exit(main(*sys.argv[1:]))
