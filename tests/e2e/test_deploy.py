"""The deployment examples in deploy/ stay true to the command line: the Kubernetes manifests parse,
and every loosefs command line in deploy/ (the YAML's, the Containerfile's, the Slurm
scripts') names a real subcommand and only flags its `--help` lists."""
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


def test_the_csi_driver_manifest_parses_and_splits_privilege_as_documented():
    docs = yaml_docs("csi-driver.yaml")
    assert [d["kind"] for d in docs] == ["Namespace", "CSIDriver", "DaemonSet"]
    driver = docs[1]
    assert driver["metadata"]["name"] == default_of("csi", "--driver-name")
    assert driver["spec"]["attachRequired"] is False and driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["volumeLifecycleModes"] == ["Persistent"]
    pod = docs[2]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in pod["containers"]}
    assert set(c) == {"loosefs-csi", "loosefs-mounter", "node-driver-registrar"}
    plugin, mounter = c["loosefs-csi"], c["loosefs-mounter"]
    assert plugin["securityContext"]["privileged"] is True and plugin["args"][0] == "csi"
    kubelet = next(m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet")
    assert kubelet["mountPropagation"] == "Bidirectional"
    sec = mounter["securityContext"]
    assert sec["runAsUser"] != 0 and sec["capabilities"]["drop"] == ["ALL"]
    assert sec["allowPrivilegeEscalation"] is False and "privileged" not in sec
    assert mounter["args"][0] == "csi-mounter"
    assert not any(m["mountPath"] == "/dev/fuse" for m in mounter["volumeMounts"])
    # Both containers see the mounter's socket and the volumes' directory at the same paths.
    args = dict(zip(plugin["args"][1::2], plugin["args"][2::2]))
    margs = dict(zip(mounter["args"][1::2], mounter["args"][2::2]))
    assert args["--mounter"] == margs["--socket"]
    paths = lambda x: {m["mountPath"] for m in x["volumeMounts"]}
    assert {"/loosefs/run", "/loosefs/volumes"} <= paths(plugin) & paths(mounter)
    assert args["--work-dir"].startswith("/loosefs/volumes")
    reg = c["node-driver-registrar"]["args"]
    assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{driver['metadata']['name']}/csi.sock" in reg


def test_the_example_volume_names_the_driver_and_real_mount_options():
    docs = yaml_docs("example.yaml")
    assert [d["kind"] for d in docs] == ["PersistentVolume", "PersistentVolumeClaim", "Pod"]
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
    for f in (DEPLOY / "kubernetes" / "csi-driver.yaml", DEPLOY / "container" / "Containerfile"):
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
