"""Acme 0.4.0's JAX D4PG in one process, evaluated like `launch.experiments.run_experiment` — the reference arm of bench.peers.fidelity.

Runs under the legacy Acme venv (Python 3.10, dm-acme 0.4.0, jax 0.4.34; ../shared/anchors/acme_legacy/setup.sh),
so it imports nothing from this repository:

    PYTHONPATH=<anchors>/acme_legacy ACME_VENV/bin/python bench/peers/acme_d4pg.py --task cartpole:balance --seed 0 \
        --steps 40000 --eval-every 5000 --eval-episodes 10 --out DIR

Agent: `acme.agents.jax.d4pg.D4PG` (LocalLayout: a learner step every batch/spi = 8 env steps after 1000) with
the given policy/critic sizes and Acme's defaults otherwise (sigma 0.3, n-step 5, Adam 1e-4, global-norm clip 40,
target copy every 100). Environment: dm_control with Acme's wrappers (concatenated observations, canonical
clipped actions, float32). Every `eval_every` actor steps (whole 1000-step episodes, so exactly) a noiseless
actor on the learner's served policy plays `eval_episodes` episodes of a separate environment; DIR/evaluator.csv
gets the mean (`return`) and the first episode (`return_first`, Acme's usual one-episode protocol), with
wall-clock and train-clock seconds (train leaves out evaluation). DIR/done.json marks a finished run.
"""
import argparse
import csv
import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MUJOCO_GL", "disable")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

EVAL_SEED_OFFSET = 10_000  # as launch.experiments.run_experiment: evaluation episodes come from their own env instance and seed
FIELDS = ("actor_steps", "learner_steps", "wall_clock_s", "train_clock_s", "return", "return_first",
          "return_std")


def _sizes(text):
    return tuple(int(v) for v in text.split(","))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="dm_control domain:task")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="actor (env) steps")
    p.add_argument("--eval-every", type=int, default=5000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--policy", type=_sizes, default=(256, 256, 256))
    p.add_argument("--critic", type=_sizes, default=(512, 512, 256))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if min(args.steps, args.eval_every, args.eval_episodes) <= 0 or args.seed < 0 or ":" not in args.task:
        p.error("steps, eval-every and eval-episodes must be positive, seed >= 0, task domain:task")
    return args


def make_env(task, seed):
    from acme import wrappers  # pylint: disable=import-outside-toplevel
    from dm_control import suite  # pylint: disable=import-outside-toplevel
    domain, name = task.split(":")
    env = suite.load(domain, name, task_kwargs={"random": seed})
    env = wrappers.ConcatObservationWrapper(env)
    env = wrappers.CanonicalSpecWrapper(env, clip=True)
    return wrappers.SinglePrecisionWrapper(env)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import acme  # pylint: disable=import-outside-toplevel
    from acme import specs  # pylint: disable=import-outside-toplevel
    from acme.agents.jax import actor_core as actor_core_lib  # pylint: disable=import-outside-toplevel
    from acme.agents.jax import actors, d4pg  # pylint: disable=import-outside-toplevel
    from acme.jax import variable_utils  # pylint: disable=import-outside-toplevel
    from acme.utils import counting, loggers  # pylint: disable=import-outside-toplevel

    os.makedirs(args.out, exist_ok=True)
    env = make_env(args.task, args.seed)
    eval_env = make_env(args.task, args.seed + EVAL_SEED_OFFSET)
    spec = specs.make_environment_spec(env)
    networks = d4pg.make_networks(spec, policy_layer_sizes=args.policy, critic_layer_sizes=args.critic)
    counter = counting.Counter()
    agent = d4pg.D4PG(spec, networks, d4pg.D4PGConfig(), random_seed=args.seed,
                      counter=counting.Counter(counter, prefix="learner", time_delta=0.0))
    agent._checkpointer = None  # pylint: disable=protected-access  (LocalLayout would write to ~/acme)
    loop = acme.EnvironmentLoop(env, agent, counter=counting.Counter(counter, prefix="actor", time_delta=0.0),
                                logger=loggers.NoOpLogger())
    eval_core = actor_core_lib.batched_feed_forward_to_actor_core(d4pg.get_default_eval_policy(networks))
    eval_actor = actors.GenericActor(eval_core, jax.random.PRNGKey(args.seed + 1),
                                     variable_utils.VariableClient(agent, "policy", device="cpu"),
                                     adder=None, backend="cpu")
    eval_loop = acme.EnvironmentLoop(eval_env, eval_actor, should_update=False, logger=loggers.NoOpLogger())

    start = time.perf_counter()
    eval_s = 0.0
    with open(os.path.join(args.out, "evaluator.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()

        def evaluate(steps):
            nonlocal eval_s
            t = time.perf_counter()
            eval_actor.update(wait=True)
            returns = [float(eval_loop.run_episode()["episode_return"]) for _ in range(args.eval_episodes)]
            writer.writerow({"actor_steps": steps,
                             "learner_steps": counter.get_counts().get("learner_steps", 0),
                             "wall_clock_s": round(t - start, 3), "train_clock_s": round(t - start - eval_s, 3),
                             "return": float(np.mean(returns)), "return_first": returns[0],
                             "return_std": float(np.std(returns))})
            f.flush()
            eval_s += time.perf_counter() - t

        steps, next_eval = 0, args.eval_every
        while steps < args.steps:
            steps += int(loop.run_episode()["episode_length"])
            if steps >= next_eval or steps >= args.steps:
                evaluate(steps)
                next_eval += args.eval_every
    wall = time.perf_counter() - start
    done = {"task": args.task, "seed": args.seed, "actor_steps": steps,
            "learner_steps": counter.get_counts().get("learner_steps", 0), "wall_clock_s": round(wall, 3),
            "train_clock_s": round(wall - eval_s, 3), "acme": acme.__version__, "jax": jax.__version__,
            "policy": list(args.policy), "critic": list(args.critic)}
    with open(os.path.join(args.out, "done.json"), "w", encoding="utf-8") as f:
        json.dump(done, f)
    print(json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
