"""Evaluating cache schedulers against the no-cache reference (the paper's Table 2).

- `runner`: one run (`EvaluationConfig` -> `evaluate`): stock timing beside every episode, speedup feedback,
  resume with a fingerprint check, Ray.
- `episodes`: loading a method, one timed episode, one result row (shared with the Ray actors).
- `tables` / `plots` / `comparison`: what the rows become: tables, figures, same-K and equal-speedup comparisons.
"""

from .episodes import GroupEvaluator, Methods, evaluate_episode, load_method, make_envs, run_episode
from .runner import EvaluationConfig, EvaluationResult, evaluate

__all__ = ["EvaluationConfig", "EvaluationResult", "GroupEvaluator", "Methods", "evaluate", "evaluate_episode",
           "load_method", "make_envs", "run_episode"]
