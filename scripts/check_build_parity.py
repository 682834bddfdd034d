#!/usr/bin/env python3
"""Checks that CMake and Bazel build the same C++ targets from the same sources.

Every CMake target (add_library, add_executable, or one of the project's
functions that make one: cairn_test, cairn_e2e_test, cairn_storage_driver,
cairn_fuzzer, cairn_s3_test) that compiles sources must have a Bazel twin
(cc_library, cc_binary, cc_test) compiling exactly the same .cc/.cu files, and
the other way round. Targets are matched by their source set, not their names
(the two systems name them differently: cairn_storage is //storage:storage).
Some targets exist in one system on purpose; each is listed in
scripts/build_parity_allowlist.txt with the reason.

Reads the build files only (no configured build, no Bazel server), so
scripts/lint.sh runs it on a fresh clone. Exits 1 naming every mismatch.
"""

import ast
import collections
import glob as globlib
import os
import re
import subprocess
import sys

# The tree checked: the checkout holding this script, or the first argument.
ROOT = (os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# CUDA kernels (.cu) are left out: Bazel compiles them with a genrule that
# runs nvcc, CMake as CUDA sources of the library.
SOURCE_SUFFIXES = (".cc", ".c", ".cpp")
CMAKE_TARGET_COMMANDS = {
    "add_library", "add_executable", "cairn_test", "cairn_e2e_test",
    "cairn_storage_driver", "cairn_fuzzer", "cairn_s3_test",
    "pybind11_add_module",
}
BAZEL_CC_RULES = {"cc_library", "cc_binary", "cc_test"}
# Macros that make a cc_test of NAME.cc (tests/e2e.bzl).
BAZEL_TEST_MACROS = {"cairn_e2e_test"}


def tracked(pattern):
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


# Checked-in sources only: generated ones (protoc's) are not compared.
TRACKED = frozenset(tracked("*"))


# ---- CMake -----------------------------------------------------------------

def cmake_commands(text):
    """Yields (name, [args]) for every command invocation, comments dropped."""
    text = re.sub(r'#\[(=*)\[.*?\]\1\]', " ", text, flags=re.S)
    lines = []
    for line in text.splitlines():
        out, quoted = [], False
        for ch in line:
            if ch == '"':
                quoted = not quoted
            if ch == "#" and not quoted:
                break
            out.append(ch)
        lines.append("".join(out))
    text = "\n".join(lines)
    pos = 0
    call = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    while True:
        m = call.search(text, pos)
        if not m:
            return
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
            i += 1
        body = text[m.end():i - 1]
        yield m.group(1).lower(), re.findall(r'"[^"]*"|[^\s()]+', body)
        pos = i


def expand_foreach(commands):
    """Unrolls foreach(VAR ITEMS...) ... endforeach() over literal items."""
    out, i = [], 0
    while i < len(commands):
        name, args = commands[i]
        if name != "foreach":
            out.append((name, args))
            i += 1
            continue
        depth, j = 1, i + 1
        while depth:
            if commands[j][0] == "foreach":
                depth += 1
            elif commands[j][0] == "endforeach":
                depth -= 1
            j += 1
        body = expand_foreach(commands[i + 1:j - 1])
        var, items = args[0], [a.strip('"') for a in args[1:]]
        if items[:1] == ["IN"]:  # foreach(x IN LISTS ...): not unrolled
            items = []
        for item in items:
            for body_name, body_args in body:
                out.append((body_name, [a.replace("${%s}" % var, item)
                                        for a in body_args]))
        i = j
    return out


def cmake_targets():
    """{(name, sources): (CMakeLists path, sources)}."""
    targets = {}
    for path in tracked("*CMakeLists.txt"):
        directory = os.path.dirname(path)
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        commands, in_function = [], 0
        for name, args in cmake_commands(text):
            if name in ("function", "macro"):
                in_function += 1
            elif name in ("endfunction", "endmacro"):
                in_function -= 1
            elif not in_function:
                commands.append((name, args))
        for name, args in expand_foreach(commands):
            if name not in CMAKE_TARGET_COMMANDS or not args:
                continue
            target = args[0].strip('"')
            srcs = set()
            # cairn_fuzzer(NAME DEPS...), cairn_e2e_test(NAME ...): NAME.cc
            if name in ("cairn_fuzzer", "cairn_e2e_test"):
                srcs.add(os.path.join(directory, target + ".cc"))
            for arg in args[1:]:
                arg = arg.strip('"').replace("${CMAKE_CURRENT_SOURCE_DIR}/", "")
                if arg.endswith(SOURCE_SUFFIXES) and "$" not in arg:
                    srcs.add(os.path.normpath(os.path.join(directory, arg)))
            srcs &= TRACKED
            if srcs:
                # The same target in two if() branches: one entry per
                # distinct source list.
                targets[(target, frozenset(srcs))] = (path, srcs)
    return {name: value for name, value in targets.items()}


# ---- Bazel -----------------------------------------------------------------

def bazel_targets():
    targets = {}
    for path in tracked("*BUILD.bazel"):
        package = os.path.dirname(path)
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), filename=path)

        def normalize(label):
            if label.startswith("//"):
                pkg, _, name = label[2:].partition(":")
                return os.path.normpath(os.path.join(pkg, name))
            return os.path.normpath(os.path.join(package, label.lstrip(":")))

        # select(): the default branch, the configuration CI builds (CUDA
        # on), which CMake's if() branches give when both are taken together.
        def select(branches, **_):
            return list(branches.get("//conditions:default", []))

        def glob(patterns, exclude=(), **_):
            found = set()
            for pattern in patterns:
                for hit in globlib.glob(os.path.join(ROOT, package, pattern),
                                        recursive=True):
                    found.add(os.path.relpath(hit, os.path.join(ROOT, package)))
            for pattern in exclude:
                for hit in globlib.glob(os.path.join(ROOT, package, pattern),
                                        recursive=True):
                    found.discard(
                        os.path.relpath(hit, os.path.join(ROOT, package)))
            return sorted(found)

        def make_rule(kind):
            def rule(*_, **kwargs):
                if kind in BAZEL_TEST_MACROS:
                    kwargs = dict(kwargs, srcs=[kwargs["name"] + ".cc"])
                elif kind not in BAZEL_CC_RULES:
                    return None
                srcs = {normalize(s) for s in kwargs.get("srcs", [])
                        if isinstance(s, str) and s.endswith(SOURCE_SUFFIXES)}
                srcs &= TRACKED
                if srcs:
                    label = "//%s:%s" % (package, kwargs.get("name", "?"))
                    targets[label] = (path, srcs)
                return None
            return rule

        # Comprehensions look names up as globals, which __missing__ does
        # not serve: every called name is bound up front.
        scope = {"__builtins__": __builtins__}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                scope[node.func.id] = make_rule(node.func.id)
        scope.update(select=select, glob=glob, load=lambda *a, **k: None)
        exec(compile(tree, path, "exec"), scope)
    return targets


# ---- Comparison ------------------------------------------------------------

def allowlist():
    entries = {}
    path = os.path.join(ROOT, "scripts", "build_parity_allowlist.txt")
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            system, _, rest = line.partition(" ")
            target, _, reason = rest.strip().partition(" ")
            if system not in ("cmake", "bazel") or not reason.strip():
                sys.exit("%s:%d: want 'cmake|bazel TARGET REASON'" %
                         (path, number))
            entries[(system, target)] = reason.strip()
    return entries


def main():
    cmake = cmake_targets()
    bazel = bazel_targets()
    allowed = allowlist()
    by_sources = collections.defaultdict(lambda: {"cmake": [], "bazel": []})
    for (name, _), (where, srcs) in cmake.items():
        by_sources[frozenset(srcs)]["cmake"].append((where, name))
    for name, (where, srcs) in bazel.items():
        by_sources[frozenset(srcs)]["bazel"].append((where, name))
    errors = []
    used = set()
    for srcs, sides in sorted(by_sources.items(), key=lambda kv: sorted(kv[0])):
        if len(sides["cmake"]) == len(sides["bazel"]):
            continue
        short, other = (("cmake", "bazel")
                        if len(sides["cmake"]) < len(sides["bazel"])
                        else ("bazel", "cmake"))
        unmatched = sides[other][len(sides[short]):]
        for where, name in unmatched:
            key = (other, name)
            if key in allowed:
                used.add(key)
                continue
            errors.append("%s target %s (%s) has no %s twin compiling "
                          "exactly %s" % (other, name, where, short,
                                          " ".join(sorted(srcs))))
    for key in sorted(set(allowed) - used):
        errors.append("scripts/build_parity_allowlist.txt: %s %s is allowed "
                      "but has a twin (or no longer exists): drop the line" %
                      key)
    for error in errors:
        print("build parity: " + error)
    if errors:
        return 1
    print("build parity: %d CMake and %d Bazel targets list the same sources "
          "(%d allowed in one only)" % (len(cmake), len(bazel), len(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
