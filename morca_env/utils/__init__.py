"""Infrastructure the env and the `agents` package share, not the env's API: atomic writes and JSON lines (`io`),
cache folders (`paths`), torch threads (`threads`), optional extras (`extras`) and quieting legacy imports (`quiet`)."""
