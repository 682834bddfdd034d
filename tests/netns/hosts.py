"""N hosts on one machine: network namespaces joined by veth pairs to one
bridge (in a switch namespace of its own), each host on its own address.

    with Hosts(3, rate="200mbit") as net:
        p = net.start(0, ["cairnd", "--listen", net.address(0) + ":0", ...])
        net.partition(2)   # host 2's link down: nothing reaches it
        net.heal(2)

A host's loopback is its own, so two processes on different hosts can only
talk through the veth links: what crosses host boundaries is real network
traffic (counted per host: tx_bytes / rx_bytes). `rate` shapes each host's
egress with tbf (bandwidth). Latency and loss need the netem qdisc, which
this kernel may lack: netem() says whether it is there.

Needs root (CAP_NET_ADMIN) and iproute2. Everything it made is removed on
exit, also after a failure.
"""
import json
import os
import signal
import subprocess
import time

_SUBNET = "10.213.%d" % (os.getpid() % 250)


def _ip(*args, check=True):
    return subprocess.run(("ip",) + args, check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def unavailable():
    """Why hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces"
    name = "cairn-probe-%d" % os.getpid()
    try:
        r = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "no ip (iproute2) on PATH"
    if r.returncode != 0:
        return "ip netns add failed: " + r.stderr.strip()
    _ip("netns", "del", name, check=False)
    return None


class Hosts:
    def __init__(self, n, rate=None):
        self.n = n
        self.tag = "cz%d" % (os.getpid() % 100000)
        self.switch = self.tag + "-sw"
        self.procs = []
        self._made = []
        try:
            self._make(rate)
        except BaseException:
            self.close()
            raise

    def ns(self, i):
        return "%s-h%d" % (self.tag, i)

    def dev(self, i):
        return "%sh%d" % (self.tag, i)  # <= 15 characters

    def address(self, i):
        return "%s.%d" % (_SUBNET, i + 1)

    def _make(self, rate):
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.n):
            ns, dev, port = self.ns(i), self.dev(i), "%ss%d" % (self.tag, i)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", dev, "type", "veth", "peer", "name", port)
            _ip("link", "set", dev, "netns", ns)
            _ip("link", "set", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", self.address(i) + "/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if rate:
                subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                                "rate", rate, "burst", "256kb", "latency", "100ms"],
                               check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def netem(self):
        """Whether the kernel has the netem qdisc (latency, loss)."""
        r = subprocess.run(["tc", "-n", self.ns(0), "qdisc", "add", "dev", "lo", "root",
                            "netem", "delay", "1ms"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode == 0:
            subprocess.run(["tc", "-n", self.ns(0), "qdisc", "del", "dev", "lo", "root"])
        return r.returncode == 0

    def start(self, i, argv, log):
        """Starts argv on host i, stdout and stderr to the file `log`."""
        out = open(log, "ab")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(i)] + list(argv),
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def bytes_sent(self, i):
        """Bytes host i has sent over its link."""
        r = _ip("-n", self.ns(i), "-s", "-j", "link", "show", self.dev(i))
        return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]

    def partition(self, i):
        _ip("-n", self.ns(i), "link", "set", self.dev(i), "down")

    def heal(self, i):
        _ip("-n", self.ns(i), "link", "set", self.dev(i), "up")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for_file(path, timeout, proc=None):
    """Waits until `path` exists and is not empty; False on timeout or when
    `proc` exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False
