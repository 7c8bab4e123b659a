#!/usr/bin/env python3
"""The runtime's layers (runtime/README.md): no part includes a header of a
part above it, and no public header includes an internal one.

Usage: layering_test.py SOURCE_DIR

Each runtime/<part>/ folder, each public header of
runtime/include/spindle/runtime/ (by the part it belongs to), actors/ and
messages/ has a layer; every `#include "..."` of a spindle header must name
one of its own layer or below. Fails listing every include that breaks the
rule, and on a file of the library in no known part.
"""
import os
import re
import sys

# Top to bottom; a part may include its own layer and those below.
LAYERS = [
    ["server", "cli", "stress", "console"],
    ["facade"],
    ["conversation", "memory", "cluster"],
    ["llm", "storage", "files", "tenancy", "admission"],
    ["net"],
    ["core"],
    ["actors"],
    ["messages"],
]
LEVEL = {part: len(LAYERS) - i for i, parts in enumerate(LAYERS)
         for part in parts}

# The public headers' parts (docs/embedding.md, "What is public").
PUBLIC = {
    "runtime.hpp": "facade",
    "conversation.hpp": "conversation",
    "rewriter.hpp": "conversation",
    "memory.hpp": "memory",
    "cluster.hpp": "cluster",
    "llm.hpp": "llm",
    "flow.hpp": "llm",
    "openai_provider.hpp": "llm",
    "summarizer.hpp": "llm",
    "tokenizer.hpp": "llm",
    "storage.hpp": "storage",
    "process.hpp": "files",
    "limits.hpp": "admission",
    "config.hpp": "core",
    "actor_pool.hpp": "core",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def part_of_file(rel):
    """The part a file of the tree belongs to, or None if it is no
    library file."""
    bits = rel.split("/")
    if bits[0] in ("actors", "messages"):
        return bits[0]
    if bits[0] != "runtime":
        return None
    if bits[1] == "include":
        name = bits[-1]
        if name not in PUBLIC:
            raise SystemExit(f"{rel}: a public header of no known part "
                             "(add it to PUBLIC and docs/embedding.md)")
        return PUBLIC[name]
    return bits[1]


def part_of_include(target, includer_dir, root):
    """The part an include names: spindle/<dir>/..., <part>/..., or a
    header beside the includer."""
    if target.startswith("spindle/runtime/"):
        name = target.split("/")[-1]
        return PUBLIC.get(name, "?" + target)
    if target.startswith("spindle/actors/"):
        return "actors"
    if target.startswith("spindle/messages/"):
        return "messages"
    if target == "spindle/version.hpp":
        return "messages"
    head = target.split("/")[0]
    if "/" in target and head in LEVEL:
        return head
    if os.path.exists(os.path.join(includer_dir, target)):
        return None  # beside the includer: its own part
    return None if "/" not in target else "?" + target


def main():
    root = os.path.abspath(sys.argv[1])
    broken = []
    unknown = []
    checked = 0
    for top in ("runtime", "actors", "messages"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith((".cpp", ".hpp")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                part = part_of_file(rel)
                if part not in LEVEL:
                    unknown.append(rel)
                    continue
                checked += 1
                text = open(path, encoding="utf-8").read()
                for target in INCLUDE.findall(text):
                    other = part_of_include(target, dirpath, root)
                    if other is None:
                        continue
                    if other.startswith("?"):
                        broken.append(f"{rel}: includes {target}, which is "
                                      "in no known part")
                    elif LEVEL[other] > LEVEL[part]:
                        broken.append(f"{rel} ({part}) includes {target} "
                                      f"({other}, a layer above)")
                    elif (rel.startswith("runtime/include/")
                          and not target.startswith("spindle/")):
                        broken.append(f"{rel}: a public header includes the "
                                      f"internal {target}")
                    elif (top in ("actors", "messages")
                          and not target.startswith("spindle/")
                          and other != part):
                        broken.append(f"{rel}: includes the runtime's "
                                      f"internal {target}")
    for line in unknown:
        print(f"{line}: in no part of the layers", file=sys.stderr)
    for line in broken:
        print(line, file=sys.stderr)
    if unknown or broken or checked < 100:
        return 1
    print(f"{checked} files, every include at its own layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
