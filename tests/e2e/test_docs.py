"""The user documentation and the command line agree: every option of every command's `--help`
is in docs/CONFIGURATION.md, and every `loosefs COMMAND --flag` written in README.md and the
user pages of docs/ names a real command and flags its `--help` lists. README.md stays a
two-minute read (≤ 200 lines) with the two set-up commands."""
import re
import subprocess

from conftest import ROOT, loosefs_bin, missing_prerequisite

USER_DOCS = ["README.md"] + [f"docs/{p}.md" for p in (
    "INSTALL", "CONFIGURATION", "PYTHON", "SEMANTICS", "TUNING", "REMOTE", "DIRECTORIES", "FORMATS",
    "VIEWS", "CLUSTERS", "TROUBLESHOOTING", "CACHES", "GLOSSARY")]


def run_help(*args) -> str:
    r = subprocess.run([loosefs_bin(), *args, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def commands() -> dict:
    top = run_help()
    subs = re.findall(r"^  ([a-z][a-z-]+)\s", top.split("Commands:")[1].split("Options:")[0], re.M)
    # The options' own lines (`  -j, --jobs <JOBS>`, `      --warm`), not the examples' words.
    return {s: set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", run_help(s), re.M)) for s in subs if s != "help"}


def test_every_option_of_every_command_is_in_configuration():
    conf = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    missing = sorted({f"{s} {f}" for s, flags in commands().items() for f in flags
                      if f not in ("--help", "--version") and not re.search(rf"{re.escape(f)}(?![\w-])", conf)})
    assert missing == [], f"in --help, not in docs/CONFIGURATION.md: {missing}"


def test_every_loosefs_command_in_the_user_docs_exists_with_its_flags():
    cmds = commands()
    # Every command --help lists (csi, csi-mounter, completions and man too), longest first.
    names = "|".join(re.escape(c) for c in sorted(cmds, key=len, reverse=True))
    assert {"csi", "csi-mounter", "completions", "man", "mount"} <= set(cmds), sorted(cmds)
    wrong = []
    for page in USER_DOCS:
        for n, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            for m in re.finditer(rf"(?<![\w/.$-])loosefs (?:{names})(?![\w-])[^`|#;]*", line):
                words = m.group(0).split()
                sub = words[1]
                rest = words[2:words.index("--")] if "--" in words[2:] else words[2:]
                for w in rest:
                    f = re.match(r"--[a-z][a-z-]*", w)
                    if f and f.group(0) not in cmds[sub]:
                        wrong.append(f"{page}:{n}: loosefs {sub} {f.group(0)}")
    assert wrong == [], wrong


def test_the_readme_is_short_and_keeps_the_two_set_up_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "scripts/demo.sh" in text and "scripts/test.sh" in text
    for page in USER_DOCS[1:]:
        assert (ROOT / page).exists(), page
        assert page.split("/")[1] in text, f"README does not link {page}"


def test_shell_completions_and_the_man_page_are_generated_from_the_definitions(tmp_path):
    """`loosefs completions SHELL` for bash, zsh and fish name every command (bash's parses);
    `loosefs man` renders with man(1) and names every command and every mount option."""
    cmds = commands()
    for shell in ("bash", "zsh", "fish"):
        r = subprocess.run([loosefs_bin(), "completions", shell], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        for c in cmds:
            assert re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", r.stdout), (shell, c)
        if shell == "bash":
            # Loaded into bash and asked as a user's Tab asks: it offers every command, and
            # mount's options after `loosefs mount --`.
            script = tmp_path / "loosefs.bash"
            script.write_text(r.stdout)
            ask = (f"source {script}; COMP_WORDS=(loosefs \"$1\" \"$2\"); COMP_CWORD=$3; "
                   "_loosefs loosefs \"${COMP_WORDS[$3]}\" \"${COMP_WORDS[$3-1]}\"; printf '%s\\n' \"${COMPREPLY[@]}\"")
            got = subprocess.run(["bash", "-c", ask, "ask", "", "", "1"], capture_output=True, text=True,
                                 timeout=60)
            assert set(cmds) <= set(got.stdout.split()), (got.stdout, got.stderr)
            got = subprocess.run(["bash", "-c", ask, "ask", "mount", "--al", "2"], capture_output=True, text=True,
                                 timeout=60)
            assert {"--allow-other", "--allow-http", "--allow-non-empty"} <= set(got.stdout.split()), got.stdout
    page = tmp_path / "loosefs.1"
    r = subprocess.run([loosefs_bin(), "man"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    page.write_text(r.stdout)
    text = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, timeout=60,
                          env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin"}).stdout
    if not text:
        missing_prerequisite("man(1) does not render the page (scripts/setup.sh installs man-db)")
    for c in cmds:
        assert f"LOOSEFS {c.upper()}" in text, c
    for f in cmds["mount"] - {"--help"}:
        assert f in text, f


def test_the_user_docs_carry_no_words_of_the_projects_own_notes():
    """What a user reads (README, docs/ but the BENCHMARKS and DESIGN notebooks, and every
    command's `--help`) names no issue numbers, disk "moods" or the bench's disk profiles by
    their names, targets, the project's own phrases, or paths of the development machine."""
    internal = re.compile(r"issue \d+|\bmood\b|\.\./shared|\(target [0-9.]+×\)|main job|embedded default"
                          r"|`(?:cloud|host|hdd|ssd)` profile|these VMs", re.I)
    texts = {p: (ROOT / p).read_text() for p in USER_DOCS}
    texts.update({f"loosefs {c} --help": run_help(c) for c in commands()})
    texts["loosefs --help"] = run_help()
    found = [(p, m.group(0)) for p, t in texts.items() for m in internal.finditer(t)]
    assert not found, found


def github_anchors(page) -> set:
    """The anchors GitHub makes of a page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces as `-`."""
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_every_link_in_the_readme_and_docs_resolves():
    """Relative links (and images) of README.md and every page under docs/ name a file of the
    checkout, and a `#fragment` one of that page's headings."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if re.match(r"[a-z]+:", link):
                continue
            path, _, frag = link.partition("#")
            target = (page.parent / path) if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
            elif frag and target.suffix == ".md" and frag not in github_anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == [], broken
