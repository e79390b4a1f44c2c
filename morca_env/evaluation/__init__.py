"""Evaluating cache schedulers against the no-cache reference (the paper's Table 2).

- `benchmark`: the scoring protocol (`benchmark.evaluate(policy)`: a policy's normalized score on an env's suite);
- `search`: the per-prompt schedule search (`morca search`);
- `runner`: one run (`EvaluationConfig` -> `run_evaluation`): stock timing beside every episode, speedup feedback,
  resume with a fingerprint check, Ray.
- `episodes`: loading a method, one timed episode, one result row (shared with the Ray actors).
- `tables` / `plots` / `comparison`: what the rows become: tables, figures, same-K and equal-speedup comparisons.
"""

from .episodes import GroupEvaluator, Methods, evaluate_episode, load_method, make_envs, run_episode
from .runner import EvaluationConfig, EvaluationResult, run_evaluation

__all__ = ["EvaluationConfig", "EvaluationResult", "GroupEvaluator", "Methods", "evaluate_episode", "load_method",
           "make_envs", "run_episode", "run_evaluation"]


def __getattr__(name: str):
    """`evaluate` was the runner's name; `benchmark.evaluate` scores a policy, so the runner is `run_evaluation`."""
    if name == "evaluate":
        import warnings

        warnings.warn("morca_env.evaluation.evaluate is now run_evaluation (benchmark.evaluate scores a policy); the "
                      "old name goes in the next release", DeprecationWarning, stacklevel=2)
        return run_evaluation
    raise AttributeError(f"module 'morca_env.evaluation' has no attribute {name!r}")
