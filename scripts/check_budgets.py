#!/usr/bin/env python3
"""check_budgets.py — every CTest label's time in the release pass against its budget.

    check_budgets.py BUDGETS CTEST_LOG

BUDGETS holds one `label seconds` pair per line (tests/CMakeLists.txt writes it from the table
beside the labels); CTEST_LOG is ctest's output, whose "Label Time Summary" gives each label's
test time (seconds x processors, summed over its tests).  Prints one line per label; exits 1 when a
label has no budget or ran past it, naming the label, its time and its budget."""
import re
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: check_budgets.py BUDGETS CTEST_LOG", file=sys.stderr)
        return 2
    budgets_path, log_path = sys.argv[1], sys.argv[2]
    budgets = {}
    with open(budgets_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", parts[1]):
                print(f"{budgets_path}:{n}: '{line.strip()}' is not 'label seconds'", file=sys.stderr)
                return 2
            budgets[parts[0]] = float(parts[1])
    used = {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        in_summary = False
        for line in f:
            if line.startswith("Label Time Summary"):
                in_summary = True
                continue
            m = re.match(r"\s*(\S+)\s*=\s*([0-9.]+) sec\*proc", line) if in_summary else None
            if m:
                used[m.group(1)] = float(m.group(2))
            elif in_summary and line.strip():
                in_summary = False
    if not used:
        print(f"{log_path}: no 'Label Time Summary' found: was it ctest's output?", file=sys.stderr)
        return 2
    bad = 0
    print("   label       seconds   budget")
    for label in sorted(used):
        budget = budgets.get(label)
        note = ""
        if budget is None:
            note, bad = "  no budget: add one beside the label in tests/CMakeLists.txt", bad + 1
        elif used[label] > budget:
            note, bad = "  over budget", bad + 1
        print(f"   {label:<10} {used[label]:8.1f} {budget if budget is not None else float('nan'):8.0f}{note}")
    if bad:
        print(f"check_budgets: {bad} label(s) without a budget or past it (see above); a label past its budget "
              "needs its tests made faster, or moved out of the CI set, or the budget raised with the reason "
              "beside it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
