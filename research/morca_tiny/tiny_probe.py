"""Which prompt words MorcaTiny's denoiser reads, at which noise level.

Prompt following can fail because a sample goes wrong or because the model never
learnt to use a word. This probe separates the two: on freshly rendered training
videos it measures the flow-matching loss (the training objective) with the true
prompt and with one attribute swapped (colour, shape, direction, background).
The increase is what the model's prediction depends on that word at that noise
level; zero means the word is ignored there, whatever the sampler does.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from morca_env.models.tiny_data import BACKGROUNDS, COLOURS, DIRECTIONS, SHAPES, all_scenes, render

OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
ATTRIBUTES = ("colour", "shape", "direction", "background")


def _swapped(scene, attribute: str):
    if attribute == "direction":
        return replace(scene, direction=OPPOSITE[scene.direction])
    options = {"colour": list(COLOURS), "shape": list(SHAPES), "background": list(BACKGROUNDS)}[attribute]
    current = getattr(scene, attribute)
    return replace(scene, **{attribute: options[(options.index(current) + len(options) // 2) % len(options)]})


@torch.no_grad()
def prompt_sensitivity(pipe, sigmas=(0.98, 0.9, 0.6, 0.3), videos: int = 64, seed: int = 0,
                       max_sequence_length: int = 16) -> dict[float, dict[str, float]]:
    """{sigma: {"loss": true-prompt loss, attribute: loss increase when that attribute is swapped}}.

    The same videos and noise are used for every prompt variant, so the differences are exact
    for this sample (no noise between variants)."""
    if not all(0.0 < s <= 1.0 for s in sigmas):
        raise ValueError(f"sigmas {tuple(sigmas)} must lie in (0, 1]")
    assert set(DIRECTIONS) == set(OPPOSITE)
    generator = torch.Generator().manual_seed(seed)
    scenes = [all_scenes()[int(i)] for i in torch.randint(len(all_scenes()), (videos,), generator=generator)]
    x0 = render(scenes, generator)

    def embed(batch):
        return pipe.encode_prompt([s.prompt for s in batch], do_classifier_free_guidance=False,
                                  max_sequence_length=max_sequence_length, device=x0.device)[0]

    variants = {"true": embed(scenes), **{a: embed([_swapped(s, a) for s in scenes]) for a in ATTRIBUTES}}
    report = {}
    for sigma in sigmas:
        noise = torch.randn(x0.shape, generator=generator)
        x_t = (1 - sigma) * x0 + sigma * noise
        timestep = torch.full((videos,), sigma * 1000.0)
        losses = {}
        for name, context in variants.items():
            pred = pipe.transformer(hidden_states=x_t, timestep=timestep, encoder_hidden_states=context,
                                    return_dict=False)[0]
            losses[name] = float(torch.nn.functional.mse_loss(pred, noise - x0))
        report[float(sigma)] = {"loss": losses["true"], **{a: losses[a] - losses["true"] for a in ATTRIBUTES}}
    return report


@torch.no_grad()
def direction_commit_sigmas(den, pairs) -> list[float]:
    """For each (prompt, seed): the noise level from which the sample's direction of motion stops changing.

    At every denoising step the x0 prediction x_t - sigma * v (v: the guided velocity that step
    used) is classified like a finished video (`tiny_data.prompt_following`'s centroid check); the
    commit sigma is that of the first step from which every prediction moves the way the final video
    does. If it lies above the sigmas at which `prompt_sensitivity` shows the direction word being
    read, the sampler fixes the direction from the noise before the prompt can steer it. Costs one
    uncached episode per prompt.
    """
    from morca_env.models.tiny_data import classify_direction, foreground_stats

    commits = []
    for prompt, seed in pairs:
        den.start(prompt=prompt, seed=seed)
        directions, sigmas = [], []
        while not den.done:
            x_t, sigma = den.latents, den.sigma(den.step_index)
            den.step(False)
            x0 = x_t - sigma * den.last_velocity
            directions.append(classify_direction(foreground_stats((x0[0] / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)).centroids))
            sigmas.append(sigma)
        final = classify_direction(foreground_stats(den.decode()).centroids)
        first = len(directions)
        while first > 0 and directions[first - 1] == final:
            first -= 1
        commits.append(float(sigmas[first]) if first < len(sigmas) else 0.0)
    return commits
