"""What one ActorQ experiment is and what one process runs (as acme/jax/experiments): its config, the
single-process runners (`run_experiment` for replay agents, `onpolicy` for PPO/A2C), the acting loop every actor
shares (`acting`), summary.json, stage times, checkpoints and progress. The distributed program built from the same
pieces is `launch.distributed`."""
