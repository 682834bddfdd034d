#!/usr/bin/env python3
"""Tests scripts/check_build_parity.py on small trees it is run over."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "check_build_parity.py")


def run_on(files):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)),
                        exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(textwrap.dedent(text))
        subprocess.run(["git", "init", "-q", root], check=True)
        subprocess.run(["git", "-C", root, "add", "."], check=True)
        done = subprocess.run([sys.executable, CHECKER, root],
                              capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr


BASE = {
    "scripts/build_parity_allowlist.txt": "",
    "lib/a.cc": "", "lib/b.cc": "", "lib/a_test.cc": "", "lib/b_test.cc": "",
    "lib/gen.cu": "", "lib/host.cc": "",
}


class ParityTest(unittest.TestCase):
    def test_twins_with_other_names_foreach_select_and_if_branches_pass(self):
        code, out = run_on(dict(BASE, **{
            "lib/CMakeLists.txt": """
                add_library(cairn_lib a.cc b.cc)  # a comment (with parens)
                foreach(t a_test b_test)
                  cairn_test(${t} SRCS ${t}.cc DEPS cairn_lib)
                endforeach()
                if(CUDA)
                  add_library(cairn_gpu gen.cu a.cc)
                else()
                  add_library(cairn_gpu host.cc)
                endif()
            """,
            "lib/BUILD.bazel": """
                load("@rules_cc//cc:defs.bzl", "cc_library", "cc_test")
                cc_library(name = "lib", srcs = ["a.cc", ":b.cc"])
                [cc_test(name = t, srcs = [t + ".cc"]) for t in ["a_test", "b_test"]]
                cc_library(name = "gpu", srcs = select({
                    "//conditions:default": ["a.cc"],
                    ":off": ["host.cc"],
                }))
                cc_library(name = "host", srcs = ["host.cc"])
            """,
        }))
        self.assertEqual(code, 0, out)
        self.assertIn("5 CMake and 5 Bazel targets", out)

    def test_a_source_missing_on_one_side_names_the_target(self):
        code, out = run_on(dict(BASE, **{
            "lib/CMakeLists.txt": "add_library(cairn_lib a.cc b.cc)\n",
            "lib/BUILD.bazel": 'cc_library(name = "lib", srcs = ["a.cc"])\n',
        }))
        self.assertEqual(code, 1, out)
        self.assertIn("cmake target cairn_lib (lib/CMakeLists.txt) has no "
                      "bazel twin compiling exactly lib/a.cc lib/b.cc", out)
        self.assertIn("bazel target //lib:lib", out)

    def test_a_target_in_one_system_only_needs_an_allowlist_line(self):
        files = dict(BASE, **{
            "lib/CMakeLists.txt": "add_executable(tool a.cc)\n",
            "lib/BUILD.bazel": "",
        })
        code, out = run_on(files)
        self.assertEqual(code, 1, out)
        self.assertIn("cmake target tool", out)
        files["scripts/build_parity_allowlist.txt"] = "cmake tool a reason\n"
        code, out = run_on(files)
        self.assertEqual(code, 0, out)

    def test_a_stale_allowlist_line_is_an_error(self):
        code, out = run_on(dict(BASE, **{
            "lib/CMakeLists.txt": "add_executable(tool a.cc)\n",
            "lib/BUILD.bazel": 'cc_binary(name = "tool", srcs = ["a.cc"])\n',
            "scripts/build_parity_allowlist.txt": "cmake tool a reason\n",
        }))
        self.assertEqual(code, 1, out)
        self.assertIn("is allowed but has a twin", out)

    def test_e2e_tests_compile_their_name_dot_cc_in_both_systems(self):
        files = dict(BASE, **{
            "lib/CMakeLists.txt": "cairn_e2e_test(a_test DEPS x RUNS y)\n",
            "lib/BUILD.bazel": """
                load(":e2e.bzl", "cairn_e2e_test")
                cairn_e2e_test(name = "a_test", runs = {"cairnd": "//x:y"})
            """,
        })
        code, out = run_on(files)
        self.assertEqual(code, 0, out)
        self.assertIn("1 CMake and 1 Bazel targets", out)
        files["lib/BUILD.bazel"] = ""
        code, out = run_on(files)
        self.assertEqual(code, 1, out)
        self.assertIn("cmake target a_test (lib/CMakeLists.txt) has no bazel "
                      "twin compiling exactly lib/a_test.cc", out)


if __name__ == "__main__":
    unittest.main()
