"""A small HTTP/1.1 reverse proxy that injects S3 faults, for Cairn's S3
fault tests (tests/s3/s3_fault_test.py).

It sits between Cairn's processes and radosgw and forwards every request
byte for byte (the Host header too, so SigV4 signatures made for the proxy's
address stay valid: radosgw checks them against the Host it receives). A rule
decides, per request, whether to answer it itself instead: an S3 error (503
SlowDown, 500 InternalError, 429), a connection reset, or a delay before
forwarding. Counters say how many requests of each kind passed and how many
faults were injected, so a test can check that faults really happened.

Python standard library only; one thread per client connection, one upstream
connection per client connection (keep-alive on both sides).

Example:
    proxy = FaultProxy(("127.0.0.1", 7482))
    proxy.rule = lambda req: ("status", 503, "SlowDown") if req.n % 3 == 0 else None
    ... point clients at http://127.0.0.1:%d % proxy.port ...
    proxy.counts()   # {"requests": .., "injected": .., "by_kind": {...}}
    proxy.close()
"""

import socket
import threading
import time
from typing import Callable, Dict, Optional, Tuple

_REASONS = {429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class Request:
    """What a rule sees of one request."""

    def __init__(self, n: int, method: str, target: str, headers: Dict[str, str]):
        self.n = n              # 1-based sequence number over the proxy's life
        self.method = method    # GET, PUT, POST, HEAD, DELETE
        self.target = target    # "/bucket/key?query"
        self.headers = headers  # lower-cased names

    @property
    def kind(self) -> str:
        """"part", "put", "create-upload", "complete-upload", "get", "head",
        "list", "delete", or the method."""
        path, _, query = self.target.partition("?")
        if self.method == "PUT":
            return "part" if "partNumber=" in query else "put"
        if self.method == "POST":
            if query.startswith("uploads") or "&uploads" in query:
                return "create-upload"
            if "uploadId=" in query:
                return "complete-upload"
            return "post"
        if self.method == "GET":
            return "list" if path.count("/") <= 1 or "list-type" in query or \
                "uploads" in query else "get"
        return self.method.lower()


# A rule returns None (forward), ("status", code, s3_code), ("reset",) or
# ("delay", seconds).
Rule = Callable[[Request], Optional[Tuple]]


class _Conn:
    """Buffered reads from a socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 20)
        if not data:
            return False
        self.buf += data
        return True

    def read_until(self, sep: bytes) -> Optional[bytes]:
        while sep not in self.buf:
            if not self._fill():
                return None
        head, _, self.buf = self.buf.partition(sep)
        return head

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("peer closed mid-body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_chunked(self) -> bytes:
        """A chunked body, returned re-encoded as it came."""
        out = b""
        while True:
            line = self.read_until(b"\r\n")
            if line is None:
                raise ConnectionError("peer closed mid-chunk")
            size = int(line.split(b";")[0], 16)
            out += line + b"\r\n" + self.read_exact(size + 2)
            if size == 0:
                # Trailers (none from S3) end with an empty line, which the
                # +2 above already consumed.
                return out


def _parse_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _read_body(conn: _Conn, headers: Dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return conn.read_chunked()
    return conn.read_exact(int(headers.get("content-length", "0")))


class FaultProxy:
    """The proxy; see the module comment."""

    def __init__(self, upstream: Tuple[str, int], rule: Optional[Rule] = None):
        self.upstream = upstream
        self.rule: Rule = rule or (lambda req: None)
        self._lock = threading.Lock()
        self._n = 0
        self._by_kind: Dict[str, int] = {}
        self._injected: Dict[str, int] = {}
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self) -> Dict:
        with self._lock:
            return {"requests": self._n, "by_kind": dict(self._by_kind),
                    "injected": sum(self._injected.values()),
                    "injected_by": dict(self._injected)}

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    # ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,),
                             daemon=True).start()

    def _count(self, req: Request, fault: Optional[Tuple]) -> None:
        with self._lock:
            self._by_kind[req.kind] = self._by_kind.get(req.kind, 0) + 1
            if fault is not None and fault[0] != "delay":
                key = f"{req.kind}:{fault[0]}" + (
                    f":{fault[1]}" if fault[0] == "status" else "")
                self._injected[key] = self._injected.get(key, 0) + 1

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        c = _Conn(client)
        try:
            while True:
                head = c.read_until(b"\r\n\r\n")
                if head is None:
                    return
                request_line, headers = _parse_head(head)
                method, target, _ = request_line.split(" ", 2)
                with self._lock:
                    self._n += 1
                    n = self._n
                req = Request(n, method, target, headers)
                fault = self.rule(req)
                self._count(req, fault)
                if fault is not None and fault[0] == "reset":
                    # An abrupt RST, before the body is read: the client sees
                    # its connection reset mid-request.
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    client.close()
                    return
                if headers.get("expect", "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(c, headers)
                if fault is not None and fault[0] == "status":
                    _, code, s3_code = fault
                    xml = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error>"
                           f"<Code>{s3_code}</Code><Message>injected by "
                           f"fault_proxy</Message></Error>").encode()
                    client.sendall(
                        f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\n"
                        f"Content-Type: application/xml\r\n"
                        f"Content-Length: {len(xml)}\r\n\r\n".encode() + xml)
                    continue
                if fault is not None and fault[0] == "delay":
                    time.sleep(fault[1])
                if upstream is None:
                    upstream = _Conn(socket.create_connection(self.upstream,
                                                              timeout=120))
                upstream.sock.sendall(head + b"\r\n\r\n" + body)
                # The response, skipping interim 1xx answers to our Expect.
                while True:
                    rhead = upstream.read_until(b"\r\n\r\n")
                    if rhead is None:
                        raise ConnectionError("upstream closed")
                    status_line, rheaders = _parse_head(rhead)
                    status = int(status_line.split(" ")[1])
                    if status >= 200:
                        break
                if method == "HEAD" or status in (204, 304):
                    rbody = b""
                else:
                    rbody = _read_body(upstream, rheaders)
                client.sendall(rhead + b"\r\n\r\n" + rbody)
        except (OSError, ConnectionError, ValueError):
            return
        finally:
            for s in (client, upstream.sock if upstream else None):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
