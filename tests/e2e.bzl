"""cairn_e2e_test: an end-to-end test of tests/ (testing/e2e_harness.h)."""

load("@rules_cc//cc:defs.bzl", "cc_test")

def cairn_e2e_test(name, runs, deps = []):
    """The test `name`.cc, its main testing/e2e_main.cc.

    Args:
      name: the test, and its source without ".cc".
      runs: what it runs, {flag: label}: each is passed as --flag=PATH
        (e2e_harness.h's BinaryPaths) and is in the test's data.
      deps: libraries beside :e2e.
    """
    cc_test(
        name = name,
        size = "large",
        srcs = [name + ".cc"],
        args = ["--%s=$(location %s)" % (flag, label) for flag, label in runs.items()],
        copts = ["-Werror"],
        data = runs.values(),
        deps = [":e2e"] + deps,
    )
