#!/usr/bin/python3
"""Every skipped test of a suite with the reason it gave, from the suite's
JUnit XML (ctest's --output-junit or pytest's --junitxml), one line each:
`TEST: REASON`. A ctest test's reason is what GoogleTest printed after
"Skipped", or a script's "SKIP: ..." line; pytest's is its skip message.
A skip that gave none says so. Nothing is printed for a suite without skips
or without its XML (a suite that did not run). With --summary, the lists
such runs wrote (one file per suite) are read back and grouped by reason:
`N x REASON (e.g. TEST)`, under each suite's name.

Usage: scripts/skipped-tests.py SUITE FILE.xml
       scripts/skipped-tests.py --summary LIST.txt...
"""
import collections
import os
import sys
import xml.etree.ElementTree as ElementTree


def reason_in_output(output: str) -> str:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped"):  # GoogleTest: "file:line: Skipped", then the message
            message = []
            for rest in lines[i + 1:]:
                if rest.startswith("[  SKIPPED ]") or rest.startswith("[       OK ]"):
                    break
                message.append(rest.strip())
            return " ".join(m for m in message if m) or "(no reason given)"
        if line.startswith("SKIP: "):
            return line[len("SKIP: "):].strip()
    return ""


def summary(paths):
    for path in paths:
        with open(path) as f:
            rows = [line.rstrip("\n").split(": ", 1) for line in f if ": " in line]
        if not rows:
            continue
        by_reason = collections.defaultdict(list)
        for test, reason in rows:
            by_reason[reason].append(test)
        print(f"{os.path.basename(path).removesuffix('.txt')}: {len(rows)} skipped ({path})")
        for reason, tests in sorted(by_reason.items(), key=lambda item: -len(item[1])):
            print(f"  {len(tests)} x {reason} (e.g. {tests[0]})")


def main():
    if sys.argv[1] == "--summary":
        summary(sys.argv[2:])
        return
    suite, path = sys.argv[1], sys.argv[2]
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return
    for case in root.iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        name = case.get("name", "?")
        if case.get("classname") and not name.startswith(case.get("classname")):
            name = f"{case.get('classname')}::{name}"
        out = case.find("system-out")
        reason = reason_in_output(out.text or "") if out is not None else ""
        message = skipped.get("message", "")
        if not reason and message and message != "SKIP_REGULAR_EXPRESSION_MATCHED":
            reason = message
        print(f"{name}: {reason or '(no reason given)'}")


if __name__ == "__main__":
    main()
