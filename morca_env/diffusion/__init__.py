"""The diffusion side of the env: a Wan pipeline driven one denoising step at a time, and what each step yields.

- `denoiser`: the stepwise denoiser over a diffusers pipeline; `wan_structure`: what a Wan transformer looks like
  (blocks, experts, forced steps);
- `cache`: the residual cache that a reused step reads;
- `signals`: SeaCache's filtered step distance D_t (the MDP's own signal), `features`: the latent features of the state;
- `metrics`: PSNR / SSIM / LPIPS against the no-cache video, `reference_videos`: those no-cache videos, cached on disk;
- `video`: writing videos.
"""
