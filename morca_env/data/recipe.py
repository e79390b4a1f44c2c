"""What a dataset is made of (env, behaviour policy, episodes, seeds), and where datasets live."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import schedulers
from ..utils.paths import cache_root

SPEC_EXCLUDED_KWARGS = ("reference_cache_dir", "pipeline", "device")


@dataclass
class CollectionRecipe:
    """Everything that defines a dataset; stored in its metadata and checked on resume."""

    dataset_id: str
    env_id: str
    num_episodes: int
    env_kwargs: dict = field(default_factory=dict)
    behavior: dict = field(default_factory=lambda: {"name": "threshold-curve"})
    seed: int = 0
    feature_dtype: str = "float16"
    description: str = ""
    author: str = "MORCA gym"
    code_permalink: str = "morca-gym, morca collect (morca_env.data.collect)"
    algorithm_name: str = "threshold-curve SeaCache (MORCA App. B.3)"

    def __post_init__(self):
        check_dataset_id(self.dataset_id)
        if isinstance(self.behavior, str):
            self.behavior = {"name": self.behavior}
        valid = schedulers.names(aliases=True)  # any scheduler of the registry
        if not isinstance(self.behavior, dict) or self.behavior.get("name") not in valid:
            raise ValueError(f"behavior={self.behavior!r}; valid: a behaviour name ({', '.join(valid)}) or a "
                             "dict {'name': <name>, **options}")
        for spec in _nested_specs(self.behavior):  # a mixture's components too
            schedulers.refuse_caller_only_options(spec, f"recipe {self.dataset_id!r}: behaviour {spec!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")
        if isinstance(self.num_episodes, bool) or not isinstance(self.num_episodes, int) or self.num_episodes < 1:
            raise ValueError(f"num_episodes={self.num_episodes!r} must be a positive integer")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs={self.env_kwargs!r} must be a dict of MorcaEnv arguments")
        if self.feature_dtype not in ("float16", "float32"):
            raise ValueError(f"feature_dtype={self.feature_dtype!r}; valid: float16, float32")

    @classmethod
    def from_file(cls, path: str | Path) -> "CollectionRecipe":
        """A recipe file, or a packaged recipe named by its dataset id (`morca/tiny/anchored-v2`). A relative
        `path` inside its behaviour (a schedules file) is read beside the recipe, wherever it is run from."""
        path = find_recipe(path)
        fields_ = json.loads(path.read_text())
        for spec in _nested_specs(fields_.get("behavior")):
            if isinstance(spec.get("path"), str) and not Path(spec["path"]).is_absolute():
                spec["path"] = str((path.parent / spec["path"]).resolve())
        return cls(**fields_)

    def identity(self) -> dict:
        """The fields that must match for a resumed collection to continue the same data."""
        return {"env_id": self.env_id, "env_kwargs": self.env_kwargs, "behavior": self.behavior, "seed": self.seed,
                "feature_dtype": self.feature_dtype}


def packaged_recipes() -> dict[str, Path]:
    """Dataset id -> the recipe file shipped with the package (`morca_env/data/recipes/<model>/<name>.json`)."""
    from importlib import resources

    root = Path(str(resources.files(__package__) / "recipes"))
    return {f"morca/{p.parent.name}/{p.stem}": p for p in sorted(root.glob("*/*.json"))
            if not p.name.endswith(".schedules.json")}


def find_recipe(name_or_path: str | Path) -> Path:
    """A recipe file's path: an existing file, or the packaged recipe of a dataset id."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = packaged_recipes()
    if str(name_or_path) in packaged:
        return packaged[str(name_or_path)]
    raise FileNotFoundError(f"recipe {str(name_or_path)!r} is neither a file nor a packaged recipe; valid: a JSON "
                            f"recipe file or one of {', '.join(packaged)}")


def check_dataset_id(dataset_id) -> str:
    """Refuse an id Minari cannot build before any episode is collected for it."""
    from minari.utils import parse_dataset_id

    try:
        _, name, version = parse_dataset_id(dataset_id)
    except Exception:  # minari raises ValueError or TypeError on malformed ids
        name = version = None
    if not isinstance(dataset_id, str) or name is None or version is None:
        raise ValueError(f"dataset_id={dataset_id!r} is not a Minari dataset id; valid: "
                         "'<namespace>/<name>-v<version>', e.g. 'morca/tiny/random-v0'")
    return dataset_id


def staging_root() -> Path:
    """Where collections stage their episodes: one folder per Minari datasets root, so two roots (two
    MINARI_DATASETS_PATH values) never share staged episodes of the same dataset id."""
    import hashlib

    root = str(minari_root())
    return cache_root() / "collect" / hashlib.sha256(root.encode()).hexdigest()[:12]


def minari_root() -> Path:
    """Minari's datasets directory, absolute: a relative MINARI_DATASETS_PATH is joined twice by minari when it
    sizes a new dataset's files, which failed the build after every episode was collected."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path()).resolve()


def _nested_specs(value):
    """Every JSON object inside a behaviour spec, itself included."""
    if isinstance(value, dict):
        yield value
        for inner in value.values():
            yield from _nested_specs(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _nested_specs(inner)


def make_behavior(spec: dict, env, seed: int):
    """The behaviour policy of a recipe entry {"name": <scheduler name>, **options} (`schedulers.from_spec`)."""
    return schedulers.from_spec(spec, env, seed=seed)
