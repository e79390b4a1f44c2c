"""Caching rules of the literature, one module each, in three forms (see `forms`).

`forms` holds what every rule shares: the per-branch gate protocol, the
simulation of a rule over a run, and the native / global-threshold /
exact-budget policies; `runtime` the same for rules that read the run as it
goes. A rule module (`teacache`, `magcache`) only says how its signal is
computed and how its gate decides, and gives `build(form, env, **options)`; the
registry names it `<rule>`, `<rule>-global`, `<rule>-exact` (module
`first_block_cache`: `first-block-cache`), found here by listing the modules, so
adding a rule touches its module and its test only.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module

from ..registry import register

SHARED = ("forms", "runtime")  # the code every rule shares, not rules themselves
# SeaCache reads D_t from the observation, so its native and global forms need no env: it registers its own forms
SELF_REGISTERED = ("seacache",)
FORMS = (("native", ""), ("global", "-global"), ("exact", "-exact"))


def rule_modules() -> list[str]:
    """The rule modules of this package (listed, not imported)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in SHARED + SELF_REGISTERED)


def rule_names() -> list[str]:
    """The rules' native-form registry names."""
    return [module.replace("_", "-") for module in rule_modules()]


def _builder(module: str, form: str):
    def build(env=None, **options):
        return import_module(f"{__name__}.{module}").build(form, env, **options)

    build.__module__ = f"{__name__}.{module}"
    build.__qualname__ = f"build[{form}]"
    return build


for _module in rule_modules():
    for _form, _suffix in FORMS:
        register(_module.replace("_", "-") + _suffix, needs_env=True, form=_form)(_builder(_module, _form))
