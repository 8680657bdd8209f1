"""One ActorQ experiment (as acme/jax/experiments): its config, the single-process runner
(`run_experiment`), the distributed graph (`distributed`) and its supervisor, the acting loop
both runners share (`acting`), summary.json, stage times, checkpoints and progress."""
