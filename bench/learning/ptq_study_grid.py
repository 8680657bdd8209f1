"""bench.learning.ptq_study's grid: one `StudyRow` per (algorithm, task) with its budget, the settings that differ
from the task's preset, the reference return its fp32 policy must reach (and that figure's source) and the QAT widths
trained beside PTQ; the quick smoke run's tiny settings."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agents.ppo.config import CONTROL_OVERRIDES as PPO_CONTROL_OVERRIDES
from bench.learning.d4pg_rows import CARTPOLE_OVERRIDES, WALKER_OVERRIDES


@dataclasses.dataclass(frozen=True)
class StudyRow:
    """One (algorithm, task) of the grid: its training budget, the agent settings that differ from the task's
    preset, the reference return its fp32 policy must reach (and where that figure comes from), and the QAT bit
    widths trained beside PTQ. Training stops once `target_streak` evaluations in a row (`eval_episodes` greedy
    episodes each) reach the reference, else at the budget; a seed whose fp32 policy then evaluates below it on the
    study's own episodes is not converged (shown, kept out of the table). `target_streak` 0: no early stop, the run
    trains its whole budget.

    The default rule is 2 evaluations of 10 episodes in a row: one evaluation of 5 at the reference often stopped a
    policy that the study's own 10 episodes then put below it (DQN Acrobot-v1 seed 1: -169.4 against -100; DQN
    MountainCar-v0 seeds 1-2: -115.9 and -119.8 against -110; PPO CartPole-v1 seed 1: 474.1; PPO MinAtar/Breakout
    seed 0: 6.0, then 5.3; DQN MinAtar/SpaceInvaders seed 0: 25.6, then 21.1 against 22)."""

    algo: str
    task: str
    steps: int
    eval_every: int
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""
    reference: float | None = None
    source: str = ""
    qat_bits: tuple[int, ...] = ()
    eval_episodes: int = 10
    target_streak: int = 2
    # Greedy episodes per precision in the study's sweep (`--episodes` overrides). Discrete policies need many: MinAtar
    # returns vary by ~2 (Breakout) to ~10 (Space Invaders) from episode to episode, so over 10 episodes the mean's
    # noise alone is ~10%, twice the 5% the int8 claim is tested against; and one episode in ten that loops to the
    # step limit moves the mean by ~50% (DQN Acrobot-v1 seed 1, int8: -80.7 -> -122.5 from one -500 episode).
    # D4PG's DM Control rows keep 10 (1,000-step episodes; cartpole:balance's varied by ~1%).
    sweep_episodes: int = 50
    # Extra sweep rows of the same fp32 policy beside PTQ: "int8-head16" is int8 with the output layer (DQN's Q head)
    # at 16 bits, run dequantized (launch.ptq_policy.GridPoint.head_bits).
    extra_rows: tuple[str, ...] = ()

    @property
    def trainer(self) -> str:
        """Who trains the cell: `anakin` (launch.anakin, 10 seeds vmapped in one call) where the task has a gymnax
        port, `train` (launch.train, one process per seed) for the others (DM Control)."""
        return "anakin" if self.task in ANAKIN_TASKS else "train"

    @property
    def seeds(self) -> tuple[int, ...]:
        """The cell's default seeds: 10 where one vmapped call trains them all, 3 where each is its own run."""
        return ANAKIN_SEEDS if self.trainer == "anakin" else TRAIN_SEEDS


ANAKIN_TASKS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MinAtar/Breakout", "MinAtar/SpaceInvaders",
                "MinAtar/Asterix", "MinAtar/Freeway")  # the tasks with a gymnax port (launch.anakin --list-tasks)
ANAKIN_SEEDS, TRAIN_SEEDS = tuple(range(10)), (0, 1, 2)
HEAD16 = ("int8-head16",)


# The rule every study run stopped by before rows recorded theirs (and the quick smoke run's): one evaluation of 5
# episodes. bench.learning.ptq_study_rows.read_rows and the report read rows without the columns as this.
STOP_LEGACY = (5, 1)
# D4PG's cartpole:balance keeps it: its returns vary little once learnt (its three seeds stopped by it evaluated
# 990.4 +- 7.5 in the study, against 950). walker:stand does not: seed 1 stopped by one evaluation of 5 at 60k
# evaluated 841 on the study's 10 episodes, against 920.
_ONE_OF_5 = {"eval_episodes": STOP_LEGACY[0], "target_streak": STOP_LEGACY[1]}


def recorded_rule(eval_episodes: Any, target_streak: Any) -> tuple[int, int]:
    """The (evaluation episodes, streak) a study row recorded for its run, `STOP_LEGACY` where a file from before the
    columns has none (blank or None; a streak of 0 is a rule: trained to the budget)."""
    return tuple(default if value in (None, "") else int(value)  # type: ignore[return-value]
                 for value, default in zip((eval_episodes, target_streak), STOP_LEGACY))


# References: gymnasium's reward_threshold for its tasks (the return at which its registry calls the task solved:
# gymnasium/envs/__init__.py registers CartPole-v1 with reward_threshold=475.0, Acrobot-v1 with -100.0 and
# MountainCar-v0 with -110.0);
# the MinAtar authors' DQN at 200k frames (Young & Tian, 2019, the README figure: bench.learning.minatar_dqn; Freeway
# at 500k, its DQN curve's first point past the 100-episode averaging window, where DQN has learnt it); for
# DM Control 95% of the fp32 D4PG return the QuaRL paper reports (arXiv 1910.01055: ~1000 cartpole_balance, ~970
# walker_stand). Budgets: what each agent needed on the seeds measured so far, with room (int8_vs_fp32's rows,
# bench.peers, bench.learning.minatar_dqn). The classic-control budgets sit at or above rejax's tuned gymnax
# settings (keraJLi/rejax, configs/gymnax/{cartpole,acrobot,mountaincar}.yaml: PPO and DQN at 100k env steps on
# CartPole-v1 and Acrobot-v1, DQN at 100k on MountainCar-v0), whose final curves reach the thresholds there; for
# PPO on MountainCar-v0 rejax has no fitted setting (its config notes one is probably impossible within 250k
# steps): the on-policy MountainCar cells run 250k and are expected to miss, shown with their curves.
_GYM = "gymnasium's reward_threshold"
_MINATAR = "the MinAtar authors' DQN at 200k frames"
_MINATAR_500K = "the MinAtar authors' DQN at 500k frames"
_QUARL = "95% of the QuaRL paper's fp32 D4PG return"
_QAT = (8, 4, 2)
# MinAtar reference per game (return, source). The authors' curves (img/learning_curves.gif in kenjyoung/MinAtar,
# 100-episode moving averages of training returns, read off the figure's pixels along its tick marks): DQN 6.0 on
# Breakout at 200k; on Space Invaders 21.0 at 150-200k and 22.1 at 300k (22 is the stricter of the two); on Freeway
# 34 at 500k, whose 100 episodes of 2,500 frames average over 250k-500k, where the curve climbs from 5.5 to 44.
_MINATAR_REFERENCE = {"Breakout": (6.0, _MINATAR), "SpaceInvaders": (22.0, _MINATAR),
                      "Freeway": (38.0, _MINATAR_500K)}


def _minatar(algo: str, game: str, steps: int, eval_every: int, qat_bits: tuple[int, ...] = ()) -> StudyRow:
    """A MinAtar row: the game's reference and its source."""
    reference, source = _MINATAR_REFERENCE[game]
    return StudyRow(algo, f"MinAtar/{game}", steps, eval_every, reference=reference, source=source, qat_bits=qat_bits)


GRID: tuple[StudyRow, ...] = (
    # DQN's rows also sweep int8-head16: its greedy actions flip most under int8 (ptq_margins: 11.2% CartPole-v1,
    # 2.8% Acrobot-v1, 21.9% MountainCar-v0, 20.8% Space Invaders), and the output layer's rounding is a large part.
    StudyRow("dqn", "CartPole-v1", 50_000, 2_500, reference=475.0, source=_GYM, qat_bits=_QAT, extra_rows=HEAD16),
    # DQN Acrobot-v1 sweeps 200 episodes: about one greedy episode in 50 loops to the -500 limit, so episodes vary by
    # 40-60 around -85 and 50 of them left 2 standard errors of 10% on the cell's int8 change (-8.2%: not resolved).
    StudyRow("dqn", "Acrobot-v1", 100_000, 5_000, reference=-100.0, source=_GYM, qat_bits=_QAT, sweep_episodes=200,
             extra_rows=HEAD16),
    # MountainCar-v0 trains its whole budget: its preset decays the learning rate over it (agents.dqn.config), and
    # policies stopped early sat at the threshold: seed 1 reached -110 on 2 evaluations of 10 episodes in a row at
    # 35k-40k and then evaluated -115.9 on the study's 10.
    # Its int8 misses come from Q gaps below the head's rounding (results/bench/ptq_margins.md): the head16 row keeps
    # the Q head at 16 bits.
    StudyRow("dqn", "MountainCar-v0", 120_000, 5_000, reference=-110.0, source=_GYM, qat_bits=_QAT, target_streak=0,
             extra_rows=HEAD16),
    _minatar("dqn", "Breakout", 200_000, 20_000, _QAT),
    # Space Invaders' episodes vary by ~10 around ~24: 50 of them left 2 standard errors of 9% on the cell's int8
    # change (-6.0%: not resolved).
    dataclasses.replace(_minatar("dqn", "SpaceInvaders", 200_000, 20_000, _QAT), sweep_episodes=200, extra_rows=HEAD16),
    _minatar("dqn", "Freeway", 500_000, 50_000, _QAT),
    StudyRow("d4pg", "cartpole:balance", 60_000, 5_000, CARTPOLE_OVERRIDES, "bench.learning.d4pg_rows's small setting",
             reference=950.0, source=_QUARL, qat_bits=_QAT, sweep_episodes=10, **_ONE_OF_5),
    StudyRow("d4pg", "walker:stand", 150_000, 5_000, WALKER_OVERRIDES, "bench.learning.d4pg_rows's setting",
             reference=920.0, source=_QUARL, qat_bits=_QAT, sweep_episodes=10),
    StudyRow("ppo", "CartPole-v1", 100_000, 5_120, reference=475.0, source=_GYM, qat_bits=_QAT),
    StudyRow("ppo", "Acrobot-v1", 200_000, 10_240, reference=-100.0, source=_GYM, qat_bits=_QAT),
    # Sparse reward: on-policy exploration rarely reaches the goal (see the budgets note above); trained to the budget.
    StudyRow("ppo", "MountainCar-v0", 250_000, 10_240, reference=-110.0, source=_GYM, target_streak=0),
    StudyRow("ppo", "cartpole:balance", 200_000, 20_480, PPO_CONTROL_OVERRIDES, "PPO's DM Control settings",
             reference=950.0, source=_QUARL),
    # On-policy agents learn MinAtar more slowly than DQN early on: the MinAtar authors' AC(0.8) is at 5.1 on Breakout
    # at 200k frames, 6.9 at 500k and 9.9 at 1M (AC(0): 3.9, 4.6, 6.1), and at 18.5 on Space Invaders at 300k and
    # 24.2 at 400k (same figure, its pixels); on Freeway both stay near 0 until ~1.5M. PPO's pixel preset also
    # anneals its learning rate to 0 over the budget: at 200k, seed 0 sat at 4-5.4 from 80k on (evaluated 4.4 at the
    # end). A2C with 500k sat at 4-5.6 from 240k on (seed 0). Since the conv learners' fix (quarl.nets.conv: PPO's
    # MinAtar update 4-5x faster) 2M env steps train in ~11 minutes, and the budgets follow the authors' curves. At
    # 2M and 2 evaluations of 10, seed 0 stopped at 778k on 6.2 / 6.0 and scored 5.54 on the study's 50 episodes:
    # 10-episode evaluations at the reference's edge stop early, so Breakout trains its whole budget (its learning
    # rate anneals to 0 there, so the final policy is a settled one). Trained so, seed 0 scored 5.98 on the 50
    # episodes after 2M: its evaluations averaged 4.2 over 0-200k, 5.2-5.6 over 200k-800k and 5.8-6.5 from 800k to
    # 2M, a plateau at the reference rather than a short budget. Seeds 1 and 2 scored 4.9 and 5.3 after 2M (seed 1's
    # evaluations averaged 4.7 over 0-400k and 5.0-5.1 over 800k-2M; its stochastic training episodes 4.9 at the
    # end): this preset plateaus near 5-6 on Breakout, so the cell needs other settings, not a longer budget.
    dataclasses.replace(_minatar("ppo", "Breakout", 2_000_000, 20_480, _QAT), target_streak=0),
    _minatar("ppo", "SpaceInvaders", 500_000, 20_480, _QAT),
    # PPO on Freeway: seed 0 stopped at 512k (23-33 from 51k to 360k), seed 1 sat at 9-26 from 300k to 1.2M and
    # stopped at 1.48M, seed 2 at 1.33M. Its greedy episodes are bimodal (most ~40, some stuck at 4-16), so
    # 10-episode evaluations overstate: seed 1 stopped on 38.7 / 39.7 and scored 31.4 on the study's 50.
    _minatar("ppo", "Freeway", 1_500_000, 51_200, _QAT),
    StudyRow("a2c", "CartPole-v1", 200_000, 10_000, reference=475.0, source=_GYM),
    StudyRow("a2c", "Acrobot-v1", 200_000, 10_000, reference=-100.0, source=_GYM),
    StudyRow("a2c", "MountainCar-v0", 250_000, 10_000, reference=-110.0, source=_GYM, target_streak=0),
    # A2C on Breakout, trained to 2M as PPO: seeds 0 / 1 scored 5.32 / 5.0 (evaluations 4.0-4.4 over 0-400k, 5.0-5.4
    # from 400k to 2M): the same plateau. Seed 2 is still its 1M run.
    dataclasses.replace(_minatar("a2c", "Breakout", 2_000_000, 20_000), target_streak=0),
    _minatar("a2c", "SpaceInvaders", 500_000, 20_000),
    # A2C on Freeway: seed 0 sat at 9-24 from 100k to 850k, then reached 48-49 at 950k-1M (a 2M budget); 1.5M leaves
    # room (AC(0.8) in the authors' figure stays near 0 until ~1.5M).
    _minatar("a2c", "Freeway", 1_500_000, 50_000),
)
QUICK_OVERRIDES = {"dqn": {"hidden_sizes": (16, 16), "min_replay_size": 100, "batch_size": 32,
                           "samples_per_insert": 8.0},
                   "d4pg": {"policy_layer_sizes": (16, 16), "critic_layer_sizes": (16, 16), "num_atoms": 11,
                            "batch_size": 32, "min_replay_size": 100, "samples_per_insert": 4.0, "n_step": 3}}
QUICK_TASKS = ("CartPole-v1", "cartpole:balance")


def row_overrides(row: StudyRow, quick: bool) -> dict[str, Any]:
    """The row's agent overrides (quick: tiny networks instead, for a smoke run)."""
    if quick:
        return dict(QUICK_OVERRIDES.get(row.algo, {}))
    return dict(row.overrides)
