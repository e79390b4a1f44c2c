"""Caching rules of the literature, one module each, in three forms (see `forms`).

`forms` holds what every rule shares: the per-branch gate protocol, the
simulation of a rule over a run, and the native / global-threshold /
exact-budget policies. A rule module (`teacache`, `magcache`) only says how its
signal is computed and how its gate decides; `morca_env.policies.make` reaches
it by name.
"""
