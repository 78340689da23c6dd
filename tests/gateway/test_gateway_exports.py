"""The public face of ``pantheon.gateway``: exactly what ``__all__`` says; and ``import bus``
/ ``import pantheon`` stay free of the web stack."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pantheon.gateway as gateway


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(gateway).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert len(gateway.__all__) == len(set(gateway.__all__))
    assert set(gateway.__all__) == public
    for name in gateway.__all__:
        module = getattr(getattr(gateway, name), "__module__", "pantheon.gateway._")
        assert module.split(".")[2].startswith("_"), f"{name} is defined in {module}"


def test_the_web_stack_is_imported_only_with_the_gateway() -> None:
    code = (
        "import sys, json, pantheon, pantheon.cli, bus; "
        "print(json.dumps([m for m in ('starlette', 'uvicorn', 'prometheus_client', "
        "'websockets') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
