#!/usr/bin/env python3
"""Fails when a workspace member declares a dependency its code never names (what
`cargo machete` checks, without installing it): for every `[dependencies]`,
`[dev-dependencies]` and `[build-dependencies]` entry of each member's Cargo.toml, the crate's
Rust name (`-` as `_`, or the `package =` rename's key) must appear in the member's Rust
sources (src/, tests/, benches/, examples/, build.rs) as a path (`name::`, `use name`,
`extern crate name`) or in an attribute or macro call. A dependency kept for what it does
without being named (a feature it turns on in another crate, a linked C library) is listed in
the member's `[package.metadata.cohort] used-without-naming` with the reason beside it."""

import pathlib
import re
import sys
import tomllib

root = pathlib.Path(__file__).resolve().parent.parent
workspace = tomllib.loads((root / "Cargo.toml").read_text())
members = workspace.get("workspace", {}).get("members", ["."])
failed = []
for member in members:
    base = root / member
    manifest = tomllib.loads((base / "Cargo.toml").read_text())
    allowed = set(
        manifest.get("package", {}).get("metadata", {}).get("cohort", {}).get("used-without-naming", [])
    )
    sources = []
    for folder in ["src", "tests", "benches", "examples"]:
        sources += (base / folder).rglob("*.rs") if (base / folder).exists() else []
    if (base / "build.rs").exists():
        sources.append(base / "build.rs")
    if member == ".":
        # The root package's folders hold other members too; they are checked on their own.
        others = [root / m for m in members if m != "."]
        sources = [s for s in sources if not any(o in s.parents for o in others)]
    text = "\n".join(s.read_text(errors="replace") for s in sources)
    for table in ["dependencies", "dev-dependencies", "build-dependencies"]:
        for name in manifest.get(table, {}):
            if name in allowed:
                continue
            rust = name.replace("-", "_")
            if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(rust)}(::|\s*;|\s*\{{|!)", text):
                failed.append(f"{member}/Cargo.toml [{table}] {name}: never named in its code")
for line in failed:
    print(line)
if failed:
    sys.exit(f"{len(failed)} unused dependenc{'y' if len(failed) == 1 else 'ies'} (remove, or "
             "list in [package.metadata.cohort] used-without-naming with the reason)")
print(f"unused dependencies: none in {len(members)} member(s)")
