"""The public face of ``bus``: exactly what ``__all__`` says, and a light import."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import bus


def test_all_is_exactly_the_public_names() -> None:
    # As httpx's tests/test_exported_members.py: every public name bound in the package is in
    # __all__ and nothing else is. Submodules (``bus.testing`` once imported, the private
    # ``_bus`` and friends) are attributes of the package but not part of its surface.
    public = {
        name
        for name, value in vars(bus).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert len(bus.__all__) == len(set(bus.__all__)), "duplicate names in bus.__all__"
    assert set(bus.__all__) == public


def test_every_exported_name_resolves() -> None:
    namespace: dict[str, object] = {}
    exec("from bus import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(bus.__all__)


def test_exported_names_come_from_private_modules() -> None:
    # Implementation lives in _underscored modules; the package only re-exports.
    for name in bus.__all__:
        module = getattr(getattr(bus, name), "__module__", None)
        if module is None or not module.startswith("bus"):
            continue  # constants and typing aliases carry no module of their own
        assert module.split(".")[1].startswith("_"), f"{name} is defined in {module}"


_LIGHT_IMPORT = """
import json, sys

HEAVY = {"zmq", "textual", "streamlit", "opentelemetry"}
attempted = []

class Refuse:
    # Record and refuse every attempt, so a guarded ``try: import zmq`` is caught too and the
    # result does not depend on which extras this environment happens to have installed.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            attempted.append(name)
            raise ImportError(f"{name} must not be imported by `import bus`")
        return None

sys.meta_path.insert(0, Refuse())
import bus
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"attempted": attempted, "loaded": loaded}))
"""


def test_import_bus_does_not_import_extras() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LIGHT_IMPORT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"attempted": [], "loaded": []}
