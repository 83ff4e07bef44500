#!/usr/bin/env python3
"""Each workspace member's `rust-version` is the highest `rust_version` among the locked
dependencies it builds with (normal, build and dev, transitively), read from `cargo metadata`.

A lower one promises a toolchain the dependencies refuse; a higher one refuses toolchains that
would work. Run by `make lint`; `--print` prints what each member needs instead of checking.
"""

import json
import subprocess
import sys


def version(text):
    return tuple(int(part) for part in text.split("."))


def show(parts):
    return ".".join(str(part) for part in parts)


def main():
    command = ["cargo", "metadata", "--format-version", "1", "--locked", "--offline"]
    found = subprocess.run(command, capture_output=True, text=True)
    if found.returncode != 0:
        # A fresh machine's registry lacks the crates of other platforms, which metadata reads.
        subprocess.run(["cargo", "fetch", "--locked"], check=True)
        found = subprocess.run(command, check=True, capture_output=True, text=True)
    metadata = json.loads(found.stdout)
    packages = {package["id"]: package for package in metadata["packages"]}
    deps = {node["id"]: [dep["pkg"] for dep in node["deps"]] for node in metadata["resolve"]["nodes"]}
    members = set(metadata["workspace_members"])
    wrong = 0
    for member in sorted(members, key=lambda id_: packages[id_]["name"]):
        seen, todo = set(), list(deps[member])
        while todo:
            id_ = todo.pop()
            if id_ not in seen and id_ not in members:
                seen.add(id_)
                todo.extend(deps.get(id_, []))
        needing = [(version(packages[id_]["rust_version"]), packages[id_]["name"], packages[id_]["version"])
                   for id_ in seen if packages[id_].get("rust_version")]
        needed, name, at = max(needing) if needing else ((0,), "-", "-")
        needed = needed + (0,) * (2 - len(needed))
        declared = packages[member].get("rust_version")
        package = packages[member]["name"]
        if "--print" in sys.argv:
            print(f"{package}: needs {show(needed[:2])} ({name} {at}), declares {declared}")
        elif declared is None or version(declared)[:2] != needed[:2]:
            print(f"{package}: rust-version is {declared}, but the locked dependencies need "
                  f"{show(needed[:2])} ({name} {at}): set rust-version = \"{show(needed[:2])}\"",
                  file=sys.stderr)
            wrong += 1
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
