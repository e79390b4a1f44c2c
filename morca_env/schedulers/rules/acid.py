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
pending value is tested against changes (every rule's gates expose `drift` and `below(threshold)`).
The forms search and map the high threshold tau, with `ratio` and `kappa` fixed
(defaults 0.5 and 1.0: a step is critical when its drift more than doubled from the last one).
Wraps any rule of `morca_env.schedulers.rules` (`rule=`: "dicache" by default): over a rule whose schedule
is known before the run (TeaCache's increments p(x_i), MagCache's |1 - rho|) ACID's schedule is
known too (`AcidMask`, the mask forms); over a run-time rule it is a run-time rule (`Acid`).
"""

from __future__ import annotations

from importlib import import_module

from . import forms, runtime


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


class _AcidOver:
    """What both ACID forms share: the settings, the name, the wrapped rule's preparation."""

    def __init__(self, inner: forms.Rule, ratio: float = 0.5, kappa: float = 1.0):
        for name, value, upper in (("ratio", ratio, 1.0), ("kappa", kappa, None)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                    and (upper is None or value <= upper)):
                valid = "in (0, 1]" if upper else "> 0"
                raise ValueError(f"{name}={value!r} must be a number {valid}")
        self.inner, self.ratio, self.kappa = inner, float(ratio), float(kappa)
        self.name = f"acid-{inner.name}"

    def prepare(self, context: forms.RunContext) -> None:
        self.inner.prepare(context)
        super().prepare(context)

    def _wrap(self, gates, threshold: float) -> list[AcidGate]:
        return [AcidGate(gate, self.ratio * threshold, self.kappa) for gate in gates]


class Acid(_AcidOver, runtime.RuntimeRule):
    """ACID over a run-time rule (DiCache, EasyCache, FirstBlockCache, SenCache); the threshold is the high one."""

    def __init__(self, inner: runtime.RuntimeRule, ratio: float = 0.5, kappa: float = 1.0):
        super().__init__(inner, ratio, kappa)
        self.keeps_head, self.keeps_output = inner.keeps_head, inner.keeps_output

    def signals(self, view) -> list:
        return self.inner.signals(view)

    def gates(self, threshold: float, signals=None) -> list[AcidGate]:
        return self._wrap(self.inner.gates(threshold, signals), threshold)


class AcidMask(_AcidOver, forms.Rule):
    """ACID over a rule whose signal is known before the run (TeaCache, MagCache): its schedule is a fixed mask too."""

    def gates(self, threshold: float) -> list[AcidGate]:
        return self._wrap(self.inner.gates(threshold), threshold)


def acid(inner: forms.Rule, ratio: float = 0.5, kappa: float = 1.0) -> Acid | AcidMask:
    """ACID over `inner`, in the kind (run-time or mask) of the rule it wraps."""
    return (Acid if isinstance(inner, runtime.RuntimeRule) else AcidMask)(inner, ratio, kappa)


def wrappable_rules() -> list[str]:
    """The rule names ACID takes: every rule module of `morca_env.schedulers.rules` but ACID itself (registry spelling)."""
    from . import rule_names

    return [name for name in rule_names() if name != "acid"]


def build(form: str, env=None, pipe=None, rule: str = "dicache", threshold: float | None = None, ratio: float = 0.5,
          kappa: float = 1.0, rule_options: dict | None = None, branches=None, calibration=None, threshold_map=None,
          **options):
    """ACID over `rule` (any of `wrappable_rules()`, built by its own module's `build` with `rule_options`, so
    it keeps its constants and defaults): native at the high `threshold` (default the rule's own), global or
    exact."""
    valid = wrappable_rules()
    if rule not in valid:
        raise ValueError(f"rule={rule!r}; valid: {', '.join(valid)}")
    module = import_module(f"{__package__}.{rule.replace('-', '_')}")
    inner = module.build(form, env, pipe=pipe, branches=branches, calibration=calibration, **(rule_options or {}))
    wrapped = acid(inner.rule, ratio, kappa)
    if threshold is None:
        threshold = getattr(inner, "threshold", None)
    if isinstance(wrapped, runtime.RuntimeRule):
        return runtime.make_form(wrapped, form, threshold, inner.source, threshold_map, **options)
    if options:
        raise TypeError(f"unexpected options {sorted(options)}: ACID over {rule!r} plays a fixed mask and takes none")
    return forms.make_form(wrapped, form, threshold, inner.source, threshold_map)
