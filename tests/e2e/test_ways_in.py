"""Each cloud's own ways in, as its SDKs and tools take them, on real emulators (moto, fake-gcs-server,
Azurite) and, where the emulator does not check what the cloud checks, behind `servers.CloudRules`,
a stand-in that refuses as the cloud refuses:

- S3: a web-identity token exchanged at STS (moto's AssumeRoleWithWebIdentity), a profile's
  `endpoint_url`, `AWS_ENDPOINT_URL_S3`, a bucket in another region read with no `--region` (the
  stand-in refuses a wrong-region signature as S3 does; moto signs nothing), Requester Pays
  (moto stores the setting and does not check it: the stand-in does);
- GCS: fake-gcs-server started with its defaults and `STORAGE_EMULATOR_HOST` only; an
  `external_account` credential file (Workload Identity Federation) and its service-account
  impersonation, and gcloud's `impersonated_service_account` file, the token exchanges served
  locally; Requester Pays (`--billing-project`;
  fake-gcs-server does not check it: the stand-in does);
- Azure: a SAS in the URL and in `AZURE_STORAGE_SAS_TOKEN`, an account key, the Azure CLI's
  login with no flag (an `az` on PATH);
- no credentials at all: each store's message lists the sources tried, within 10 s, every
  metadata endpoint (EC2/ECS, GCE, Azure managed identity) pointed at a closed local port;
- no credential (secret key, SAS `sig=`, bearer token, account key) in a log, stats, metrics,
  an error message or a process's command line, searched after each store's run.

No request leaves the machine: every environment here comes from `offline_env`."""
import datetime
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from conftest import DATA, loosefs_bin, missing_prerequisite, need_mount
import servers

#: Every cloud's metadata and token endpoints at a closed local port.
CLOSED = "127.0.0.1:9"


def offline_env(home: pathlib.Path, **extra) -> dict:
    """The environment of a user with nothing configured for any cloud, whose every metadata
    endpoint is a closed local port (EC2 and ECS, GCE, Azure's managed identity), and `az`
    off PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "GCE_", "STORAGE_EMULATOR", "AZURE_", "CLOUDSDK_"))}
    env.update(HOME=str(home), AWS_EC2_METADATA_SERVICE_ENDPOINT=f"http://{CLOSED}",
               AWS_CONTAINER_CREDENTIALS_FULL_URI=f"http://{CLOSED}/creds",
               GCE_METADATA_HOST=CLOSED, GCE_METADATA_IP=CLOSED,
               AZURE_MSI_ENDPOINT=f"http://{CLOSED}/metadata/identity/oauth2/token",
               PATH=os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                    if not (pathlib.Path(p) / "az").exists()))
    home.mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


class Run:
    """One `loosefs mount` in the background, its log, and everything a secret could leak into
    while it is mounted: the launcher's output, the daemon's command line, the mount table,
    the log, stats and metrics (`text`)."""

    def __init__(self, url, work: pathlib.Path, *args, env, check=True):
        self.mnt = work / f"mnt{random.randrange(1 << 30)}"
        self.mnt.mkdir(parents=True)
        self.log = work / f"{self.mnt.name}.log"
        self.metrics = servers.free_port()
        t0 = time.monotonic()
        self.r = subprocess.run([loosefs_bin(), "mount", url, str(self.mnt), "--log", str(self.log),
                                 "--cache-dir", str(work / f"cache{random.randrange(1 << 30)}"),
                                 "--cache-size", "1G", "--metrics-addr", f"127.0.0.1:{self.metrics}", *args],
                                env=env, capture_output=True, text=True, timeout=120)
        self.secs = time.monotonic() - t0
        if check:
            assert self.r.returncode == 0, self.r.stderr

    def __enter__(self):
        return self

    def text(self) -> str:
        """Everything readable about this mount now."""
        parts = [self.r.stdout, self.r.stderr]
        if self.log.exists():
            parts.append(self.log.read_text(errors="replace"))
        if self.r.returncode == 0:
            parts.append((self.mnt / ".loosefs" / "stats").read_text())
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=30) as r:
                parts.append(r.read().decode())
            parts.append(pathlib.Path("/proc/self/mountinfo").read_text())
            for p in pathlib.Path("/proc").iterdir():
                try:
                    cmd = (p / "cmdline").read_bytes()
                except OSError:
                    continue
                if str(self.mnt).encode() in cmd:
                    parts.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
                    parts.append(f"(pid {p.name})")
        return "\n".join(parts)

    def assert_secret_free(self, *secrets):
        said = self.text()
        assert "(pid " in said or self.r.returncode != 0, "no daemon found to search"
        for s in secrets:
            assert s and s not in said, f"a credential appears: {s[:4]}…"

    def __exit__(self, *a):
        if self.r.returncode == 0:
            subprocess.run([loosefs_bin(), "umount", str(self.mnt)], check=True, timeout=60)


def same_files(mnt: pathlib.Path, source: pathlib.Path):
    want = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    got = sorted(p.relative_to(mnt) for p in mnt.rglob("*") if p.is_file())
    assert want == got and want
    for rel in want:
        assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """A small tree of real images (12 JPEGs in 3 classes) and its pack."""
    work = tmp_path_factory.mktemp("ways-in")
    source = work / "source"
    jpegs = sorted(DATA.rglob("*.JPEG"))[:12]
    if not jpegs:
        missing_prerequisite("no sample JPEGs")
    for i, j in enumerate(jpegs):
        d = source / f"class{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(j, d / j.name)
    pack = work / "data.pack"
    subprocess.run([loosefs_bin(), "pack", str(source), str(pack)], check=True, capture_output=True, timeout=300)
    return work, source, pack


@pytest.fixture(scope="module")
def moto(sample):
    work, source, pack = sample
    m = servers.Moto(work / "moto", bucket="data").start()
    c = m.client()
    c.upload_file(str(pack), "data", "data.pack")
    for f in source.rglob("*"):
        if f.is_file():
            c.upload_file(str(f), "data", f"loose/{f.relative_to(source)}")
    for b in ("faraway", "payers"):
        c.create_bucket(Bucket=b)
        c.upload_file(str(pack), b, "data.pack")
        for f in source.rglob("*"):
            if f.is_file():
                c.upload_file(str(f), b, f"loose/{f.relative_to(source)}")
    c.put_bucket_request_payment(Bucket="payers", RequestPaymentConfiguration={"Payer": "Requester"})
    yield m
    m.stop()


def aws_keys(home: pathlib.Path, **extra) -> dict:
    return offline_env(home, AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY, **extra)


def test_s3_web_identity_is_exchanged_at_sts_and_no_key_is_anywhere(moto, sample, tmp_path):
    need_mount()
    work, source, _ = sample
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJsb29zZWZzIn0.c2ln")
    env = offline_env(tmp_path / "home", AWS_ROLE_ARN="arn:aws:iam::123456789012:role/datasets",
                      AWS_WEB_IDENTITY_TOKEN_FILE=str(token), AWS_ROLE_SESSION_NAME="loosefs",
                      AWS_ENDPOINT_URL_STS=moto.endpoint, AWS_REGION="us-east-1")
    with Run("s3://data/data.pack", tmp_path, "--endpoint-url", moto.endpoint, "--allow-http", env=env) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(token.read_text())


def test_s3_endpoint_from_the_variable_and_from_the_profile(moto, sample, tmp_path):
    need_mount()
    _, source, _ = sample
    env = aws_keys(tmp_path / "home", AWS_ENDPOINT_URL_S3=moto.endpoint)
    with Run("s3://data/loose/", tmp_path, "--allow-http", env=env) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(servers.SECRET_KEY)
    home = tmp_path / "home2"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text(f"[profile lab]\nregion = us-east-1\nendpoint_url = {moto.endpoint}\n")
    (home / ".aws" / "credentials").write_text(
        f"[lab]\naws_access_key_id = {servers.ACCESS_KEY}\naws_secret_access_key = {servers.SECRET_KEY}\n")
    with Run("s3://data/data.pack", tmp_path, "--profile", "lab", "--allow-http", env=offline_env(home)) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(servers.SECRET_KEY)


def test_an_env_file_gives_the_daemon_its_store_settings_and_keys(moto, sample, tmp_path):
    """`--env-file` (as the Slurm prolog hands the site's file): the keys, the endpoint and a
    LOOSEFS_* option (plain http allowed) from the file, nothing on the command line; a variable
    the file may not set is refused naming its line, never its value."""
    need_mount()
    _, source, _ = sample
    f = tmp_path / "site.env"
    f.write_text(f"# the site's\nAWS_ACCESS_KEY_ID={servers.ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={servers.SECRET_KEY}\n"
                 f"AWS_ENDPOINT_URL_S3={moto.endpoint}\nLOOSEFS_ALLOW_HTTP=true\n")
    f.chmod(0o600)
    with Run("s3://data/data.pack", tmp_path, "--env-file", str(f), env=offline_env(tmp_path / "home")) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(servers.SECRET_KEY)
    f.write_text("AWS_REGION=us-east-1\nLD_PRELOAD=/tmp/evil.so\n")
    m = Run("s3://data/data.pack", tmp_path, "--env-file", str(f), env=offline_env(tmp_path / "home"), check=False)
    assert m.r.returncode == 2 and "line 2" in m.r.stderr and "evil" not in m.r.stderr, m.r.stderr


def test_s3_a_bucket_in_another_region_is_read_with_no_region_given(moto, sample, tmp_path):
    """The stand-in refuses any request to `faraway` signed for another region than eu-west-3,
    as S3 does (a HEAD: the region in a header; a GET or a listing: in the error document).
    Each client is refused once, then signs for eu-west-3 for good."""
    need_mount()
    _, source, _ = sample
    rules = servers.CloudRules(moto.port, regions={"faraway": "eu-west-3"}).start()
    try:
        for url in ("s3://faraway/data.pack", "s3://faraway/loose/"):
            before = rules.refused
            with Run(url, tmp_path, "--endpoint-url", rules.endpoint, "--allow-http",
                     env=aws_keys(tmp_path / "home")) as m:
                same_files(m.mnt, source)
                assert "region eu-west-3" in m.log.read_text() + m.r.stderr
            assert 1 <= rules.refused - before <= 4, rules.refused - before
        # Given the right region, nothing is refused.
        before = rules.refused
        with Run("s3://faraway/data.pack", tmp_path, "--endpoint-url", rules.endpoint, "--allow-http",
                 "--region", "eu-west-3", env=aws_keys(tmp_path / "home")) as m:
            same_files(m.mnt, source)
        assert rules.refused == before
    finally:
        rules.stop()


def test_s3_requester_pays(moto, sample, tmp_path):
    need_mount()
    _, source, _ = sample
    rules = servers.CloudRules(moto.port, requester_pays={"payers"}).start()
    try:
        args = ["--endpoint-url", rules.endpoint, "--allow-http"]
        m = Run("s3://payers/data.pack", tmp_path, *args, env=aws_keys(tmp_path / "home"), check=False)
        assert m.r.returncode != 0 and "--request-payer" in m.r.stderr, m.r.stderr
        with Run("s3://payers/data.pack", tmp_path, *args, "--request-payer", env=aws_keys(tmp_path / "home")) as m:
            same_files(m.mnt, source)
        assert all(h.get("x-amz-request-payer") == "requester" for _, p, h in rules.seen[-3:])
    finally:
        rules.stop()


# --- GCS ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gcs(sample):
    work, source, pack = sample
    data = work / "gcs-data"
    (data / "bkt").mkdir(parents=True)
    shutil.copyfile(pack, data / "bkt" / "data.pack")
    shutil.copytree(source, data / "bkt" / "loose")
    server = servers.FakeGcs(work / "gcs", data).start()  # its defaults: no -public-host
    yield server
    server.stop()


def test_gcs_emulator_started_with_its_defaults_and_storage_emulator_host_only(gcs, sample, tmp_path):
    need_mount()
    _, source, _ = sample
    env = offline_env(tmp_path / "home", STORAGE_EMULATOR_HOST=gcs.host)
    for url in ("gs://bkt/data.pack", "gs://bkt/loose/"):
        with Run(url, tmp_path, env=env) as m:
            same_files(m.mnt, source)


class TokenService:
    """Google's STS, OAuth and IAM Credentials token endpoints, served locally: `POST /v1/token`
    (RFC 8693 token exchange) answers `federated` for the subject token it expects; `POST
    /oauth2/token` (a refresh-token grant, as gcloud's user credentials use) answers `user` for
    the refresh token `REFRESH`; `POST /v1/projects/-/serviceAccounts/SA:generateAccessToken`
    answers `impersonated` for a request bearing either."""

    REFRESH = "1//refresh-" + os.urandom(6).hex()

    def __init__(self, subject: str):
        self.subject, self.calls = subject, []
        self.federated, self.impersonated = "ya29.federated-" + os.urandom(6).hex(), "ya29.imp-" + os.urandom(6).hex()
        self.user = "ya29.user-" + os.urandom(6).hex()

    def start(self):
        import http.server
        import urllib.parse

        svc = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                svc.calls.append(self.path)
                if self.path == "/v1/token":
                    form = dict(urllib.parse.parse_qsl(body))
                    ok = form.get("subject_token") == svc.subject and \
                        form.get("grant_type") == "urn:ietf:params:oauth:grant-type:token-exchange"
                    out = {"access_token": svc.federated, "issued_token_type":
                           "urn:ietf:params:oauth:token-type:access_token", "token_type": "Bearer",
                           "expires_in": 3600} if ok else {"error": "invalid_grant"}
                    code = 200 if ok else 400
                elif self.path == "/oauth2/token":  # a form, or JSON (Google's Rust library's)
                    form = json.loads(body) if body.lstrip().startswith("{") else dict(urllib.parse.parse_qsl(body))
                    ok = form.get("grant_type") == "refresh_token" and form.get("refresh_token") == svc.REFRESH
                    out = {"access_token": svc.user, "token_type": "Bearer", "expires_in": 3600} if ok \
                        else {"error": "invalid_grant"}
                    code = 200 if ok else 400
                elif self.path.endswith(":generateAccessToken"):
                    ok = self.headers.get("Authorization") in (f"Bearer {svc.federated}", f"Bearer {svc.user}")
                    expire = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
                    out = {"accessToken": svc.impersonated,
                           "expireTime": expire.strftime("%Y-%m-%dT%H:%M:%SZ")} if ok else {"error": {"code": 403}}
                    code = 200 if ok else 403
                else:
                    out, code = {"error": "not found"}, 404
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        import threading
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("impersonate", [False, True], ids=["federated", "impersonated"])
def test_gcs_workload_identity_federation_from_a_credential_file(gcs, sample, tmp_path, impersonate):
    """An `external_account` file as `gcloud iam workload-identity-pools create-cred-config`
    writes it: the subject token read from a file, exchanged at the (local) STS, then, with
    `service_account_impersonation_url`, exchanged for the service account's token. The bearer
    token the requests carry is the last one; it appears nowhere."""
    need_mount()
    _, source, _ = sample
    subject = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3b3JrbG9hZCJ9.c2ln"
    (tmp_path / "subject").write_text(subject)
    svc = TokenService(subject).start()
    # Not an emulator's variable (that takes no credentials): an endpoint, whose XML API
    # fake-gcs-server answers on its public host, this stand-in's address.
    rules = servers.CloudRules(0).start()
    server = servers.FakeGcs(tmp_path / "gcs", gcs.data, public_host=f"127.0.0.1:{rules.port}").start()
    rules.target = server.port
    try:
        cred = {"type": "external_account",
                "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/q",
                "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
                "token_url": f"http://127.0.0.1:{svc.port}/v1/token",
                "credential_source": {"file": str(tmp_path / "subject")}}
        if impersonate:
            cred["service_account_impersonation_url"] = (
                f"http://127.0.0.1:{svc.port}/v1/projects/-/serviceAccounts/"
                "reader@proj.iam.gserviceaccount.com:generateAccessToken")
        (tmp_path / "wif.json").write_text(json.dumps(cred))
        env = offline_env(tmp_path / "home", GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "wif.json"))
        with Run("gs://bkt/data.pack", tmp_path, "--endpoint-url", rules.endpoint, "--allow-http", env=env) as m:
            same_files(m.mnt, source)
            bearer = svc.impersonated if impersonate else svc.federated
            assert rules.seen and all(h.get("authorization") == f"Bearer {bearer}" for _, _, h in rules.seen)
            m.assert_secret_free(svc.federated, svc.impersonated, subject)
        assert svc.calls[0] == "/v1/token" and (len(svc.calls) == 2) == impersonate, svc.calls
    finally:
        server.stop()
        rules.stop()
        svc.stop()


def test_gcs_impersonated_service_account_from_gclouds_file(gcs, sample, tmp_path):
    """gcloud's ADC file as `gcloud auth application-default login
    --impersonate-service-account` writes it (`impersonated_service_account` over the user's
    refresh token), in its well-known place under HOME: the user's token refreshed, then
    exchanged for the service account's, which every request bears."""
    need_mount()
    _, source, _ = sample
    svc = TokenService("unused").start()
    rules = servers.CloudRules(0).start()
    server = servers.FakeGcs(tmp_path / "gcs", gcs.data, public_host=f"127.0.0.1:{rules.port}").start()
    rules.target = server.port
    try:
        home = tmp_path / "home"
        adc = home / ".config" / "gcloud" / "application_default_credentials.json"
        adc.parent.mkdir(parents=True)
        adc.write_text(json.dumps({
            "type": "impersonated_service_account", "delegates": [],
            "service_account_impersonation_url": f"http://127.0.0.1:{svc.port}/v1/projects/-/serviceAccounts/"
                                                 "reader@proj.iam.gserviceaccount.com:generateAccessToken",
            "source_credentials": {"type": "authorized_user", "client_id": "cid.apps.googleusercontent.com",
                                   "client_secret": "d-secret", "refresh_token": svc.REFRESH,
                                   "token_uri": f"http://127.0.0.1:{svc.port}/oauth2/token"}}))
        with Run("gs://bkt/data.pack", tmp_path, "--endpoint-url", rules.endpoint, "--allow-http",
                 env=offline_env(home)) as m:
            same_files(m.mnt, source)
            assert rules.seen and all(h.get("authorization") == f"Bearer {svc.impersonated}"
                                      for _, _, h in rules.seen)
            m.assert_secret_free(svc.user, svc.impersonated, svc.REFRESH)
        assert svc.calls[0] == "/oauth2/token" and svc.calls[1].endswith(":generateAccessToken"), svc.calls
    finally:
        server.stop()
        rules.stop()
        svc.stop()


def test_gcs_requester_pays_bills_the_project_given(gcs, sample, tmp_path):
    need_mount()
    _, source, _ = sample
    rules = servers.CloudRules(gcs.port, user_project="lab-billing").start()
    try:
        env = offline_env(tmp_path / "home", STORAGE_EMULATOR_HOST=f"127.0.0.1:{rules.port}")
        m = Run("gs://bkt/data.pack", tmp_path, env=env, check=False)
        assert m.r.returncode != 0 and "--billing-project" in m.r.stderr, m.r.stderr
        with Run("gs://bkt/data.pack", tmp_path, "--billing-project", "lab-billing", env=env) as m:
            same_files(m.mnt, source)
    finally:
        rules.stop()


# --- Azure -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def azurite(sample):
    work, source, pack = sample
    binary = os.environ.get("LOOSEFS_AZURITE")
    if not binary or not os.access(binary, os.X_OK):
        missing_prerequisite("Azurite is not installed (scripts/azurite.sh; LOOSEFS_AZURITE unset)")
    server = servers.Azurite(work / "azurite", binary).start()
    with open(pack, "rb") as f:
        server.container("data").upload_blob("data.pack", f, overwrite=True)
    server.put_tree("data", "loose/", source)
    yield server
    server.stop()


def container_sas(server) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    return generate_container_sas(servers.Azurite.ACCOUNT, "data", account_key=server.KEY,
                                  permission=ContainerSasPermissions(read=True, list=True),
                                  expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2))


def test_azure_sas_in_the_url_and_in_the_variable_and_an_account_key(azurite, sample, tmp_path):
    need_mount()
    _, source, _ = sample
    account = servers.Azurite.ACCOUNT
    endpoint = ["--endpoint-url", f"http://127.0.0.1:{azurite.port}/{account}", "--allow-http"]
    sas = container_sas(azurite)
    sig = dict(p.split("=", 1) for p in sas.split("&"))["sig"]
    home = tmp_path / "home"
    # The portal's "Generate SAS" URL, pasted whole.
    with Run(f"https://{account}.blob.core.windows.net/data/data.pack?{sas}", tmp_path, *endpoint,
             env=offline_env(home)) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(sig)
    with Run("az://data/loose/", tmp_path, *endpoint,
             env=offline_env(home, AZURE_STORAGE_ACCOUNT_NAME=account, AZURE_STORAGE_SAS_TOKEN=sas)) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(sig)
    with Run("az://data/data.pack", tmp_path, *endpoint,
             env=offline_env(home, AZURE_STORAGE_ACCOUNT_NAME=account, AZURE_STORAGE_ACCOUNT_KEY=azurite.KEY)) as m:
        same_files(m.mnt, source)
        m.assert_secret_free(azurite.KEY)


def test_azure_cli_login_is_used_with_no_flag(azurite, sample, tmp_path):
    """`az` on PATH (a stand-in printing a token as `az account get-access-token` does), no other
    credential, managed identity at a closed port: the requests carry the CLI's token."""
    need_mount()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    token = "eyJ0eXAiOiJKV1QifQ.az-cli-" + os.urandom(6).hex()
    expires = (datetime.datetime.now() + datetime.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.000000")
    (bindir / "az").write_text("#!/bin/sh\n" f"echo '{bindir}' \"$@\" >> {tmp_path}/az.calls\n"
                               f"echo '{json.dumps({'accessToken': token, 'expiresOn': expires, 'tokenType': 'Bearer'})}'\n")
    (bindir / "az").chmod(0o755)
    rules = servers.CloudRules(azurite.port).start()
    try:
        env = offline_env(tmp_path / "home", AZURE_STORAGE_ACCOUNT_NAME=servers.Azurite.ACCOUNT)
        env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
        m = Run("az://data/data.pack", tmp_path, "--endpoint-url",
                f"http://127.0.0.1:{rules.port}/{servers.Azurite.ACCOUNT}", "--allow-http", env=env, check=False)
        calls = (tmp_path / "az.calls").read_text()
        assert "account get-access-token" in calls, calls
        assert rules.seen and all(h.get("authorization") == f"Bearer {token}" for _, _, h in rules.seen), rules.seen[:1]
        # (Azurite takes a bearer token over https only; the token reaching it is what is checked.)
        m.assert_secret_free(token)
        m.__exit__()
    finally:
        rules.stop()


# --- No credentials anywhere -------------------------------------------------------------------

def test_without_credentials_each_store_says_every_source_tried_within_ten_seconds(moto, gcs, azurite, tmp_path):
    """Default options (no `--retries 0`): a metadata server that does not answer is skipped as
    the SDKs skip it, not retried for `--retry-timeout`."""
    home = tmp_path / "home"
    account = servers.Azurite.ACCOUNT
    cases = {
        "s3": ("s3://data/data.pack", ["--endpoint-url", moto.endpoint, "--allow-http"], {},
               ["no AWS credentials", "the environment", "web identity", "instance metadata"]),
        "gcs": ("gs://bkt/data.pack", ["--endpoint-url", f"http://{gcs.host}", "--allow-http"], {},
                ["no GCS credentials", "GOOGLE_APPLICATION_CREDENTIALS", "gcloud's ADC file",
                 f"metadata server at {CLOSED}"]),
        "azure": ("az://data/data.pack", ["--endpoint-url", f"http://127.0.0.1:{azurite.port}/{account}",
                                          "--allow-http"], {"AZURE_STORAGE_ACCOUNT_NAME": account},
                  ["no Azure credentials", "the environment", "workload identity", "managed identity",
                   "Azure CLI"]),
    }
    # A metadata endpoint that takes the connection and never answers (a firewall that drops
    # the reply, a hung agent): the same message, as soon.
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    mute = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        for endpoints in ({}, {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{mute}", "GCE_METADATA_HOST": mute,
                               "GCE_METADATA_IP": mute, "AZURE_MSI_ENDPOINT": f"http://{mute}/token"}):
            for name, (url, args, extra, says) in cases.items():
                if endpoints and name == "gcs":
                    says = says[:-1] + [f"metadata server at {mute}"]
                m = Run(url, tmp_path, *args, env=offline_env(home, **extra, **endpoints), check=False)
                assert m.r.returncode != 0, (name, m.r.stdout)
                assert m.secs < 10, (name, m.secs, m.r.stderr)
                for s in says:
                    assert s in m.r.stderr, (name, s, m.r.stderr)
                order = [m.r.stderr.index(s) for s in says[1:]]
                assert order == sorted(order), (name, m.r.stderr)
    finally:
        silent.close()
