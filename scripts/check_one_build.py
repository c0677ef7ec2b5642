#!/usr/bin/env python3
"""Checks that the server's and the benchmarks' release builds share their compiled dependencies.

    check_one_build.py              resolves every command below with `cargo tree` and compares
    check_one_build.py --self-test  the tree parser and the comparison on small made-up trees

Cargo unifies features over the packages a command selects, so `cargo build --release -p
pagoda-server` (make serve) and `... -p pagoda-server -p pagoda-bench` (the bench scripts) can
resolve a shared dependency with different features. The second build then recompiles it and
everything above it (candle, the engine, the server binary: minutes on two cores), and the two
keep overwriting each other in the shared target dir. This resolves each command's package set
with `cargo tree` (no compiling, a second or so) and fails when a package that two of them build
in the same role (target code, or host code: build scripts, proc macros and what they use) gets
different features. A package that only one command builds is fine: it is compiled once. The
fix is to declare the missing features where the smaller package set sees them: Cargo.toml's
[workspace.dependencies], or the "one build" declarations in crates/server/Cargo.toml.

Not compared: pagoda-bench or pagoda-bench-offline built without the server (they lack the
server's own features; benches/README.md builds them with it), and `make kernels`, which builds
pagoda-ops alone with its kernel-sim feature under the test profile: it resolves without the
other members' dev-dependencies, down to the features of syn that proc macros are built with,
which no normal or dev dependency of pagoda-ops can declare, so it keeps its own copy of
pagoda-ops' dependencies.

Needs cargo (the CARGO environment variable, as the Makefile sets it, else `cargo`) and an
up-to-date Cargo.lock (`--locked`). Standard library only.
"""

import os
import re
import shlex
import subprocess
import sys

# The release builds that share the target dir: a label and the `cargo tree` arguments that
# select the command's packages (-e no-dev: a build compiles no dev-dependencies).
COMMANDS = [
    ("make serve/generate/soak", ["-p", "pagoda-server"]),
    ("bench scripts", ["-p", "pagoda-server", "-p", "pagoda-bench"]),
    ("benches/README.md", ["-p", "pagoda-server", "-p", "pagoda-bench", "-p", "pagoda-bench-offline"]),
    ("--workspace", ["--workspace"]),
]

LINE = re.compile(r"^(?P<prefix>[│├└─ ]*)(?P<body>\S.*)$")
PACKAGE = re.compile(r"^(?P<name>\S+) (?P<version>v\S+)(?P<rest>.*) \[(?P<features>[^\]]*)\]")


def parse_tree(text):
    """Maps (name, version, role) to the set of feature lists that `cargo tree -f "{p} [{f}]"
    --no-dedupe` printed for it. role is "host" under a proc macro or a [build-dependencies]
    header, else "target"."""
    found = {}
    # Open contexts: (depth of the lines they govern, their role, "node" or "header"). A package
    # line opens one for its children; a header opens one for the rest of its parent's children.
    # A line at depth d pops every context deeper than d; the top one left is its parent's.
    stack = []
    for raw in text.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        column = len(m.group("prefix"))
        body = m.group("body")
        if body.startswith("[") and body.endswith("-dependencies]"):
            # The header sits at its parent's children's column minus one level.
            depth = column // 4 + 1
            while stack and (stack[-1][0] > depth or (stack[-1][0] == depth and stack[-1][2] == "header")):
                stack.pop()
            parent_role = stack[-1][1] if stack else "target"
            role = "host" if body == "[build-dependencies]" else parent_role
            stack.append((depth, role, "header"))
            continue
        p = PACKAGE.match(body)
        if not p:
            continue
        depth = column // 4
        while stack and stack[-1][0] > depth:
            stack.pop()
        role = stack[-1][1] if stack else "target"
        if "(proc-macro)" in p.group("rest"):
            role = "host"
        key = (p.group("name"), p.group("version"), role)
        features = tuple(f for f in p.group("features").split(",") if f)
        found.setdefault(key, set()).add(features)
        # This node's children are one level deeper and share its role.
        stack.append((depth + 1, role, "node"))
    return found


def compare(resolved):
    """resolved: [(label, parse_tree result)]. Returns one message per package that two labels
    build in the same role with different features, or that one label builds in one role with
    two feature sets."""
    problems = []
    for i, (label_a, tree_a) in enumerate(resolved):
        for key, sets in sorted(tree_a.items()):
            if len(sets) > 1:
                problems.append(f"{key[0]} {key[1]} ({key[2]}): {len(sets)} feature sets in {label_a}")
        for label_b, tree_b in resolved[i + 1 :]:
            for key in sorted(set(tree_a) & set(tree_b)):
                if tree_a[key] == tree_b[key]:
                    continue
                a = set().union(*tree_a[key])
                b = set().union(*tree_b[key])
                problems.append(
                    f"{key[0]} {key[1]} ({key[2]}): only {label_a} has [{','.join(sorted(a - b))}],"
                    f" only {label_b} has [{','.join(sorted(b - a))}]"
                )
    return problems


def cargo_tree(args):
    cargo = shlex.split(os.environ.get("CARGO") or "cargo")
    cmd = cargo + ["tree", "--locked", "-e", "no-dev", "--no-dedupe", "-f", "{p} [{f}]"] + args
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    resolved = [(label, parse_tree(cargo_tree(args))) for label, args in COMMANDS]
    problems = compare(resolved)
    if problems:
        print(f"{len(problems)} dependencies would be compiled again with other features:")
        for problem in problems:
            print(f"  {problem}")
        print(
            "Declare the missing features where the smaller package set sees them"
            " (Cargo.toml's [workspace.dependencies], crates/server/Cargo.toml's one-build declarations).",
            file=sys.stderr,
        )
        sys.exit(1)
    shared = set.intersection(*(set(tree) for _, tree in resolved))
    labels = "; ".join(label for label, _ in resolved)
    print(f"one build: {labels} build {len(shared)} packages in common, each with the same features")


SAMPLE_SERVER = """\
server v0.1.0 (/w/server) []
├── tokio v1.0.0 [net,rt]
│   └── tokio-macros v2.0.0 (proc-macro) []
│       └── syn v2.0.0 [full]
└── onig v6.0.0 []
    └── onig_sys v69.0.0 []
        [build-dependencies]
        └── cc v1.0.0 []
            └── jobserver v0.1.0 []
                └── libc v0.2.0 [std]
[dev-dependencies]
└── libc v0.2.0 []
"""

SAMPLE_BOTH = """\
server v0.1.0 (/w/server) []
├── tokio v1.0.0 [fs,net,rt]
│   └── tokio-macros v2.0.0 (proc-macro) []
│       └── syn v2.0.0 [full]
└── onig v6.0.0 []
    └── onig_sys v69.0.0 []
        [build-dependencies]
        └── cc v1.0.0 []
            └── shlex v1.0.0 [std]

bench v0.1.0 (/w/bench) []
├── shlex v1.0.0 []
└── syn v2.0.0 [full,visit]
"""


def self_test():
    server = parse_tree(SAMPLE_SERVER)
    assert server[("tokio", "v1.0.0", "target")] == {("net", "rt")}, server
    assert ("syn", "v2.0.0", "host") in server, server
    assert ("syn", "v2.0.0", "target") not in server, server
    assert ("cc", "v1.0.0", "host") in server, server
    assert server[("libc", "v0.2.0", "host")] == {("std",)}, server
    assert server[("libc", "v0.2.0", "target")] == {()}, server
    assert ("onig", "v6.0.0", "target") in server, server
    assert ("onig_sys", "v69.0.0", "target") in server, server
    both = parse_tree(SAMPLE_BOTH)
    # Back at depth 0 after the host subtree: the bench's own dependencies are target code.
    assert both[("shlex", "v1.0.0", "target")] == {()}, both
    assert both[("syn", "v2.0.0", "target")] == {("full", "visit")}, both
    assert both[("syn", "v2.0.0", "host")] == {("full",)}, both
    problems = compare([("serve", server), ("bench", both)])
    # tokio differs (fs); syn and shlex differ only in a role the server does not build.
    assert problems == ["tokio v1.0.0 (target): only serve has [], only bench has [fs]"], problems
    assert compare([("serve", server), ("again", parse_tree(SAMPLE_SERVER))]) == []
    twice = parse_tree(SAMPLE_SERVER + "bench v0.1.0 (/w/bench) []\n└── tokio v1.0.0 [rt]\n")
    assert compare([("both", twice)]) == ["tokio v1.0.0 (target): 2 feature sets in both"], twice
    print("check_one_build.py self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        main()
