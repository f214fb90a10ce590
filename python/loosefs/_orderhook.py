"""The start-up half of `loosefs.autoorder`, run by the `loosefs_announce_order.pth` file the
package installs: when `LOOSEFS_ANNOUNCE_ORDER` is on, `loosefs.autoorder` is imported (and with
it the DataLoader hooked) right after torch's DataLoader module is, so an interpreter that never
imports torch pays nothing and one that does needs no change to its script."""
import os
import sys
from typing import Any, Dict, Optional

ON = ("1", "true", "yes", "on", "y", "t")
OFF = ("", "0", "false", "no", "off", "n", "f")


def enabled(environ: "Optional[Dict[str, str]]" = None) -> bool:
    """Whether `LOOSEFS_ANNOUNCE_ORDER` turns the order announcement on: `1`, `true`, `yes`,
    `on`, `y`, `t` (any case) on; unset, empty, `0`, `false`, `no`, `off`, `n`, `f` off (the
    words the CLI's flag variables take). Any other value is off and
    said on stderr (a misspelling must not turn a hook on or off silently)."""
    env = os.environ if environ is None else environ
    v = env.get("LOOSEFS_ANNOUNCE_ORDER", "").strip().lower()
    if v in ON:
        return True
    if v not in OFF:
        sys.stderr.write(f"loosefs: LOOSEFS_ANNOUNCE_ORDER={v!r} is not one of {', '.join(ON + OFF[1:])}: "
                         "the order is not announced\n")
    return False


class _OnImport:
    """A `sys.meta_path` finder that installs the hook once torch's dataloader module has run,
    so that an interpreter that never imports torch pays nothing."""

    NAME = "torch.utils.data.dataloader"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.NAME:
            return None
        # Once only, and found by the finders that would have found it without this one.
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            try:
                import loosefs.autoorder  # noqa: F401  (hooks the DataLoader)
            except Exception as e:  # a torch this hook does not know: train without it
                sys.stderr.write(f"loosefs: LOOSEFS_ANNOUNCE_ORDER: cannot hook this torch ({e})\n")

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def install_on_import() -> None:
    """What the `.pth` file calls at start-up: when `enabled()`, installs the hook now if torch's
    DataLoader is already imported, else when it is."""
    if not enabled():
        return
    if _OnImport.NAME in sys.modules:
        import loosefs.autoorder  # noqa: F401
    elif not any(isinstance(f, _OnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport())


