"""SeaCache's residual cache as diffusers hooks on `transformer.blocks`, driven by an external decision.

Follows the shape of diffusers' ``hooks/mag_cache.py``: a leader hook on
``blocks[0]`` and pass-through hooks on the other blocks, with per-branch state
kept by a ``StateManager`` keyed by the ``cache_context`` name ("cond"/"uncond").
Unlike MagCache or diffusers' SeaCache, the hooks never decide by themselves:
the caller sets ``ResidualCache.reuse`` before each denoising step.

* recompute: the blocks run; the tail hook stores residual = out - h (float32)
  for the current branch;
* reuse: the leader returns h + residual[branch] and the remaining blocks return
  their input untouched, so no block computes.

The condition embedder, output norm and unpatchify always run. The patch embedding
runs once per model input: a memo hook returns its output again when it is called on
the same input tensor (unchanged, same weights), so the official signal (which needs it
before the step is decided) and both CFG branches' calls share one convolution.
One ``ResidualCache`` per transformer, so Wan2.2's two experts keep separate state.

For rules that decide from the first block (FirstBlockCache, DiCache) the leader
also *observes*, never deciding: with ``keep_head``, per branch it keeps block 0's
non-hidden call arguments (text context, rotary embedding: the same at every step of
a video) and block 0's input and output at the branch's latest computed call;
with ``keep_output`` (EasyCache), the transformer's output at that call.
``bypassed()`` lets a probe run blocks outside the cache (`signals.head_block_residual`).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

_LEADER_HOOK = "morca_residual_cache_leader"
_BLOCK_HOOK = "morca_residual_cache_block"
_PATCH_HOOK = "morca_patch_embedding_memo"


@dataclass
class ResidualCacheConfig:
    """Settings of the residual cache.

    Args:
        residual_dtype: dtype the residual is stored in (float32 keeps reuse exact for bf16 models).
    """

    residual_dtype: torch.dtype = torch.float32


class _BranchState(BaseState):
    def __init__(self):
        self.reset()

    def reset(self):
        self.residual: torch.Tensor | None = None
        self.block_input: torch.Tensor | None = None
        self.skipping = False
        self.head_arguments: dict | None = None  # block 0's call arguments but hidden_states (latest call)
        self.head: tuple | None = None  # block 0's (input, output), latest computed call (keep_head; references)
        self.model_output: torch.Tensor | None = None  # the transformer's output, latest computed call (keep_output)
        self.computing: torch.Tensor | None = None  # rows that recompute in a call whose samples decide apart


@dataclass
class _Controller:
    """State shared by all hooks of one transformer: the decision and which branches hold a residual."""

    reuse: bool = False
    reuse_rows: torch.Tensor | None = None  # per-sample decisions (bool, one per sample) when they differ
    cached_branches: set[str] = field(default_factory=set)
    computed_calls: int = 0
    reused_calls: int = 0
    bypass: bool = False  # a probe is running blocks: every hook passes through
    keep_head: bool = False  # keep block 0's output residual per branch (rules that read it)
    keep_output: bool = False  # keep the transformer's output per branch (rules that read it)


def _hidden_states(args, kwargs) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


@functools.lru_cache(maxsize=None)
def _forward_signature(cls) -> inspect.Signature:
    return inspect.signature(cls.forward)


def _rows(value, index: torch.Tensor, batch: int):
    """`value` (a call argument, or tuples/lists of them) cut to the rows `index` where it has a batch axis of
    `batch` samples (text context, timestep modulation); per-position arguments (the rotary embedding) pass."""
    if isinstance(value, torch.Tensor):
        return value[index] if value.ndim and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rows(v, index, batch) for v in value)
    if isinstance(value, dict):
        return {k: _rows(v, index, batch) for k, v in value.items()}
    return value


def _forward_rows(forward, index: torch.Tensor, hidden: torch.Tensor, args, kwargs) -> torch.Tensor:
    """The block on the rows `index` alone, scattered back into a copy of `hidden` (the other rows unchanged)."""
    batch = hidden.shape[0]
    out = hidden.clone()
    out[index] = forward(*_rows(args, index, batch), **_rows(kwargs, index, batch))
    return out


def _call_arguments(module, args, kwargs) -> dict:
    """The block call's arguments by name, `hidden_states` left out (names from the block class's forward)."""
    bound = _forward_signature(type(module)).bind(module, *args, **kwargs).arguments
    return {name: value for name, value in list(bound.items())[1:] if name != "hidden_states"}


class _CacheHook(ModelHook):
    """Shared by the leader and the other block hooks: per-branch state, the shared controller."""

    _is_stateful = True  # so that `cache_context` sets the context on our StateManager

    def __init__(self, config: ResidualCacheConfig, states: StateManager, controller: _Controller, is_tail: bool):
        super().__init__()
        self.config, self.states, self.controller, self.is_tail = config, states, controller, is_tail

    def _finish(self, state: "_BranchState", output: torch.Tensor) -> torch.Tensor:
        if self.is_tail:
            residual = (output.to(self.config.residual_dtype)
                        - state.block_input.to(self.config.residual_dtype)).detach()
            if state.computing is None:
                state.residual = residual
            else:  # only the rows that recomputed have a new residual; the others keep theirs
                state.residual = state.residual.clone()
                state.residual[state.computing] = residual[state.computing]
            state.block_input = None
            self.controller.cached_branches.add(self.states.context.name)
        return output

    def reset_state(self, module):
        self.states.reset()
        self.controller.cached_branches.clear()
        return module


class _LeaderHook(_CacheHook):
    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        if self.states._context is None or self.controller.bypass:  # outside a context or probing: the plain block
            return self.fn_ref.original_forward(*args, **kwargs)
        state: _BranchState = self.states.get_state()
        hidden = _hidden_states(args, kwargs)
        if self.controller.keep_head:  # only the block-0 probe reads them: no binding on other runs' calls
            state.head_arguments = _call_arguments(module, args, kwargs)
        rows = self.controller.reuse_rows
        state.computing = None
        if rows is not None:
            return self._mixed(state, rows, hidden, args, kwargs)
        if self.controller.reuse:
            if state.residual is None:
                raise RuntimeError(
                    f"reuse requested for branch {self.states.context.name!r} but no residual is cached; "
                    "the first step of every expert must recompute"
                )
            state.skipping = True
            self.controller.reused_calls += 1
            return (hidden.to(self.config.residual_dtype) + state.residual).to(hidden.dtype)
        state.skipping = False
        state.block_input = hidden
        self.controller.computed_calls += 1
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.controller.keep_head:  # references, no copy: a block never writes into its input or output
            state.head = (hidden.detach(), output.detach())
        return self._finish(state, output)

    def _mixed(self, state: "_BranchState", rows: torch.Tensor, hidden, args, kwargs) -> torch.Tensor:
        """Samples that decide apart: the reusing rows take h + their own residual, the recomputing rows run the
        blocks as one sub-batch (every later block hook follows `state.computing`)."""
        if rows.shape[0] != hidden.shape[0]:
            raise ValueError(f"{rows.shape[0]} per-sample decisions for a batch of {hidden.shape[0]} samples")
        if state.residual is None or state.residual.shape[0] != hidden.shape[0]:
            raise RuntimeError(f"reuse requested for some samples of branch {self.states.context.name!r} but no "
                               "residual of this batch is cached; the first step of every expert must recompute")
        computing = torch.nonzero(~rows.to(hidden.device)).flatten()
        reusing = torch.nonzero(rows.to(hidden.device)).flatten()
        state.skipping, state.computing, state.block_input = False, computing, hidden
        self.controller.computed_calls += 1
        self.controller.reused_calls += 1
        output = _forward_rows(self.fn_ref.original_forward, computing, hidden, args, kwargs)
        output[reusing] = (hidden[reusing].to(self.config.residual_dtype) + state.residual[reusing]).to(hidden.dtype)
        return self._finish(state, output)


class _BlockHook(_CacheHook):
    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        if self.states._context is None or self.controller.bypass:
            return self.fn_ref.original_forward(*args, **kwargs)
        state: _BranchState = self.states.get_state()
        if state.skipping:
            return _hidden_states(args, kwargs)
        if state.computing is not None:  # a call whose samples decide apart: only the recomputing rows run
            output = _forward_rows(self.fn_ref.original_forward, state.computing, _hidden_states(args, kwargs),
                                   args, kwargs)
            return self._finish(state, output)
        return self._finish(state, self.fn_ref.original_forward(*args, **kwargs))


class _PatchEmbeddingMemo(ModelHook):
    """The patch embedding's output for the latest input tensor, returned again while that tensor, the output
    and the weights are unchanged (`_version`, identity), outside autograd only.

    A step calls it up to three times on one input (the signal before the decision, then the
    cond and uncond branches); it holds one output between steps (on Wan2.1 at 480p, 100 MB in
    bf16) until the next input or `ResidualCache.reset`.
    """

    def __init__(self):
        super().__init__()
        self.forget()

    def forget(self) -> None:
        self.input = self.output = self.key = None

    def new_forward(self, module: torch.nn.Module, hidden_states: torch.Tensor):
        if torch.is_grad_enabled():
            return self.fn_ref.original_forward(hidden_states)
        key = (hidden_states._version, *((id(p), p._version) for p in module._parameters.values() if p is not None))
        if hidden_states is self.input and key == self.key[0] and self.output._version == self.key[1]:
            return self.output
        output = self.fn_ref.original_forward(hidden_states)
        if output.dim() == 5:
            # token-major memory: the transformer's flatten(2).transpose(1, 2) then gives contiguous (B, L, D) tokens
            # and the signal's norm a contiguous input (the copy each would make, made once)
            output = output.contiguous(memory_format=torch.channels_last_3d)
        self.input, self.output, self.key = hidden_states, output, (key, output._version)
        return output


class ResidualCache:
    """Handle on the hooks installed on one transformer (see module docstring)."""

    def __init__(self, transformer: torch.nn.Module, config: ResidualCacheConfig | None = None):
        blocks = getattr(transformer, "blocks", None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            raise ValueError(f"{type(transformer).__name__} has no non-empty `blocks` ModuleList to cache")
        if getattr(blocks[0], "_diffusers_hook", None) is not None and blocks[0]._diffusers_hook.get_hook(_LEADER_HOOK):
            raise RuntimeError(
                f"{type(transformer).__name__} already carries a MORCA residual cache; call close() on the "
                "StepwiseDenoiser (or env) that installed it before building another one on the same pipeline"
            )
        self.transformer = transformer
        self.config = config or ResidualCacheConfig()
        self._controller = _Controller()
        self.owner: int | None = None
        self._states = StateManager(_BranchState)
        self._registries: list[tuple[HookRegistry, str]] = []
        last = len(blocks) - 1
        for index, block in enumerate(blocks):
            if index == 0:
                hook, name = _LeaderHook(self.config, self._states, self._controller, is_tail=last == 0), _LEADER_HOOK
            else:
                hook, name = _BlockHook(self.config, self._states, self._controller, is_tail=index == last), _BLOCK_HOOK
            registry = HookRegistry.check_if_exists_or_initialize(block)
            registry.register_hook(hook, name)
            self._registries.append((registry, name))
        self._patch_memo = None
        if isinstance(getattr(transformer, "patch_embedding", None), torch.nn.Module):
            self._patch_memo = _PatchEmbeddingMemo()
            registry = HookRegistry.check_if_exists_or_initialize(transformer.patch_embedding)
            registry.register_hook(self._patch_memo, _PATCH_HOOK)
            self._registries.append((registry, _PATCH_HOOK))
        HookRegistry.check_if_exists_or_initialize(transformer).invalidate_child_registries_cache()
        self._output_hook = transformer.register_forward_hook(self._observe_output)

    @property
    def reuse(self) -> bool:
        return self._controller.reuse

    @reuse.setter
    def reuse(self, value: bool) -> None:
        self._controller.reuse = bool(value)
        self._controller.reuse_rows = None

    def decide(self, per_sample) -> None:
        """One reuse decision per sample of the batch (the CFG branches of a sample share it, as each branch is
        its own call). When they agree it is `reuse = value`; when they differ, the recomputing samples run the
        blocks as one sub-batch and the reusing ones take their own h + residual, each row equal to that sample
        run alone (the cache's tests check it)."""
        rows = torch.as_tensor([bool(v) for v in per_sample], dtype=torch.bool)
        if rows.numel() == 0:
            raise ValueError("decide() needs one decision per sample, got none")
        if bool(rows.all()) or not bool(rows.any()):
            self.reuse = bool(rows[0])
        else:
            self._controller.reuse, self._controller.reuse_rows = False, rows

    def is_valid(self, branches: tuple[str, ...]) -> bool:
        """True when every branch in `branches` holds a residual, so a reuse step can run."""
        return all(branch in self._controller.cached_branches for branch in branches)

    @property
    def call_counts(self) -> tuple[int, int]:
        """(transformer calls that ran the blocks, calls that reused), since the last reset."""
        return self._controller.computed_calls, self._controller.reused_calls

    @property
    def keep_head(self) -> bool:
        return self._controller.keep_head

    @keep_head.setter
    def keep_head(self, value: bool) -> None:
        self._controller.keep_head = bool(value)

    def head_arguments(self, branch: str) -> dict | None:
        """Block 0's call arguments (all but hidden_states) at `branch`'s latest call of this video, else None."""
        state = self._states._state_cache.get(branch)
        return None if state is None else state.head_arguments

    def head_output(self, branch: str) -> torch.Tensor | None:
        """Block 0's output (float32) at `branch`'s latest computed call (needs `keep_head`), else None."""
        state = self._states._state_cache.get(branch)
        return None if state is None or state.head is None else state.head[1].float()

    def head_residual(self, branch: str) -> torch.Tensor | None:
        """Block 0's output - input (float32) at `branch`'s latest computed call (needs `keep_head`), else None."""
        state = self._states._state_cache.get(branch)
        return None if state is None or state.head is None else state.head[1].float() - state.head[0].float()

    def residual(self, branch: str) -> torch.Tensor | None:
        """The residual (blocks' output - input) a reuse at `branch` adds, from its latest computed call, else None."""
        state = self._states._state_cache.get(branch)
        return None if state is None else state.residual

    def model_output(self, branch: str) -> torch.Tensor | None:
        """The transformer's output at `branch`'s latest computed call (needs `keep_output`), else None."""
        state = self._states._state_cache.get(branch)
        return None if state is None else state.model_output

    @property
    def keep_output(self) -> bool:
        return self._controller.keep_output

    @keep_output.setter
    def keep_output(self, value: bool) -> None:
        self._controller.keep_output = bool(value)

    def _observe_output(self, module, args, output) -> None:
        """Observe only: a computed call's output, by reference (a new tensor each call)."""
        if not self._controller.keep_output or self._controller.reuse or self._states._context is None:
            return
        sample = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
        self._states.get_state().model_output = sample.detach()

    @contextmanager
    def bypassed(self):
        """Inside, every block runs plain (no reuse, nothing stored): for probes between or inside calls."""
        before = self._controller.bypass
        self._controller.bypass = True
        try:
            yield
        finally:
            self._controller.bypass = before

    def reset(self) -> None:
        """Forget all residuals (start of a new video)."""
        self._states.reset()
        self._controller.cached_branches.clear()
        self._controller.reuse = False
        self._controller.computed_calls = self._controller.reused_calls = 0
        if self._patch_memo is not None:
            self._patch_memo.forget()

    def snapshot(self) -> dict:
        """The cached residuals per branch, by reference: a recompute replaces a residual, never writes into it."""
        return {"residuals": {name: state.residual for name, state in self._states._state_cache.items()},
                "cached": frozenset(self._controller.cached_branches)}

    def restore(self, snapshot: dict) -> None:
        """Put back the residuals of `snapshot` (schedule search resumes a video from a shared prefix)."""
        self.reset()
        for name, residual in snapshot["residuals"].items():
            state = _BranchState()
            state.residual = residual
            self._states._state_cache[name] = state
        self._controller.cached_branches.update(snapshot["cached"])

    def remove(self) -> None:
        """Remove the hooks; the blocks' forward is restored exactly."""
        for registry, name in reversed(self._registries):
            registry.remove_hook(name, recurse=False)
        self._registries.clear()
        self._output_hook.remove()
        HookRegistry.check_if_exists_or_initialize(self.transformer).invalidate_child_registries_cache()

    @property
    def installed(self) -> bool:
        return bool(self._registries)

    # ------------------------------------------------------------ sharing
    @classmethod
    def attach(cls, transformer: torch.nn.Module, owner: object) -> "ResidualCache":
        """The transformer's shared cache (installed on first use), with `owner` counted as a user.

        Several denoisers (e.g. a training and an evaluation env) may wrap one pipeline;
        they share the hooks. Only the denoiser that started the current video may step it.
        """
        cache = getattr(transformer, "_morca_residual_cache", None)
        if cache is None or not cache.installed:
            cache = cls(transformer)
            transformer._morca_residual_cache = cache
            cache._users = set()
        cache._users.add(id(owner))
        return cache

    def detach(self, owner: object) -> None:
        """Drop `owner`; the hooks are removed when the last user detaches."""
        self._users.discard(id(owner))
        if not self._users and self.installed:
            self.remove()
            if getattr(self.transformer, "_morca_residual_cache", None) is self:
                del self.transformer._morca_residual_cache

    def claim(self, owner: object) -> None:
        """Mark `owner` as the user whose video the cached residuals belong to (and forget them)."""
        self.reset()
        self.owner = id(owner)

    def check_owner(self, owner: object) -> None:
        if self.owner != id(owner):
            raise RuntimeError(
                "another environment or denoiser started a video on the same pipeline since this one's reset(); "
                "environments that share a pipeline must not be stepped in an interleaved way"
            )
