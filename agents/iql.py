"""Discrete Implicit Q-Learning for cache scheduling, inside d3rlpy (MORCA Sec. 3.3, App. B).

Twin Q networks with EMA targets, V by expectile regression on min_i Q_target,
and an advantage-weighted, action-masked categorical policy:

    L_Q  = (r + gamma V(s') - Q_i(s, a))^2                         i = 1, 2
    L_V  = |tau - 1(u < 0)| u^2,   u = min_i Q_target_i(s, a) - V(s)
    L_pi = -E[min(exp(beta A~), w_max) log pi(a | s)],  A~ = normalised advantage

Transitions whose action was forced (exactly one feasible action) are dropped
from L_pi (they carry no choice) and kept for L_Q and L_V. At inference the
policy's logits are masked with the observation's action mask, so it never
picks an infeasible action. Defaults follow the paper's Table 6 (offline stage).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from d3rlpy.base import LearnableConfig, register_learnable
from d3rlpy.constants import ActionSpace
from d3rlpy.models.builders import create_discrete_q_function, create_value_function
from d3rlpy.models.encoders import EncoderFactory, make_encoder_field
from d3rlpy.models.q_functions import MeanQFunctionFactory
from d3rlpy.models.torch import DiscreteEnsembleQFunctionForwarder, ValueFunction
from d3rlpy.models.torch.encoders import compute_output_size
from d3rlpy.optimizers import AdamWFactory, OptimizerFactory
from d3rlpy.optimizers.optimizers import OptimizerWrapper, make_optimizer_field
from d3rlpy.algos.qlearning.base import QLearningAlgoBase, QLearningAlgoImplBase
from d3rlpy.algos.qlearning.torch.utility import DiscreteQFunctionMixin
from d3rlpy.torch_utility import Modules, TorchMiniBatch, hard_sync, soft_sync
from torch import nn

from morca_env.observation import FLAT_MASK, MASK_INDEX

from .networks import MorcaEncoderFactory, SharedEncoder, masked_logits


def _optimizer_field(**kwargs):  # pragma: no mutate block (wiring, not the loss)
    return dataclasses.field(metadata=make_optimizer_field().metadata,
                             default_factory=lambda: AdamWFactory(**kwargs))


def _encoder_field():  # pragma: no mutate block (wiring, not the loss)
    return dataclasses.field(metadata=make_encoder_field().metadata, default_factory=MorcaEncoderFactory)


def action_mask_of(observations) -> torch.Tensor:
    """The action mask of a batch of MORCA observations, flat (`morca_env.observation.FLAT_KEYS`) or in the tuple form."""
    if isinstance(observations, torch.Tensor) and observations.ndim == 2:
        return observations[:, FLAT_MASK]
    if not isinstance(observations, (list, tuple)) or len(observations) <= MASK_INDEX:
        raise ValueError("DiscreteIQL needs MORCA observations: flat (morca_env.data.to_replay_buffer's default) "
                         "or the tuple [pooled, temporal, scalars, action_mask] (observation='tuple')")
    return observations[MASK_INDEX]


class MaskedCategoricalPolicy(nn.Module):
    """Encoder + linear layer to 2 logits, masked by the observation's action mask."""

    def __init__(self, encoder: nn.Module, hidden_size: int, action_size: int):
        super().__init__()
        self._encoder = encoder
        self._fc = nn.Linear(hidden_size, action_size)

    def forward(self, x) -> torch.Tensor:
        return masked_logits(self._fc(self._encoder(x)), action_mask_of(x))


@dataclasses.dataclass()
class DiscreteIQLConfig(LearnableConfig):
    """Config of discrete IQL (defaults: MORCA's offline stage, paper Table 6).

    Args:
        actor_learning_rate: policy learning rate (1e-4 offline, 4e-5 online).
        critic_learning_rate: Q and V learning rate (1e-4).
        actor_optim_factory / critic_optim_factory: AdamW, weight decay 0.01, grad-norm clip 1.0.
        actor_encoder_factory / critic_encoder_factory / value_encoder_factory: `MorcaEncoderFactory`.
        batch_size: 256.
        gamma: discount (1.0: only the terminal PSNR matters).
        tau: EMA rate of the target Q networks, 1 - eta (eta = 0.999).
        expectile: expectile level of the V regression (0.7).
        weight_temp: beta, the advantage-weighting coefficient (1.5 offline, 1.0 online).
        max_weight: w_max, the weight cap (30 offline, 20 online).
        n_critics: number of Q networks (2).
        exclude_forced: drop forced transitions from the policy loss.
        shared_critic_encoder: the twin Q networks and V read one encoder (their heads stay separate), so a
            critic step runs the encoder once on s and once on s' instead of three times and twice: about half an
            update's cost on a CPU. The paper trains four separate networks (False, the default).
    """

    actor_learning_rate: float = 1e-4
    critic_learning_rate: float = 1e-4
    actor_optim_factory: OptimizerFactory = _optimizer_field(weight_decay=0.01, clip_grad_norm=1.0)
    critic_optim_factory: OptimizerFactory = _optimizer_field(weight_decay=0.01, clip_grad_norm=1.0)
    actor_encoder_factory: EncoderFactory = _encoder_field()
    critic_encoder_factory: EncoderFactory = _encoder_field()
    value_encoder_factory: EncoderFactory = _encoder_field()
    batch_size: int = 256
    gamma: float = 1.0
    tau: float = 0.001
    expectile: float = 0.7
    weight_temp: float = 1.5
    max_weight: float = 30.0
    n_critics: int = 2
    exclude_forced: bool = True
    shared_critic_encoder: bool = False

    def create(self, device=False, enable_ddp: bool = False) -> "DiscreteIQL":  # pragma: no mutate block (wiring, not the loss)
        return DiscreteIQL(self, device, enable_ddp)

    @staticmethod
    def get_type() -> str:  # pragma: no mutate block (wiring, not the loss)
        return "morca_discrete_iql"


@dataclasses.dataclass(frozen=True)
class DiscreteIQLModules(Modules):
    policy: MaskedCategoricalPolicy
    q_funcs: nn.ModuleList
    targ_q_funcs: nn.ModuleList
    value_func: ValueFunction
    actor_optim: OptimizerWrapper
    critic_optim: OptimizerWrapper


class DiscreteIQLImpl(DiscreteQFunctionMixin, QLearningAlgoImplBase):
    _modules: DiscreteIQLModules

    def __init__(self, observation_shape, action_size, modules, q_func_forwarder, targ_q_func_forwarder,
                 config: DiscreteIQLConfig, device: str):
        super().__init__(observation_shape=observation_shape, action_size=action_size, modules=modules, device=device)
        self._q_func_forwarder = q_func_forwarder
        self._targ_q_func_forwarder = targ_q_func_forwarder
        self._config = config
        self.critic_only = False  # set during online critic-only warm-up
        hard_sync(modules.targ_q_funcs, modules.q_funcs)

    # ---------------------------------------------------------------- losses
    def target_q(self, observations, actions: torch.Tensor) -> torch.Tensor:
        values = self._targ_q_func_forwarder.compute_expected_q(observations, reduction="min")
        return values.gather(1, actions.long().reshape(-1, 1))

    def value_loss(self, batch: TorchMiniBatch, q_t: torch.Tensor | None = None) -> torch.Tensor:
        if q_t is None:
            with torch.no_grad():
                q_t = self.target_q(batch.observations, batch.actions)
        diff = q_t - self._modules.value_func(batch.observations)
        weight = (self._config.expectile - (diff < 0.0).float()).abs()
        return (weight * diff.pow(2)).mean()

    def q_loss(self, batch: TorchMiniBatch) -> torch.Tensor:
        with torch.no_grad():
            next_value = self._modules.value_func(batch.next_observations)
        return self._q_func_forwarder.compute_error(
            observations=batch.observations, actions=batch.actions.long(), rewards=batch.rewards,
            target=next_value, terminals=batch.terminals, gamma=self._config.gamma ** batch.intervals)

    def actor_loss(self, batch: TorchMiniBatch,
                   q_t: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantage-weighted log-likelihood over the non-forced transitions of the batch."""
        mask = action_mask_of(batch.observations)
        free = (mask.sum(dim=1) > 1.5).float() if self._config.exclude_forced else torch.ones_like(mask[:, 0])
        with torch.no_grad():
            if q_t is None:
                q_t = self.target_q(batch.observations, batch.actions)
            advantage = (q_t - self._modules.value_func(batch.observations)).reshape(-1)
            count = free.sum().clamp(min=1.0)
            mean = (advantage * free).sum() / count
            std = (((advantage - mean) ** 2 * free).sum() / count).sqrt()
            normalised = (advantage - mean) / (std + 1e-6)
            weight = (self._config.weight_temp * normalised).exp().clamp(max=self._config.max_weight)
        log_probs = F.log_softmax(self._modules.policy(batch.observations), dim=1)
        log_prob = log_probs.gather(1, batch.actions.long().reshape(-1, 1)).reshape(-1)
        loss = -(weight * log_prob * free).sum() / count
        return loss, {"free_fraction": float(free.mean()), "mean_weight": float((weight * free).sum() / count)}

    # ---------------------------------------------------------------- updates
    def update_critic(self, batch: TorchMiniBatch, q_t: torch.Tensor | None = None) -> dict[str, float]:
        self._modules.critic_optim.zero_grad()
        q_loss, v_loss = self.q_loss(batch), self.value_loss(batch, q_t)
        (q_loss + v_loss).backward()
        self._modules.critic_optim.step()
        return {"q_loss": float(q_loss.detach()), "v_loss": float(v_loss.detach())}

    def update_actor(self, batch: TorchMiniBatch, q_t: torch.Tensor | None = None) -> dict[str, float]:
        self._modules.actor_optim.zero_grad()
        loss, extra = self.actor_loss(batch, q_t)
        loss.backward()
        self._modules.actor_optim.step()
        return {"actor_loss": float(loss.detach()), **extra}

    def inner_update(self, batch: TorchMiniBatch, grad_step: int) -> dict[str, float]:
        # the target critics change only after both steps (soft_sync below): one forward serves both losses
        with torch.no_grad():
            q_t = self.target_q(batch.observations, batch.actions)
        metrics = self.update_critic(batch, q_t)
        if not self.critic_only:
            metrics.update(self.update_actor(batch, q_t))
        soft_sync(self._modules.targ_q_funcs, self._modules.q_funcs, self._config.tau)
        return metrics

    # ---------------------------------------------------------------- acting
    def q_values(self, x) -> torch.Tensor:
        """min over the twin critics of Q(x, a) for both actions, shape (batch, 2): what IQL's targets use, and what
        a critic-gated scheduler reads (`agents.anchored`)."""
        return self._q_func_forwarder.compute_expected_q(x, reduction="min")

    def inner_predict_best_action(self, x) -> torch.Tensor:
        return self._modules.policy(x).argmax(dim=1)

    def inner_sample_action(self, x) -> torch.Tensor:
        return torch.distributions.Categorical(logits=self._modules.policy(x)).sample()

    @property
    def policy(self):
        return self._modules.policy

    @property
    def policy_optim(self):
        return self._modules.actor_optim.optim

    @property
    def q_function(self):
        return self._modules.q_funcs

    @property
    def q_function_optim(self):
        return self._modules.critic_optim.optim


class DiscreteIQL(QLearningAlgoBase[DiscreteIQLImpl, DiscreteIQLConfig]):
    """Discrete IQL (see module docstring); `set_critic_only(True)` freezes the policy for warm-ups."""

    def inner_create_impl(self, observation_shape, action_size: int) -> None:  # pragma: no mutate block (wiring, not the loss)
        config = self._config
        if config.shared_critic_encoder:
            q_funcs, q_forwarder, value_func = self._shared_critics(observation_shape, action_size)
            targ_q_funcs, targ_forwarder, _ = self._shared_critics(observation_shape, action_size)
        else:
            q_funcs, q_forwarder = create_discrete_q_function(
                observation_shape, action_size, config.critic_encoder_factory, MeanQFunctionFactory(),
                n_ensembles=config.n_critics, device=self._device, enable_ddp=self._enable_ddp)
            targ_q_funcs, targ_forwarder = create_discrete_q_function(
                observation_shape, action_size, config.critic_encoder_factory, MeanQFunctionFactory(),
                n_ensembles=config.n_critics, device=self._device, enable_ddp=self._enable_ddp)
            value_func = create_value_function(observation_shape, config.value_encoder_factory,
                                               device=self._device, enable_ddp=self._enable_ddp)
        encoder = config.actor_encoder_factory.create(observation_shape)
        policy = MaskedCategoricalPolicy(encoder, compute_output_size([observation_shape], encoder), action_size)
        policy.to(self._device)
        actor_optim = config.actor_optim_factory.create(policy.named_modules(), lr=config.actor_learning_rate,
                                                        compiled=False)
        critic_optim = config.critic_optim_factory.create(
            list(q_funcs.named_modules()) + list(value_func.named_modules()), lr=config.critic_learning_rate,
            compiled=False)
        modules = DiscreteIQLModules(policy=policy, q_funcs=q_funcs, targ_q_funcs=targ_q_funcs,
                                     value_func=value_func, actor_optim=actor_optim, critic_optim=critic_optim)
        self._impl = DiscreteIQLImpl(observation_shape, action_size, modules, q_forwarder, targ_forwarder,
                                     config, self._device)

    def _shared_critics(self, observation_shape, action_size: int):  # pragma: no mutate block (wiring)
        """Twin Q heads and a V head on one `SharedEncoder` (the config's critic encoder)."""
        encoder = SharedEncoder(self._config.critic_encoder_factory.create(observation_shape)).to(self._device)
        hidden_size = compute_output_size([observation_shape], encoder)
        made = [MeanQFunctionFactory().create_discrete(encoder, hidden_size, action_size)
                for _ in range(self._config.n_critics)]
        q_funcs = nn.ModuleList([q.to(self._device) for q, _ in made])
        value_func = ValueFunction(encoder, hidden_size).to(self._device)
        return q_funcs, DiscreteEnsembleQFunctionForwarder([f for _, f in made], action_size), value_func

    def get_action_type(self) -> ActionSpace:
        return ActionSpace.DISCRETE

    def build_with_dataset(self, dataset) -> None:  # pragma: no mutate block (wiring, not the loss)
        """Like d3rlpy's, but keeps every shape of tuple observations (d3rlpy 2.8 keeps only the first)."""
        shape = dataset.dataset_info.observation_signature.shape
        self.create_impl(shape[0] if len(shape) == 1 else shape, dataset.dataset_info.action_size)

    def set_critic_only(self, flag: bool) -> None:
        if self._impl is None:
            raise RuntimeError("build the algorithm first (fit, build_with_dataset or load)")
        self._impl.critic_only = bool(flag)

    def copy_weights_from(self, other: "DiscreteIQL") -> None:  # pragma: no mutate block (wiring, not the loss)
        """Load all networks (not optimiser states) of `other`, e.g. offline -> online with new learning rates."""
        src, dst = other.impl.modules, self.impl.modules
        for name in ("policy", "q_funcs", "targ_q_funcs", "value_func"):
            getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


register_learnable(DiscreteIQLConfig)
