"""One registry of schedulers: names, their metadata, and `make`. The names collection recipes, evaluation, the
benchmark, `accelerate` users and the quickstart share.

A module registers what it defines where it defines it (`@register("uniform")`),
so adding a scheduler touches its module and its test. Learned schedulers come
from other packages through the `morca_gym.schedulers` entry-point group, one
entry per scheduler name naming the package that registers it (`morca = "agents"`):
`morca_env` never imports them; a plugin loads when one of its names is asked for,
and a plugin that cannot load (its extra is missing) raises its own error then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

PLUGIN_GROUP = "morca_gym.schedulers"


@dataclass(frozen=True)
class Entry:
    """A registered scheduler: how to build it and what its constructor needs.

    seeded: takes `seed=` (randomised; evaluation and collection seed it per episode).
    needs_env: takes `env=` (reads the env's packaged files, or replays on its pipeline).
    learned: built from a checkpoint (`path=`); `checkpoint_suffixes` pick it for a `label=<file>` method spec.
    form: a cache rule's form ("native", "global" or "exact"), None for other schedulers.
    """

    name: str
    factory: Callable
    seeded: bool = False
    needs_env: bool = False
    learned: bool = False
    form: str | None = None
    aliases: tuple[str, ...] = ()
    checkpoint_suffixes: tuple[str, ...] = ()


_ENTRIES: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}
_plugins_loaded = False
_plugin_errors: dict[str, ImportError] = {}  # by scheduler name


def register(name: str, *, seeded: bool = False, needs_env: bool = False, learned: bool = False,
             form: str | None = None, aliases=(), checkpoint_suffixes=()):
    """Decorator registering `factory` (a class or function) under `name`; returns the factory unchanged."""
    def add(factory):
        entry = Entry(name, factory, seeded, needs_env, learned, form, tuple(aliases), tuple(checkpoint_suffixes))
        known = _ENTRIES.get(name)
        if known is not None and known != entry:
            raise ValueError(f"scheduler {name!r} is already registered (by {known.factory.__module__})")
        _ENTRIES[name] = entry
        for alias in entry.aliases:
            _ALIASES[alias] = name
        return factory

    return add


def _plugins() -> dict:
    """The entry points of the group by scheduler name (`morca = "agents"`: the package that registers "morca")."""
    return {point.name: point for point in entry_points(group=PLUGIN_GROUP)}


def _load_plugin(name: str, point) -> None:
    if name in _plugin_errors:
        raise _plugin_errors[name]
    try:
        loaded = point.load()  # importing the package registers its schedulers
        if callable(loaded):
            loaded()
    except ImportError as error:  # e.g. the [agents] extra is not installed: the error names it
        _plugin_errors[name] = type(error)(f"scheduler {name!r} comes from {point.value!r}, which did not load: "
                                           f"{error}")
        raise _plugin_errors[name] from error


def _load_plugins() -> None:
    """Load every plugin that loads, once (for `names`); one that cannot is reported when its name is asked for."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name, point in _plugins().items():
        if name not in _ENTRIES:
            try:
                _load_plugin(name, point)
            except ImportError:
                pass


def entry(name: str) -> Entry:
    """The registry entry of `name` (or of the name it aliases); a plugin's name loads its package."""
    key = _ALIASES.get(name, name)
    if key not in _ENTRIES:
        point = _plugins().get(key)
        if point is not None:
            _load_plugin(key, point)
    if key not in _ENTRIES:
        raise ValueError(f"unknown scheduler {name!r}; valid: {', '.join(names(aliases=True))}")
    return _ENTRIES[key]


def names(aliases: bool = False, learned: bool | None = None) -> list[str]:
    """Registered names (sorted), with their aliases if asked; `learned=False` / `True` keeps only one kind."""
    _load_plugins()
    keep = sorted(n for n, e in _ENTRIES.items() if learned is None or e.learned == learned)
    return keep + (sorted(a for a, n in _ALIASES.items() if n in keep) if aliases else [])


def is_seeded(name: str) -> bool:
    return entry(name).seeded


def make(name: str, env=None, seed: int | None = None, **options):
    """A scheduler by name. `env` goes to schedulers that read the env's files or replay on its pipeline; `seed`
    to randomised ones (ignored by the others, so a caller can seed whatever it makes)."""
    found = entry(name)
    if found.needs_env:
        options["env"] = env
    if found.seeded and seed is not None:
        options.setdefault("seed", seed)
    try:
        return found.factory(**options)
    except TypeError as error:
        raise TypeError(f"scheduler {name!r}: {error}") from None


# options only the person running the code may set: a data file that others share (a recipe, a mixture) must not
# be able to make a loader unpickle a file, which runs whatever code the pickle carries
CALLER_ONLY_OPTIONS = ("trusted",)


def refuse_caller_only_options(spec: dict, where: str) -> None:
    """Raise if a spec read from a data file carries an option that only the caller may give."""
    asked = [k for k in CALLER_ONLY_OPTIONS if k in spec]
    if asked:
        raise ValueError(f"{where} sets {asked[0]!r}: trust comes from the person running the command, never from a "
                         f"data file; convert the checkpoint yourself (morca convert-checkpoint <file>) and point "
                         "the spec at the converted .safetensors file")


def from_spec(spec: dict, env=None, seed: int | None = None):
    """A scheduler from a recipe entry {"name": <registered name>, <option>: ...} (collection recipes, mixtures)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"scheduler spec {spec!r} must be a JSON object with a \"name\"")
    refuse_caller_only_options(spec, f"scheduler spec {spec!r}")
    return make(spec["name"], env, seed=seed, **{k: v for k, v in spec.items() if k != "name"})


def checkpoint_paths(path) -> list[str]:
    """A checkpoint, a list of them, or a comma-separated string of them (an ensemble, e.g. one per training seed)."""
    parts = [str(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    paths = [p.strip() for part in parts for p in part.split(",")]  # "a.d3, b.d3" names b.d3, not " b.d3"
    if not paths or any(not p for p in paths):
        raise ValueError(f"checkpoint path(s) {path!r}: give one path, or several separated by commas")
    return paths


def parse_method(label: str, spec: str | None = None) -> dict:
    """A command line's method `label[=spec]` as a registry spec {"name": ..., options}.

    `uniform` names a scheduler; `best-fixed=<file>` gives it `path=`; `<label>={"name": <registered name>, ...}`
    makes a scheduler with options under its own label (e.g. `acid-tea={"name": "acid-exact", "rule": "teacache"}`);
    `<label>=<checkpoint>` loads the learned scheduler whose checkpoint suffix matches, and of several (a
    `.safetensors` file), the one the checkpoint's header names (MORCA, REINFORCE)."""
    if spec is not None and spec.lstrip().startswith("{"):
        try:
            options = json.loads(spec)
            if not isinstance(options.get("name"), str):
                raise ValueError
        except (ValueError, AttributeError):
            raise ValueError(f"method {label!r}: {spec!r} is not a JSON object with a scheduler \"name\"") from None
        return options
    try:
        entry(label)
        return {"name": label, **({"path": spec} if spec is not None else {})}
    except ValueError:
        pass
    if spec is None:
        raise ValueError(f"unknown method {label!r}: a scheduler name ({', '.join(names(aliases=True))}), "
                         "<label>=<checkpoint> or <label>={\"name\": ..., options}")
    suffix = Path(checkpoint_paths(spec)[0]).suffix
    learned = [_ENTRIES[n] for n in names(learned=True)]
    matches = [e for e in learned if suffix in e.checkpoint_suffixes]
    if len(matches) > 1:
        named = header_scheduler(checkpoint_paths(spec)[0])
        matches = [e for e in matches if e.name == named] or matches
    if not matches:
        known = ", ".join(f"{s} ({e.name})" for e in learned for s in e.checkpoint_suffixes) or "none registered"
        raise ValueError(f"method {label}={spec}: no learned scheduler reads {suffix or 'a file without suffix'!r} "
                         f"checkpoints; known: {known}")
    return {"name": matches[0].name, "path": spec}


def header_scheduler(path) -> str | None:
    """The scheduler a safetensors checkpoint's header names (agents.checkpoint writes it), if it can be read."""
    from safetensors import safe_open

    if not Path(path).is_file():  # a FIFO or device would block the read: the load names the problem
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("scheduler")
    except Exception:  # a missing or foreign file: the scheduler's own load names the problem
        return None
