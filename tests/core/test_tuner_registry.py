"""The tuner registry (``memfit.core.peft.tuners._WHERE``) against the tuner modules themselves: every
``Tuner`` a module declares is listed, under its own method name and ``peft_type``, and a plan imports
only the module of the tuner it uses (the registry imports a module on lookup)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import memfit.core.peft.tuners as tuners
from memfit.core.peft.tuners.base import Tuner

ROOT = Path(__file__).resolve().parents[2]
_NOT_TUNER_MODULES = {"base", "defaults", "read"}


def _declared() -> dict[tuple[str, str], Tuner]:
    """(module, attribute) -> Tuner, for every Tuner instance a tuner module defines at top level."""
    out = {}
    for info in pkgutil.iter_modules(tuners.__path__):
        module = importlib.import_module(f"{tuners.__name__}.{info.name}")
        for attr, value in vars(module).items():
            if isinstance(value, Tuner):
                out[(info.name, attr)] = value
    return out


def test_every_declared_tuner_is_listed_under_its_own_names():
    declared = {k: t for k, t in _declared().items()
                if not k[1].startswith("_")}
    # a module may import another's Tuner (e.g. vera's PVERA beside TUNER): keep each object once, at home
    home = {}
    for (module, attr), t in declared.items():
        home.setdefault(id(t), (module, attr, t))
    listed = {(module, attr) for _, _, _, module, attr in tuners._WHERE}
    assert {(m, a) for m, a, _ in home.values()} == listed
    for method, peft_type, prefix, module, attr in tuners._WHERE:
        t = getattr(importlib.import_module(f"{tuners.__name__}.{module}"), attr)
        assert (t.method, t.peft_type, t.prefix) == (method, peft_type, prefix)
        assert tuners.TUNERS[method] is t and tuners.BY_PEFT_TYPE[peft_type] is t
    assert set(tuners.PREFIXES) == {t.prefix for t in tuners.TUNERS.values() if t.prefix}
    assert list(tuners.TUNERS) == [row[0] for row in tuners._WHERE]
    assert len(set(tuners.TUNERS)) == len(tuners._WHERE) == len(set(tuners.BY_PEFT_TYPE))
    assert "lora" not in tuners.TUNERS and "prefix" not in tuners.TUNERS


def test_a_plan_imports_only_its_own_tuner():
    """The seed (prefix tuning) imports no tuner module; an IA3 plan imports ia3's and no other."""
    code = (
        "import sys\n"
        "from memfit.core.scenario.build import build_scenario\n"
        "from memfit.core.scenario.read import read_scenario_file\n"
        "from memfit.core.scenario.inputs import ScenarioInputs\n"
        "inputs = read_scenario_file(sys.argv[1])\n"
        "if sys.argv[2] != '-':\n"
        "    inputs = ScenarioInputs(model=inputs.model, peft_method=sys.argv[2])\n"
        "build_scenario(inputs)\n"
        "print(' '.join(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('memfit.core.peft.tuners.'))))\n"
    )
    seed = str(ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml")
    for peft, expected in (("-", set()), ("ia3", {"ia3"})):
        out = subprocess.run([sys.executable, "-c", code, seed, peft], capture_output=True, text=True, timeout=120,
                             env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        assert set(out.stdout.split()) - _NOT_TUNER_MODULES == expected, out.stdout
