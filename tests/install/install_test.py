#!/usr/bin/python3
"""Installs Cairn from an already built tree into a staged prefix and uses it
from an out-of-tree project, as a training job would (ctest: install_test).

  1. `cmake --install BUILD --prefix WORK/stage` (nothing is rebuilt).
  2. Checks the installed tree: libcairn.so.MAJOR with that SONAME, the
     binaries print `<name> <VERSION>` for --version, the CMake package
     version and cairn.pc's Version are the VERSION file's, and no installed
     header includes a generated proto/gRPC header.
  3. Configures and builds tests/install/consumer with
     find_package(cairn REQUIRED): the save/load program (cairn::client), an
     agent-mode program (cairn::agent_client), the library example of
     docs/cpp.md (the C++ block after the `compiled-by` marker, as written) and every
     installed header alone, all with -Wall -Wextra -Werror.
  4. Builds the save/load program once more through pkg-config only.
  5. Runs both builds of it: each starts the installed cairnd, saves from 2
     rank processes, loads in 2 rank processes with another layout and
     checks every byte.
Any failure exits 1 naming the step.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys

# The document holding the library example, and the marker before it.
EXAMPLE_DOC = os.path.join("docs", "cpp.md")
EXAMPLE_MARKER = "<!-- compiled-by: tests/install/install_test.py"
BINARIES = ("cairnd", "cairn", "cairn-agent")
# What a public header must not include: generated protobuf/gRPC code.
PROTO_INCLUDE = re.compile(
    r'^\s*#\s*include\s*[<"]((cairn/v1/[^">]*\.pb\.h)|(grpcpp/[^">]*)|'
    r'(grpc/[^">]*)|(google/protobuf/[^">]*))[">]', re.M)


class Failure(Exception):
    pass


def run(cmd, env=None, cwd=None, what=None):
    """Runs `cmd`; returns its stdout. Failure (with its output) if it fails."""
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise Failure("%s failed (exit %d): %s\n%s" %
                      (what or cmd[0], p.returncode, shlex.join(cmd), p.stdout))
    return p.stdout


def read_version(source_dir):
    with open(os.path.join(source_dir, "VERSION")) as f:
        return f.readline().strip()


def doc_example(source_dir):
    """The C++ block that follows the compiled-by marker in EXAMPLE_DOC."""
    with open(os.path.join(source_dir, EXAMPLE_DOC)) as f:
        text = f.read()
    if text.count(EXAMPLE_MARKER) != 1:
        raise Failure("%s must hold exactly one '%s ...-->' marker before "
                      "the library example (found %d)" %
                      (EXAMPLE_DOC, EXAMPLE_MARKER, text.count(EXAMPLE_MARKER)))
    after = text[text.index(EXAMPLE_MARKER):]
    m = re.match(r"<!--[^\n]*-->\n```(?:cpp|c\+\+)\n(.*?)\n```\n", after, re.S)
    if not m:
        raise Failure(EXAMPLE_DOC + ": the compiled-by marker must be followed "
                      "directly by a ```cpp block")
    return m.group(1) + "\n"


def check_tree(stage, version, source_dir):
    major = version.split(".")[0]
    lib = os.path.join(stage, "lib")
    real = os.path.join(lib, "libcairn.so." + version)
    if not os.path.isfile(real) or os.path.islink(real):
        raise Failure("no %s" % real)
    for link in ("libcairn.so." + major, "libcairn.so"):
        if not os.path.islink(os.path.join(lib, link)):
            raise Failure("no symlink %s in %s" % (link, lib))
    dyn = run(["readelf", "-d", real], what="readelf")
    if "Library soname: [libcairn.so.%s]" % major not in dyn:
        raise Failure("libcairn's SONAME is not libcairn.so.%s:\n%s" % (major, dyn))

    commit_expected = os.path.exists(os.path.join(source_dir, ".git"))
    for name in BINARIES:
        out = run([os.path.join(stage, "bin", name), "--version"],
                  what=name + " --version").strip()
        if not out.startswith("%s %s" % (name, version)):
            raise Failure("%s --version printed %r, want '%s %s ...'" %
                          (name, out, name, version))
        if commit_expected and not re.search(r"\(commit [0-9a-f]{7,40}\)", out):
            raise Failure("%s --version printed %r: no git commit" % (name, out))
        print("  %s" % out)

    with open(os.path.join(lib, "cmake", "cairn",
                           "cairnConfigVersion.cmake")) as f:
        m = re.search(r'set\(PACKAGE_VERSION "([^"]*)"\)', f.read())
    if not m or m.group(1) != version:
        raise Failure("cairnConfigVersion.cmake has version %s, VERSION says %s" %
                      (m and m.group(1), version))
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(lib, "pkgconfig"))
    pc_version = run(["pkg-config", "--modversion", "cairn"], env=env,
                     what="pkg-config --modversion cairn").strip()
    if pc_version != version:
        raise Failure("cairn.pc has Version %s, VERSION says %s" %
                      (pc_version, version))


def installed_headers(stage):
    root = os.path.join(stage, "include")
    for d, _, files in os.walk(os.path.join(root, "cairn")):
        for f in sorted(files):
            path = os.path.join(d, f)
            yield os.path.relpath(path, root), path


def check_proto_free(stage):
    """No installed header includes (or is) generated protobuf/gRPC code."""
    bad = []
    for rel, path in installed_headers(stage):
        if rel.endswith(".pb.h"):
            bad.append("%s is a generated header" % rel)
            continue
        with open(path) as f:
            for m in PROTO_INCLUDE.finditer(f.read()):
                bad.append("%s includes %s" % (rel, m.group(1)))
    if bad:
        raise Failure("the public headers expose generated proto/gRPC code:\n  " +
                      "\n  ".join(bad))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--cxx", default="c++")
    ap.add_argument("--cxx-launcher", default="")
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--require-proto-free-headers", action="store_true",
                    help="fail if an installed header includes proto/gRPC code")
    args = ap.parse_args()

    source = os.path.abspath(args.source_dir)
    work = os.path.abspath(args.work_dir)
    stage = os.path.join(work, "stage")
    consumer_src = os.path.join(source, "tests", "install", "consumer")
    version = read_version(source)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    step = "install"
    try:
        print("== cmake --install %s --prefix %s" % (args.build_dir, stage))
        run(["cmake", "--install", args.build_dir, "--prefix", stage],
            what="cmake --install")

        step = "installed tree"
        print("== installed tree (version %s)" % version)
        check_tree(stage, version, source)
        if args.require_proto_free_headers:
            check_proto_free(stage)
            print("  no installed header includes generated proto/gRPC code")

        step = EXAMPLE_DOC + " example"
        example = os.path.join(work, "doc_example.cc")
        with open(example, "w") as f:
            f.write(doc_example(source))

        step = "consumer (CMake package)"
        print("== out-of-tree consumer: find_package(cairn)")
        build = os.path.join(work, "consumer-build")
        configure = ["cmake", "-S", consumer_src, "-B", build, "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=Release",
                     "-DCMAKE_CXX_COMPILER=" + args.cxx,
                     "-DCMAKE_PREFIX_PATH=" + stage,
                     "-DCAIRN_EXPECTED_VERSION=" + version,
                     "-DCAIRN_DOC_EXAMPLE=" + example]
        if args.cxx_launcher:
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=" + args.cxx_launcher)
        print(run(configure, what="consumer configure").strip().split("\n")[-4])
        run(["cmake", "--build", build, "-j", args.jobs], what="consumer build")

        step = "consumer (pkg-config)"
        print("== out-of-tree consumer: pkg-config cairn")
        env = dict(os.environ,
                   PKG_CONFIG_PATH=os.path.join(stage, "lib", "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "cairn"], env=env,
                    what="pkg-config --cflags --libs cairn").split()
        pc_binary = os.path.join(work, "save_load_consumer_pkgconfig")
        compile_cmd = ([args.cxx_launcher] if args.cxx_launcher else []) + [
            args.cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror",
            os.path.join(consumer_src, "save_load_consumer.cc"), "-o", pc_binary
        ] + flags + ["-Wl,-rpath," + os.path.join(stage, "lib")]
        run(compile_cmd, what="g++ $(pkg-config --cflags --libs cairn)")

        step = "save and load"
        for binary in (os.path.join(build, "save_load_consumer"), pc_binary):
            needed = run(["readelf", "-d", binary], what="readelf")
            if "[libcairn.so.%s]" % version.split(".")[0] not in needed:
                raise Failure("%s does not link libcairn.so.%s" %
                              (binary, version.split(".")[0]))
            print("== %s (installed cairnd, 2 ranks save, 2 ranks load "
                  "resharded)" % os.path.basename(binary))
            out = run([binary, "--cairnd", os.path.join(stage, "bin", "cairnd"),
                       "--dir", os.path.join(work, "run-" + os.path.basename(binary))],
                      what=os.path.basename(binary))
            print("  " + out.strip().replace("\n", "\n  "))
    except Failure as e:
        print("FAILED at step '%s': %s" % (step, e), file=sys.stderr)
        return 1
    print("install test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
