"""The deployment examples in deploy/ stay true to the command line: the Kubernetes YAML parses,
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


def test_the_kubernetes_example_parses():
    try:
        import yaml
    except ImportError:
        missing_prerequisite("PyYAML is not installed")
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "loosefs.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["DaemonSet", "Pod"]
    sidecar = docs[1]["spec"]["containers"][0]
    assert sidecar["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert sidecar["args"][:2] == ["fuse-fd", "--receive"]
    args = sidecar["args"]
    mount = args[args.index("--") + 1:]
    assert mount[:2] == ["loosefs", "mount"] and "/dev/fd/3" in mount


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
    for f in (DEPLOY / "kubernetes" / "loosefs.yaml", DEPLOY / "container" / "Containerfile"):
        for arr in re.findall(r"\[([^\[\]]*\"(?:fuse-fd|mount)\"[^\[\]]*)\]", f.read_text().replace("\\\n", " ")):
            words = [w.strip().strip('"') for w in arr.split(",")]
            sub = words[0] if words[0] in ("fuse-fd", "mount") else None
            if sub is None:
                continue
            cut = words.index("--") if "--" in words else len(words)
            for flag in [w for w in words[:cut] if w.startswith("--")]:
                assert flag in helps(sub), f"{f.name}: {flag} is not in `loosefs {sub} --help`"
            if "--" in words:
                rest = words[cut + 1:]
                assert rest[:2] == ["loosefs", "mount"], rest
                for flag in [w for w in rest if w.startswith("--")]:
                    assert flag in helps("mount"), f"{f.name}: {flag} is not in `loosefs mount --help`"
            seen += 1
    assert seen >= 6, seen
