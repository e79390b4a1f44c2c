from dataclasses import replace

import pytest
import torch

from morca_env.diffusion.cache import ResidualCache
from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
from tests.conftest import prompt_embeds

CFG = DenoiserConfig(num_inference_steps=8, height=32, width=32, num_frames=9, max_sequence_length=8)


class BlockCounter:
    """Counts blocks that really compute: each block's attn1 runs only inside the block's own forward."""

    def __init__(self, transformer):
        self.count = 0
        self.handles = [b.attn1.register_forward_hook(self._hit) for b in transformer.blocks]

    def _hit(self, *_):
        self.count += 1

    def take(self):
        n, self.count = self.count, 0
        return n


def test_reuse_step_runs_no_block_recompute_runs_all(wan21_pipe):
    counter = BlockCounter(wan21_pipe.transformer)
    n_blocks = len(wan21_pipe.transformer.blocks)
    den = StepwiseDenoiser(wan21_pipe, CFG)
    den.start(*(), prompt_embeds=prompt_embeds()[0], negative_prompt_embeds=prompt_embeds()[1])
    counts = []
    for a in [0, 1, 0, 1, 1, 0, 1, 0]:
        den.step(reuse=bool(a))
        counts.append(counter.take())
    assert counts == [0 if a else 2 * n_blocks for a in [0, 1, 0, 1, 1, 0, 1, 0]]  # 2 CFG branches
    assert den.caches[0].call_counts == (2 * 4, 2 * 4)
    den.close()


def test_branches_keep_separate_residuals(wan21_pipe):
    den = StepwiseDenoiser(wan21_pipe, CFG)
    den.start(prompt_embeds=prompt_embeds()[0], negative_prompt_embeds=prompt_embeds()[1])
    den.step(reuse=False)
    states = den.caches[0]._states._state_cache
    assert set(states) == {"cond", "uncond"}
    cond, uncond = states["cond"].residual, states["uncond"].residual
    assert cond.dtype == torch.float32 and cond.shape == uncond.shape
    assert (cond - uncond).abs().max() > 1e-5
    den.close()


def test_reuse_adds_cached_residual_to_block_input(wan21_pipe):
    """On reuse the block stack's output is exactly h + residual of that branch."""
    transformer = wan21_pipe.transformer
    cache = ResidualCache(transformer)
    h = torch.randn(1, 12, 32)
    ehs = transformer.condition_embedder.text_embedder(prompt_embeds()[0])
    temb = torch.randn(1, 6, 32)
    rope = transformer.rope(torch.randn(1, 4, 3, 4, 4))  # 3 x 2 x 2 = 12 tokens
    def stack(x):
        for block in transformer.blocks:
            x = block(x, ehs, temb, rope)
        return x
    with transformer.cache_context("cond"):
        cache.reuse = False
        full = stack(h)
        cache.reuse = True
        h2 = torch.randn(1, 12, 32)
        reused = stack(h2)
    assert torch.allclose(reused, h2 + (full - h), atol=1e-6)
    cache.remove()


def test_remove_restores_forward_exactly(wan21_pipe):
    transformer = wan21_pipe.transformer
    x = torch.randn(1, 4, 3, 4, 4)
    t = torch.tensor([500.0])
    e = prompt_embeds()[0]
    with torch.no_grad():
        before = transformer(x, t, e, return_dict=False)[0]
        den = StepwiseDenoiser(wan21_pipe, CFG)
        with pytest.raises(RuntimeError, match="already carries"):
            ResidualCache(transformer)  # a second, independent set of hooks is refused
        den.close()
        after = transformer(x, t, e, return_dict=False)[0]
    assert torch.equal(before, after)
    for block in transformer.blocks:
        assert not block._diffusers_hook.hooks
    assert not transformer.patch_embedding._diffusers_hook.hooks
    StepwiseDenoiser(wan21_pipe, CFG).close()  # installable again after removal


def test_denoisers_sharing_a_pipeline_cannot_interleave(wan21_pipe):
    embeds = prompt_embeds()
    first, second = StepwiseDenoiser(wan21_pipe, CFG), StepwiseDenoiser(wan21_pipe, CFG)
    assert first.caches[0] is second.caches[0]
    first.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1])
    first.step(reuse=False)
    second.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1])
    with pytest.raises(RuntimeError, match="interleaved"):
        first.step(reuse=True)
    second.step(reuse=False)
    first.close()
    assert wan21_pipe.transformer.blocks[0]._diffusers_hook.hooks  # still used by `second`
    second.close()
    assert not wan21_pipe.transformer.blocks[0]._diffusers_hook.hooks
    assert not hasattr(wan21_pipe.transformer, "_morca_residual_cache")  # no stale cache (and its residuals) kept


def test_experts_have_separate_caches(wan22_pipe):
    den = StepwiseDenoiser(wan22_pipe, replace(CFG, guidance_scale_2=3.0, num_inference_steps=16))
    den.start(prompt_embeds=prompt_embeds()[0], negative_prompt_embeds=prompt_embeds()[1])
    switch = den.expert_switch_step
    while den.step_index < switch:
        den.step(reuse=den.step_index % 2 == 1)
    assert den.cache_valid(switch - 1) and not den.cache_valid(switch)
    with pytest.raises(RuntimeError, match="cached residual"):
        den.step(reuse=True)
    den.step(reuse=False)
    assert den.cache_valid(switch + 1)
    assert den.caches[0].call_counts != den.caches[1].call_counts
    den.close()


class BlockStackTrace:
    """Records, per transformer call, (CFG branch, block-stack input, block-stack output).

    The branch is read from the text embeddings the pipeline passed in (not from the
    cache's own bookkeeping), so a cache that mixes up branches cannot hide it.
    """

    def __init__(self, transformer, cond_embeds):
        self.cond_embeds = cond_embeds
        self.records, self._call = [], {}
        blocks = transformer.blocks
        self.handles = [
            transformer.register_forward_pre_hook(self._on_call, with_kwargs=True),
            blocks[0].register_forward_pre_hook(self._on_first),
            blocks[-1].register_forward_hook(self._on_last),
        ]

    def _on_call(self, module, args, kwargs):
        same = kwargs["encoder_hidden_states"].shape == self.cond_embeds.shape and torch.equal(
            kwargs["encoder_hidden_states"].float(), self.cond_embeds.float())
        self._call = {"branch": "cond" if same else "uncond"}

    def _on_first(self, module, args):
        self._call["input"] = args[0].detach().float().clone()

    def _on_last(self, module, args, output):
        self.records.append((self._call["branch"], self._call["input"], output.detach().float().clone()))

    def take(self):
        records, self.records = self.records, []
        return records

    def remove(self):
        for handle in self.handles:
            handle.remove()


def check_each_branch_reuses_its_own_residual(den, transformers, schedule, embeds):
    """Play `schedule`; on every reuse call the block stack must return input + that branch's last residual."""
    traces = [BlockStackTrace(t, embeds[0]) for t in transformers]
    residuals, reused = {}, {}
    den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1])
    for action in schedule:
        expert = den.expert_of_step[den.step_index]
        den.step(reuse=bool(action))
        records = [r for trace in traces for r in trace.take()]
        assert sorted(branch for branch, _, _ in records) == ["cond", "uncond"]
        for branch, block_input, block_output in records:
            key = (expert, branch)
            if action:
                expected = block_input + residuals[key]
                assert torch.allclose(block_output, expected, atol=1e-5), f"{key} reused a foreign residual"
                reused[key] = reused.get(key, 0) + 1
            else:
                residuals[key] = block_output - block_input
    for trace in traces:
        trace.remove()
    for expert in {e for e, _ in residuals}:
        cond, uncond = residuals[(expert, "cond")], residuals[(expert, "uncond")]
        # the branches' residuals differ far beyond the tolerance: a swapped residual would fail above
        assert (cond - uncond).abs().max() > 1e-2, expert
    return reused


def test_each_cfg_branch_reuses_its_own_residual_wan21(wan21_pipe):
    den = StepwiseDenoiser(wan21_pipe, CFG)
    embeds = prompt_embeds()
    reused = check_each_branch_reuses_its_own_residual(den, [wan21_pipe.transformer], [0, 1, 0, 1, 1, 0, 1, 0], embeds)
    assert reused == {(0, "cond"): 4, (0, "uncond"): 4}
    den.close()


def test_each_cfg_branch_reuses_its_own_residual_on_both_wan22_experts(wan22_pipe):
    den = StepwiseDenoiser(wan22_pipe, replace(CFG, guidance_scale_2=3.0, num_inference_steps=16))
    switch = den.expert_switch_step
    assert 2 < switch < 14
    schedule = [int(i not in (0, switch, 15) and i % 3 != 0) for i in range(16)]
    embeds = prompt_embeds()
    reused = check_each_branch_reuses_its_own_residual(
        den, [wan22_pipe.transformer, wan22_pipe.transformer_2], schedule, embeds)
    assert set(reused) == {(0, "cond"), (0, "uncond"), (1, "cond"), (1, "uncond")}
    den.close()


def block_inputs(transformer, dtype=torch.float32, seed=0):
    """Inputs of one block call on a 3 x 2 x 2 token grid: (h, encoder states, temb, rope)."""
    g = torch.Generator().manual_seed(seed)
    ehs = transformer.condition_embedder.text_embedder(prompt_embeds()[0].to(dtype))
    rope = transformer.rope(torch.randn(1, 4, 3, 4, 4))
    return torch.randn(1, 12, 32, generator=g).to(dtype), ehs, torch.randn(1, 6, 32, generator=g).to(dtype), rope


def test_hooks_pass_through_outside_a_cache_context_and_accept_keyword_calls(wan21_pipe):
    """Outside `cache_context` the blocks behave as without hooks; inside, keyword calls cache like positional ones."""
    transformer = wan21_pipe.transformer
    h, ehs, temb, rope = block_inputs(transformer)
    with torch.no_grad():
        plain = [block(h, ehs, temb, rope) for block in transformer.blocks]
        cache = ResidualCache(transformer)
        cache.reuse = True  # ignored outside a context
        hooked = [block(h, ehs, temb, rope) for block in transformer.blocks]
        keywords = [block(hidden_states=h, encoder_hidden_states=ehs, temb=temb, rotary_emb=rope)
                    for block in transformer.blocks]
        with transformer.cache_context("cond"):
            cache.reuse = False
            x = h
            for block in transformer.blocks:
                x = block(hidden_states=x, encoder_hidden_states=ehs, temb=temb, rotary_emb=rope)
            cache.reuse = True
            h2 = h + 1.0
            y = h2
            for block in transformer.blocks:
                y = block(hidden_states=y, encoder_hidden_states=ehs, temb=temb, rotary_emb=rope)
    cache.remove()
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))
    assert all(torch.equal(a, b) for a, b in zip(plain, keywords))
    assert torch.allclose(y, h2 + (x - h), atol=1e-6)


def test_reset_forgets_residuals_and_the_reuse_decision(wan21_pipe):
    transformer = wan21_pipe.transformer
    h, ehs, temb, rope = block_inputs(transformer)
    cache = ResidualCache(transformer)
    with torch.no_grad(), transformer.cache_context("cond"):
        with pytest.raises(RuntimeError, match="no residual is cached"):
            cache.reuse = True
            transformer.blocks[0](h, ehs, temb, rope)
        cache.reuse = False
        for block in transformer.blocks:
            block(h, ehs, temb, rope)
        assert cache.is_valid(("cond",)) and not cache.is_valid(("cond", "uncond"))
        cache.reuse = True
    cache.reset()  # as at the start of a video, between transformer calls
    assert cache.reuse is False and not cache.is_valid(("cond",)) and cache.call_counts == (0, 0)
    with torch.no_grad(), transformer.cache_context("cond"):
        with pytest.raises(RuntimeError, match="no residual is cached"):
            cache.reuse = True
            transformer.blocks[0](h, ehs, temb, rope)
    cache.remove()


def test_bf16_model_keeps_a_float32_residual_and_returns_its_own_dtype(wan21_pipe):
    """A bf16 model's residual is stored in float32; a reused step still hands bf16 to the output layers."""
    transformer = wan21_pipe.transformer.to(torch.bfloat16)
    h, ehs, temb, rope = block_inputs(transformer, torch.bfloat16)
    cache = ResidualCache(transformer)
    with torch.no_grad(), transformer.cache_context("cond"):
        x = h
        for block in transformer.blocks:
            x = block(x, ehs, temb, rope)
        residual = cache._states.get_state().residual
        cache.reuse = True
        y = h
        for block in transformer.blocks:
            y = block(y, ehs, temb, rope)
    cache.remove()
    assert residual.dtype == torch.float32 and torch.equal(residual, x.float() - h.float())
    assert y.dtype == torch.bfloat16 and torch.equal(y, (h.float() + residual).to(torch.bfloat16))


def test_a_transformer_without_blocks_is_refused():
    with pytest.raises(ValueError, match="no non-empty `blocks`"):
        ResidualCache(torch.nn.Linear(2, 2))
    empty = torch.nn.Module()
    empty.blocks = torch.nn.ModuleList()
    with pytest.raises(ValueError, match="no non-empty `blocks`"):
        ResidualCache(empty)


def test_a_single_block_transformer_caches_in_its_leader(wan21_pipe):
    """With one block the leader is also the tail: it stores the residual a reuse adds."""
    transformer = wan21_pipe.transformer
    transformer.blocks = torch.nn.ModuleList([transformer.blocks[0]])
    h, ehs, temb, rope = block_inputs(transformer)
    cache = ResidualCache(transformer)
    with torch.no_grad(), transformer.cache_context("cond"):
        out = transformer.blocks[0](h, ehs, temb, rope)
        assert cache.is_valid(("cond",))
        cache.reuse = True
        reused = transformer.blocks[0](h + 1.0, ehs, temb, rope)
    cache.remove()
    assert torch.allclose(reused, h + 1.0 + (out - h), atol=1e-6)


def test_keep_head_records_block0_arguments_input_and_output_per_branch(wan21_pipe):
    """The block-0 probe's inputs: block 0's call arguments (latest call, reused ones too) and its
    (input, output) at the branch's latest computed call; nothing without `keep_head`."""
    transformer = wan21_pipe.transformer
    h, ehs, temb, rope = block_inputs(transformer)
    with torch.no_grad():
        plain0 = transformer.blocks[0](h, ehs, temb, rope)
    cache = ResidualCache(transformer)
    assert cache.head_arguments("cond") is None and cache.head_output("cond") is None
    assert cache.head_residual("cond") is None and cache.model_output("cond") is None
    with torch.no_grad():
        with transformer.cache_context("uncond"):  # keep_head off: the branch's state exists, nothing kept
            for block in transformer.blocks:
                block(h, ehs, temb, rope)
        assert cache.head_arguments("uncond") is None and cache.head_output("uncond") is None
        assert cache.head_residual("uncond") is None and cache.model_output("uncond") is None
        cache.keep_head = True
        assert cache.keep_head is True
        with transformer.cache_context("cond"):  # positional call
            for block in transformer.blocks:
                block(h, ehs, temb, rope)
        arguments = cache.head_arguments("cond")
        assert set(arguments) == {"encoder_hidden_states", "temb", "rotary_emb"}
        assert arguments["encoder_hidden_states"] is ehs and arguments["temb"] is temb and arguments["rotary_emb"] is rope
        assert torch.equal(cache.head_output("cond"), plain0)
        assert torch.equal(cache.head_residual("cond"), plain0 - h)
        temb2 = temb + 1.0
        with transformer.cache_context("cond"):  # keyword call, reused: new arguments, the head stays
            cache.reuse = True
            transformer.blocks[0](hidden_states=h + 1.0, encoder_hidden_states=ehs, temb=temb2, rotary_emb=rope)
            cache.reuse = False
        arguments = cache.head_arguments("cond")
        assert set(arguments) == {"encoder_hidden_states", "temb", "rotary_emb"} and arguments["temb"] is temb2
        assert torch.equal(cache.head_output("cond"), plain0)
        assert cache.head_arguments("uncond") is None  # per branch
    cache.remove()


def test_keep_output_records_each_branchs_computed_output(wan21_pipe):
    transformer = wan21_pipe.transformer
    x, t, e = torch.randn(1, 4, 3, 4, 4), torch.tensor([500.0]), prompt_embeds()[0]
    cache = ResidualCache(transformer)
    with torch.no_grad():
        with transformer.cache_context("cond"):
            transformer(x, t, e, return_dict=False)
        assert cache.model_output("cond") is None  # keep_output off
        cache.keep_output = True
        assert cache.keep_output is True
        transformer(x, t, e, return_dict=False)  # outside a context: nothing kept, no error
        with transformer.cache_context("cond"):
            tuple_out = transformer(x, t, e, return_dict=False)[0]
        assert torch.equal(cache.model_output("cond"), tuple_out)
        with transformer.cache_context("uncond"):
            dict_out = transformer(x + 1.0, t, e, return_dict=True).sample
            cache.reuse = True
            reused = transformer(x - 1.0, t, e, return_dict=True).sample  # a reused call does not replace it
            cache.reuse = False
            assert torch.equal(cache.model_output("uncond"), dict_out) and not torch.equal(reused, dict_out)
            bare = torch.randn(2, 3)
            cache._observe_output(transformer, (), bare)  # a transformer returning a bare tensor
            assert torch.equal(cache.model_output("uncond"), bare)
        assert torch.equal(cache.model_output("cond"), tuple_out) and not torch.equal(dict_out, tuple_out)
    cache.remove()


def test_snapshot_and_restore_put_back_each_branchs_residual(wan21_pipe):
    transformer = wan21_pipe.transformer
    h, ehs, temb, rope = block_inputs(transformer)
    cache = ResidualCache(transformer)
    residuals = {}
    with torch.no_grad():
        for branch, shift in (("cond", 0.0), ("uncond", 1.0)):
            with transformer.cache_context(branch):
                x = h + shift
                for block in transformer.blocks:
                    x = block(x, ehs, temb, rope)
            residuals[branch] = x - (h + shift)
        snap = cache.snapshot()
        assert snap["cached"] == frozenset({"cond", "uncond"})
        assert set(snap["residuals"]) == {"cond", "uncond"}
        assert all(snap["residuals"][b] is cache._states._state_cache[b].residual for b in residuals)  # references
        cache.reset()
        with transformer.cache_context("other"):
            for block in transformer.blocks:
                block(h, ehs, temb, rope)
        cache.restore(snap)
        assert cache.is_valid(("cond", "uncond")) and not cache.is_valid(("other",))
        assert "other" not in cache._states._state_cache  # restore starts from a reset cache
        cache.reuse = True
        for branch in ("cond", "uncond"):
            with transformer.cache_context(branch):
                y = h - 2.0
                for block in transformer.blocks:
                    y = block(y, ehs, temb, rope)
            assert torch.allclose(y, h - 2.0 + residuals[branch], atol=1e-6), branch
    cache.remove()


class ConvCounter:
    """Counts the patch embedding's real convolutions (a memo hit runs none)."""

    def __init__(self, conv):
        self.count, self._inner = 0, conv._conv_forward
        conv._conv_forward = self._counted

    def _counted(self, *args):
        self.count += 1
        return self._inner(*args)


def test_patch_embedding_runs_once_per_step_for_the_signal_and_both_branches(wan21_pipe):
    """The signal computes the step's patch embedding before the decision; both CFG branches' transformer calls
    get it from the memo (before: 3 convolutions per step; stock generation: 2)."""
    from morca_env.diffusion.signals import signal_input_for_step

    den = StepwiseDenoiser(wan21_pipe, CFG)
    counter = ConvCounter(den.experts[0].patch_embedding)
    cond, uncond = prompt_embeds()
    den.start(prompt_embeds=cond, negative_prompt_embeds=uncond, seed=0)
    for i in range(4):
        signal_input_for_step("official", den)
        den.step(reuse=i == 3)
    assert counter.count == 4
    den.generate(prompt_embeds=cond, negative_prompt_embeds=uncond, seed=0)  # no signal: cond computes, uncond hits
    assert counter.count == 4 + den.num_steps
    den.close()
    assert not den.experts[0].patch_embedding._diffusers_hook.hooks


def test_patch_embedding_memo_recomputes_on_a_changed_input_weight_or_output_and_under_autograd(wan21_pipe):
    conv = wan21_pipe.transformer.patch_embedding
    den = StepwiseDenoiser(wan21_pipe, CFG)

    def plain(x):
        return torch.nn.functional.conv3d(x, conv.weight, conv.bias, conv.stride)

    x = torch.randn(1, 4, 3, 4, 4)
    with torch.no_grad():
        first = conv(x)
        assert conv(x) is first and torch.equal(first, plain(x))
        assert first.permute(0, 2, 3, 4, 1).is_contiguous()  # token-major: the transformer's tokens come contiguous
        x.add_(1.0)  # the same tensor written in place
        assert torch.equal(conv(x), plain(x)) and not torch.equal(conv(x), first)
        conv.weight.mul_(2.0)
        assert torch.equal(conv(x), plain(x))
        conv(x).add_(3.0)  # a caller wrote into the memo's output
        assert torch.equal(conv(x), plain(x))
        y = x.clone()
        assert conv(y) is not conv(x) and torch.equal(conv(y), conv(x))
    out = conv(x)  # autograd on: never served from the memo
    assert out.requires_grad and torch.equal(out.detach(), plain(x).detach())
    den.close()


def _block_stack(transformer):
    def stack(x, ehs, temb, rope):
        for block in transformer.blocks:
            x = block(x, ehs, temb, rope)
        return x
    return stack


@pytest.mark.parametrize("decisions", [[True, False, True], [False, True, False], [True, True, False]])
@pytest.mark.parametrize("pipe, expert", [("wan21_pipe", "transformer"), ("wan22_pipe", "transformer"),
                                          ("wan22_pipe", "transformer_2")])
def test_per_sample_decisions_give_each_row_its_own_run(request, pipe, expert, decisions):
    """A batch whose samples decide apart: each row equals that sample played alone with the same decisions
    (its own residual when it reuses, the blocks on its own context and modulation when it recomputes);
    for Wan2.1's transformer and each of Wan2.2's two experts."""
    transformer = getattr(request.getfixturevalue(pipe), expert)
    stack = _block_stack(transformer)
    torch.manual_seed(0)
    batch = len(decisions)
    h0, h1 = torch.randn(batch, 12, 32), torch.randn(batch, 12, 32)
    ehs = transformer.condition_embedder.text_embedder(prompt_embeds()[0]).repeat(batch, 1, 1)
    ehs = ehs + 0.1 * torch.randn_like(ehs)  # a text context per sample
    temb0, temb1 = torch.randn(batch, 6, 32), torch.randn(batch, 6, 32)
    rope = transformer.rope(torch.randn(1, 4, 3, 4, 4))
    alone = []
    cache = ResidualCache(transformer)
    for i, reuse in enumerate(decisions):
        with transformer.cache_context(f"alone{i}"):
            cache.reuse = False
            stack(h0[i:i + 1], ehs[i:i + 1], temb0[i:i + 1], rope)
            cache.reuse = reuse
            alone.append(stack(h1[i:i + 1], ehs[i:i + 1], temb1[i:i + 1], rope))
            cache.reuse = False
            after = stack(h0[i:i + 1], ehs[i:i + 1], temb0[i:i + 1], rope)  # the next computed step
            alone.append(after)
    with transformer.cache_context("batch"):
        cache.reuse = False
        stack(h0, ehs, temb0, rope)
        cache.decide(decisions)
        together = stack(h1, ehs, temb1, rope)
        cache.decide([False] * batch)
        next_step = stack(h0, ehs, temb0, rope)
    for i in range(batch):
        assert torch.allclose(together[i:i + 1], alone[2 * i], atol=1e-5), (i, decisions)
        assert torch.allclose(next_step[i:i + 1], alone[2 * i + 1], atol=1e-5), i
    reused, computed = decisions.index(True), decisions.index(False)  # the rows really took different paths
    assert not torch.allclose(together[reused], stack(h1, ehs, temb1, rope)[reused], atol=1e-3)
    cache.remove()


def test_per_sample_decisions_check_their_count_and_agreeing_ones_take_the_fast_path(wan21_pipe):
    transformer = wan21_pipe.transformer
    stack = _block_stack(transformer)
    cache = ResidualCache(transformer)
    h = torch.randn(2, 12, 32)
    ehs = transformer.condition_embedder.text_embedder(prompt_embeds()[0]).repeat(2, 1, 1)
    temb, rope = torch.randn(2, 6, 32), transformer.rope(torch.randn(1, 4, 3, 4, 4))
    with transformer.cache_context("cond"):
        with pytest.raises(RuntimeError, match="no residual of this batch is cached"):
            cache.decide([True, False])
            stack(h, ehs, temb, rope)
        cache.reuse = False
        stack(h, ehs, temb, rope)
        cache.decide([True, True])
        assert cache.reuse is True
        cache.decide([True, False, True])
        with pytest.raises(ValueError, match="3 per-sample decisions for a batch of 2 samples"):
            stack(h, ehs, temb, rope)
    with pytest.raises(ValueError, match="one decision per sample, got none"):
        cache.decide([])
    cache.remove()
