"""What one ActorQ experiment is and what one process runs (as acme/jax/experiments): its config, the one
single-process runner of every agent (`run_experiment`) with its
learning side (`feeds`: replay, or rollouts for PPO/A2C), the actor's loop every actor shares (`acting`), how every
runner stops (`stopping`), summary.json, stage times, checkpoints and progress. The distributed program built from
the same pieces is `launch.distributed`."""
