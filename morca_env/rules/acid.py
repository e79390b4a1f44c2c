"""ACID as a scheduler: a wrapper over a rule's drift signal with a low threshold at critical steps.

ACID (cited by MORCA; facts from its abstract only, no code here): monitor the rate of change
of any method's drift signal, and use a low threshold at "critical" steps (fast-changing
signal) and a high one elsewhere. Our reading, with our constants (the paper's are not
in our sources): with d_t the increment the wrapped rule measured at step t (DiCache's
delta_t, EasyCache's predicted change, FirstBlockCache's relative change) and d_s the
last one measured before it,

    rate_t = |d_t - d_s| / d_s;   critical iff rate_t > kappa;
    reuse iff the rule's own test passes at tau_t = ratio * tau if critical, else tau.

The wrapped rule keeps its accumulation, warm-up and forced steps; only the threshold its
pending value is tested against changes (gates expose `drift` and `below(threshold)`).
The forms search and map the high threshold tau, with `ratio` and `kappa` fixed
(defaults 0.5 and 1.0: a step is critical when its drift more than doubled from the last one).
Wraps the run-time rules (`rule=`: "dicache" by default, "easycache", "first-block-cache").
"""

from __future__ import annotations

from . import dicache, easycache, first_block_cache, forms, runtime, sencache

RULES = {"dicache": (dicache.DiCache, dicache.DEFAULT_THRESHOLD),
         "easycache": (easycache.EasyCache, easycache.DEFAULT_THRESHOLD),
         "first-block-cache": (first_block_cache.FirstBlockCache, first_block_cache.DEFAULT_THRESHOLD),
         "sencache": (sencache.SenCache, sencache.DEFAULT_THRESHOLD)}


class AcidGate:
    """A wrapped gate whose test uses the low threshold at steps where its drift changed fast."""

    def __init__(self, inner, low: float, kappa: float):
        self.inner, self.low, self.kappa = inner, low, kappa
        self.last_drift: float | None = None
        self.critical = False

    def wants_reuse(self, step: int) -> bool:
        wants = self.inner.wants_reuse(step)  # at the high threshold; accumulates as the rule does
        drift, self.critical = self.inner.drift, False
        if drift is None:  # nothing measured (warm-up, forced, no reference): the rule's own decision
            return wants
        if self.last_drift is not None and self.last_drift > 0:
            self.critical = abs(drift - self.last_drift) / self.last_drift > self.kappa
        self.last_drift = drift
        return self.inner.below(self.low) if self.critical else wants

    def commit(self, reused: bool) -> None:
        self.inner.commit(reused)


class Acid(runtime.RuntimeRule):
    """ACID over `inner` (a run-time rule whose gates expose `drift` and `below`); the threshold is the high one."""

    def __init__(self, inner: runtime.RuntimeRule, ratio: float = 0.5, kappa: float = 1.0):
        for name, value, upper in (("ratio", ratio, 1.0), ("kappa", kappa, None)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                    and (upper is None or value <= upper)):
                valid = "in (0, 1]" if upper else "> 0"
                raise ValueError(f"{name}={value!r} must be a number {valid}")
        self.inner, self.ratio, self.kappa = inner, float(ratio), float(kappa)
        self.name = f"acid-{inner.name}"
        self.keeps_head, self.keeps_output = inner.keeps_head, inner.keeps_output

    def prepare(self, context: forms.RunContext) -> None:
        self.inner.prepare(context)
        super().prepare(context)

    def signals(self, view) -> list:
        return self.inner.signals(view)

    def gates(self, threshold: float, signals=None) -> list[AcidGate]:
        return [AcidGate(gate, self.ratio * threshold, self.kappa) for gate in self.inner.gates(threshold, signals)]


def build(form: str, env=None, pipe=None, rule: str = "dicache", threshold: float | None = None, ratio: float = 0.5,
          kappa: float = 1.0, rule_options: dict | None = None, branches=None, calibration=None, threshold_map=None,
          **options):
    """ACID over `rule` (one of `RULES`, built with `rule_options`): native at the high `threshold` (default the
    rule's own default), global or exact."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; valid: {', '.join(RULES)}")
    cls, default = RULES[rule]
    source = forms.Source(env, pipe, branches, calibration)
    wrapped = Acid(cls(**(rule_options or {})), ratio, kappa)
    return runtime.make_form(wrapped, form, default if threshold is None else threshold, source, threshold_map,
                             **options)
